"""`resent` counts each request (and `batches_resent` each batch) once, however many
reconnects it takes before the ack that retires it.

The overcount this pins down (issue 24, seen across a SIGKILL and restart in
tests/reliability/test_batch_crash.py: 1,280-2,752 "resent" for 1,024 requests):
every stream attempt that put an unacked batch on the wire again counted it again,
including attempts against a server that was gone. Against real gRPC servers on
loopback: the first server acks the first unit, breaks its first stream with the
rest unacked, reads them all again on a second stream and holds it; the test then
stops that server (the client fails several reconnect attempts against the closed
port) and starts a second one on the same port, which acks everything. The servers
record what reached them, so the test knows which requests really went out again.
Both the batch stream and the single-request stream (`batching=False`) are checked.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from service.client import MirrorClient
from service.contract import MirrorRequest
from service.contract.validation import RequestLimits
from service.wire.batch_codec import batch_from_pb
from service.wire.understudy.v1 import shadow_pb2

pytestmark = pytest.mark.live  # waits on real servers

HANG_S = 60.0
NEVER = 3600.0
N_REQUESTS = 6


def _read_batch(raw: bytes) -> tuple[int, list[str]]:
    env = shadow_pb2.MirrorBatchStreamRequest.FromString(raw)
    batch = batch_from_pb(env.batch, RequestLimits())
    return env.sequence, [batch.request_id[i] for i in range(batch.n_requests)]


def _batch_ack(sequence: int, n: int) -> shadow_pb2.BatchStreamAck:
    ack = shadow_pb2.BatchAck(status=shadow_pb2.ACK_STATUS_ACCEPTED, sequence=sequence, accepted=n)
    return shadow_pb2.BatchStreamAck(ack=ack)


def _read_single(raw: bytes) -> tuple[int, list[str]]:
    env = shadow_pb2.MirrorStreamRequest.FromString(raw)
    return env.sequence, [env.request.request_id]


def _single_ack(sequence: int, _n: int) -> shadow_pb2.StreamAck:
    return shadow_pb2.StreamAck(status=shadow_pb2.ACK_STATUS_ACCEPTED, sequence=sequence)


class ScriptedServer:
    """Real `MirrorManyStream` and `MirrorStream` endpoints that record, per stream, the
    request ids of every unit (batch or message) they read.

    `flaky`: stream 1 acks its first unit and breaks (UNAVAILABLE) once it has read all
    `N_REQUESTS` requests; stream 2 reads every request still unacked, sets `holding`
    and holds, acking nothing, until the server is stopped. Otherwise every unit is acked.
    """

    def __init__(self, port: int = 0, *, flaky: bool) -> None:
        self.streams: list[list[list[str]]] = []
        self.holding = threading.Event()
        self._release = threading.Event()

        def handler(
            read: Callable[[bytes], tuple[int, list[str]]], ack: Callable[[int, int], Any]
        ) -> grpc.RpcMethodHandler:
            def stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[Any]:
                seen: list[list[str]] = []
                self.streams.append(seen)
                number = len(self.streams)
                for raw in requests:
                    sequence, ids = read(raw)
                    seen.append(ids)
                    got = sum(len(u) for u in seen)
                    if flaky and number == 1:
                        if len(seen) == 1:
                            yield ack(sequence, len(ids))
                        elif got == N_REQUESTS:
                            context.abort(grpc.StatusCode.UNAVAILABLE, "broken on purpose")
                    elif flaky:
                        if got == N_REQUESTS - len(self.streams[0][0]):
                            self.holding.set()
                            self._release.wait(HANG_S)  # until stop() cancels the stream
                            return
                    else:
                        yield ack(sequence, len(ids))

            return grpc.stream_stream_rpc_method_handler(
                stream, response_serializer=lambda m: m.SerializeToString()
            )

        methods = {
            "MirrorManyStream": handler(_read_batch, _batch_ack),
            "MirrorStream": handler(_read_single, _single_ack),
        }
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("understudy.v1.ShadowEvaluation", methods),)
        )
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0).wait(HANG_S)
        self._release.set()


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    done = threading.Event()
    for _ in range(int(HANG_S / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("batching", [True, False], ids=["batches", "single"])
def test_each_request_resent_after_a_reconnect_counts_once_however_often_it_went_again(
    requests_sample: list[MirrorRequest], batching: bool
) -> None:
    first = ScriptedServer(flaky=True)
    client = MirrorClient(
        f"127.0.0.1:{first.port}",
        "tok",
        max_batch_requests=2,
        linger_s=NEVER,
        batching=batching,
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
    )
    second: ScriptedServer | None = None
    try:
        for i in range(N_REQUESTS):
            assert client.mirror_request(
                dataclasses.replace(requests_sample[i], request_id=f"r-{i}")
            )
        assert first.holding.wait(HANG_S), first.streams
        reconnects = client.stats().reconnects
        first.stop()  # the held stream breaks; the port is closed
        _wait_for(
            lambda: client.stats().reconnects >= reconnects + 4,
            "reconnect attempts against the stopped server",
        )
        second = ScriptedServer(first.port, flaky=False)
        assert client.flush(HANG_S), client.stats()
        stats = client.close()
    finally:
        client.close(0.1)
        first.stop()
        if second is not None:
            second.server.stop(0)
    assert second is not None
    unit = 2 if batching else 1
    everything = [f"r-{i}" for i in range(N_REQUESTS)]
    chunks = [everything[i : i + unit] for i in range(0, N_REQUESTS, unit)]
    unacked = chunks[1:]
    assert first.streams == [chunks, unacked], "stream 1 read everything, stream 2 the unacked"
    assert [u for s in second.streams for u in s] == unacked, "then once more, on the new server"
    m, batches = stats.mirrors, stats.mirror_batches
    assert (m.offered, m.accepted, m.dropped, m.in_flight) == (N_REQUESTS, N_REQUESTS, 0, 0)
    # the unacked requests went out on three streams (and were handed to any failed
    # attempt between): each is one resent request, each of their batches one resent batch
    assert m.resent == N_REQUESTS - unit, f"each resent request once, not per attempt: {m}"
    assert batches.batches_resent == (len(unacked) if batching else 0), batches
    assert m.resent <= m.offered
