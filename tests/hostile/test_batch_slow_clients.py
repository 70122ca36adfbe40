"""Slow and idle clients on the batch transports (issue 24, acceptance): the server
protects itself as it does for single requests.

- HTTP, POST /v1/mirror/batch: connections that dribble a batch's headers,
  stall half-way through a protobuf batch body, or connect and say nothing are
  closed once the request deadline passes (the protocol of
  `service/transport/http/slow_clients.py`, as tests/hostile/test_slow_clients.py
  checks for POST /v1/mirror), while a good client's batches keep being
  accepted; each body cut short is a counted rejection, not an error log.
- gRPC, MirrorManyStream: an attacker's idle batch streams are admitted only up
  to its principal's limit (the rest refused RESOURCE_EXHAUSTED naming the
  setting, counted), and while they hang on, another client's batch stream and
  a unary MirrorMany are acked.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc
import httpx
import pytest

from service.server.app import Service
from service.transport.grpc.servicer import SERVICE_NAME
from service.wire.understudy.v1 import shadow_pb2, shadow_pb2_grpc
from tests.hostile.metrics_read import counter_sum
from tests.hostile.test_idle_streams import (
    ATTACKER_TOKEN,
    HANG_GUARD_S,
    _bearer,
    _gauge,
    _limits,
    _own_connection,
    _start,
    _wait,
)
from tests.hostile.test_slow_clients import (
    LATE_S,
    SlowClient,
    _connect,
    _server_with_deadline,
    drip_until_closed,
)
from tests.reliability.batch_load import Batch, shaped_batches

pytestmark = pytest.mark.live  # waits on a real service: run under load by make test-busy

PROTOBUF = {"content-type": "application/x-protobuf"}
SIZE = 16


def _batch_rejected(service: Service) -> float:
    return counter_sum(
        service, "understudy_ingest_total", transport="http_batch", result="rejected"
    )


def _head(port: int, token: str, length: int) -> bytes:
    return (
        f"POST /v1/mirror/batch HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/x-protobuf\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _dribble(port: int, token: str, body: bytes, client: SlowClient, give_up_s: float) -> None:
    """Act out `client.kind` on the batch route until the server closes the connection."""
    started = time.perf_counter()
    with _connect(port) as sock:
        pending = b""
        if client.kind == "headers":
            pending = _head(port, token, len(body))
        elif client.kind == "body":
            sock.sendall(_head(port, token, len(body)) + body[: len(body) // 2])
        drip_until_closed(sock, client, pending, started, give_up_s)


@contextmanager
def _slow(
    port: int, token: str, body: bytes, kinds: list[str], give_up_s: float
) -> Iterator[list[SlowClient]]:
    clients = [SlowClient(kind) for kind in kinds]
    threads = [
        threading.Thread(target=_dribble, args=(port, token, body, c, give_up_s), daemon=True)
        for c in clients
    ]
    for t in threads:
        t.start()
    try:
        yield clients
    finally:
        for t in threads:
            t.join(give_up_s + 5)


def test_slow_batch_posts_are_cut_off_while_other_batches_are_accepted(
    service: Service, runtime_token: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    deadline_s = 1.0
    batches = shaped_batches(40, "slowhttp", size=SIZE, n_nodes=8)
    body = batches[0].msg.SerializeToString()
    kinds = ["headers"] * 4 + ["body"] * 4 + ["idle"] * 2
    accepted = 0
    served_while_all_open = 0
    with _server_with_deadline(service, deadline_s=int(deadline_s)) as port:
        rejected_before = _batch_rejected(service)
        with (
            httpx.Client(
                base_url=f"http://127.0.0.1:{port}",
                headers={"authorization": f"Bearer {runtime_token}"},
                timeout=60,
            ) as http,
            _slow(port, runtime_token, body, kinds, give_up_s=deadline_s + LATE_S + 30) as clients,
        ):
            good = iter(batches[1:])
            until = time.perf_counter() + deadline_s + 0.5
            while time.perf_counter() < until:
                batch = next(good)
                reply = http.post(
                    "/v1/mirror/batch", content=batch.msg.SerializeToString(), headers=PROTOBUF
                )
                assert reply.status_code == 200 and reply.json()["accepted"] == SIZE, reply.text
                accepted += SIZE
                if all(c.closed_after is None for c in clients):
                    served_while_all_open += 1
                time.sleep(0.1)  # pacing of the good client, not a synchronisation
        rejected = _batch_rejected(service) - rejected_before
    closed = sorted((c.kind, c.closed_after) for c in clients)
    print(
        f"\nslow batch clients closed after (s): {closed}; {accepted} requests accepted meanwhile"
    )
    for client in clients:
        assert client.closed_after is not None, f"{client.kind} client was never cut off"
        assert deadline_s - 0.5 <= client.closed_after <= deadline_s + LATE_S, client
        assert client.response == b"", client.response[:200]
    assert served_while_all_open >= 1, (served_while_all_open, closed)
    assert rejected == kinds.count("body"), "each body cut short counted once"
    body_label = {"transport": "http_batch", "kind": "mirror", "field": "body"}
    assert counter_sum(service, "understudy_ingest_rejections_total", **body_label) == rejected
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


class IdleBatchStream:
    """A MirrorManyStream that sends nothing until closed."""

    def __init__(self, channel: grpc.Channel, metadata: tuple[tuple[str, str], ...]) -> None:
        self._stop = threading.Event()
        method = channel.stream_stream(
            f"/{SERVICE_NAME}/MirrorManyStream",
            request_serializer=lambda b: b,
            response_deserializer=shadow_pb2.BatchStreamAck.FromString,
        )
        self.call = method(self._nothing(), metadata=metadata, timeout=120)

    def _nothing(self) -> Iterator[bytes]:
        self._stop.wait()
        return
        yield  # pragma: no cover - makes this a generator

    def refused(self) -> bool:
        return bool(self.call.done()) and self.call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    def close(self) -> None:
        self._stop.set()
        self.call.cancel()


def _envelopes(batches: list[Batch]) -> Iterator[shadow_pb2.MirrorBatchStreamRequest]:
    for sequence, batch in enumerate(batches, start=1):
        yield shadow_pb2.MirrorBatchStreamRequest(sequence=sequence, batch=batch.msg)


def test_idle_batch_streams_leave_other_clients_served(
    monkeypatch: pytest.MonkeyPatch,
    make_service: Callable[..., Service],
    runtime_token: str,
) -> None:
    workers = 4
    _limits(
        monkeypatch,
        grpc_max_workers=workers,
        grpc_max_streams_per_connection=3,
        grpc_max_streams_per_principal=6,
        grpc_max_streams=12,
    )
    service = _start(make_service, runtime_token)
    batches = shaped_batches(6, "slowgrpc", size=SIZE, n_nodes=8)
    channels = [_own_connection(service) for _ in range(3)]
    idle = [IdleBatchStream(ch, _bearer(ATTACKER_TOKEN)) for ch in channels for _ in range(3)]
    try:
        # More idle batch streams are held than there are unary workers.
        _wait(lambda: _gauge(service) == 6, "six idle batch streams held")
        _wait(lambda: sum(s.refused() for s in idle) == 3, "three refusals")
        with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
            stub = shadow_pb2_grpc.ShadowEvaluationStub(channel)  # type: ignore[no-untyped-call]
            start = time.monotonic()
            acks = [
                a.ack
                for a in stub.MirrorManyStream(
                    _envelopes(batches[:5]), metadata=_bearer(runtime_token), timeout=HANG_GUARD_S
                )
            ]
            stream_s = time.monotonic() - start
            assert (acks[-1].sequence, acks[-1].stream_accepted) == (5, 5 * SIZE), acks
            start = time.monotonic()
            ack = stub.MirrorMany(
                batches[5].msg, metadata=_bearer(runtime_token), timeout=HANG_GUARD_S
            )
            unary_s = time.monotonic() - start
            assert (ack.status, ack.accepted) == (shadow_pb2.ACK_STATUS_ACCEPTED, SIZE)
        refused = counter_sum(service, "understudy_grpc_streams_refused_total", reason="principal")
        assert refused == 3
        details = next(s.call.details() for s in idle if s.refused())
        assert "UNDERSTUDY_GRPC_MAX_STREAMS_PER_PRINCIPAL" in details
        print(
            f"\n9 idle batch streams ({workers} workers): 6 held, 3 refused; another client's "
            f"5-batch stream acked in {stream_s * 1000:.1f} ms, MirrorMany in "
            f"{unary_s * 1000:.1f} ms"
        )
    finally:
        for stream in idle:
            stream.close()
        for channel in channels:
            channel.close()
    _wait(lambda: _gauge(service) == 0, "every stream released")


UNREAD_BATCHES = 1_000
"""Wholly refused 1,024-request batches sent on one stream whose acks are never read."""
UNREAD_BOUND_ACKS = 64
"""Unsent acks such a client may make the server hold (streams.MAX_UNSENT_ACKS): before the
bound it held every one (~1,000, ~180 MB: 1,024 rejections each, ~180 B a rejection). Read
off the server's ack pipes (deterministic, where the process's RSS depends on what ran
before)."""


@pytest.mark.slow
def test_a_client_that_never_reads_its_acks_cannot_grow_the_server_without_bound(
    make_service: Callable[..., Service], runtime_token: str
) -> None:
    import dataclasses
    import gc

    import numpy as np

    from service.contract.batch import RequestBatch
    from service.policies.synthetic import random_requests
    from service.transport.grpc.streams import AckPipe
    from service.wire.batch_codec import batch_to_pb
    from tests.reliability.load import rss_mb

    service = make_service(scoring_enabled=False, grpc_stream_idle_timeout_s=2.0)
    requests = random_requests(seed=1, n_requests=1024, n_nodes=2, max_options=1)
    msg = batch_to_pb(RequestBatch.from_requests([dataclasses.replace(r) for r in requests]))
    gang = np.frombuffer(msg.workloads.gang_size, dtype="<i4").copy()
    gang[:] = 0  # every request refused: each batch gets an individual ack of 1,024 rows
    msg.workloads.gang_size = gang.tobytes()
    raw = shadow_pb2.MirrorBatchStreamRequest(batch=msg)
    done = threading.Event()

    def sends() -> Iterator[bytes]:
        for sequence in range(1, UNREAD_BATCHES + 1):
            raw.sequence = sequence
            yield raw.SerializeToString()
        done.wait(HANG_GUARD_S)

    def refused() -> float:
        return counter_sum(
            service, "understudy_ingest_total", transport="grpc_batch_stream", result="rejected"
        )

    def cancelled() -> float:
        registry = service.metrics.registry
        return registry.get_sample_value("understudy_grpc_streams_unread_closed_total") or 0.0

    before = rss_mb()
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        call = channel.stream_stream(
            f"/{SERVICE_NAME}/MirrorManyStream", request_serializer=lambda b: b
        )(sends(), metadata=_bearer(runtime_token), timeout=10 * HANG_GUARD_S)
        try:
            # Either the server stops reading (what is asked for: then not every batch is
            # counted, and the stream is cut or held) or it reads them all.
            # (The client's call may not end while its acks sit unread, so the server's own
            # count of the stream it cancelled is the signal.)
            _wait(
                lambda: refused() >= UNREAD_BATCHES * 1024 or call.done() or cancelled() >= 1,
                "every batch read or the stream ended",
                guard_s=10 * HANG_GUARD_S,
            )
            grown = rss_mb() - before
            queued = max(
                (len(o._individual) for o in gc.get_objects() if isinstance(o, AckPipe)),
                default=0,
            )
        finally:
            done.set()
            call.cancel()
    print(
        f"\n{int(refused())} requests refused, acks unread: {queued} acks queued, "
        f"server grew {grown:.0f} MB, streams cancelled for unread acks: {cancelled():g}"
    )
    assert queued <= UNREAD_BOUND_ACKS, f"{queued} unsent acks held ({grown:.0f} MB)"
