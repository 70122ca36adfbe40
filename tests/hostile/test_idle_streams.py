"""Idle gRPC streams cannot take the server from anyone else (issue 20 item 2).

Before: a sync gRPC stream holds a pool thread for its whole life and the pool
was `grpc_max_workers` threads for everything, so that many streams that send
nothing left a new client's stream and a unary `Mirror` with no ack at all
(DEADLINE_EXCEEDED), nothing shed or counted. Now streams are admitted per
connection, per principal and in total, on threads of their own above the
unary workers; refusals are RESOURCE_EXHAUSTED naming the limit and counted;
the open count is a gauge; a stream idle past the timeout is closed, counted.

Real service (build_service via `make_service`), real clients on loopback. Each
attacking channel asks for its own subchannel pool, so it is its own TCP
connection (its own peer), as separate client processes would be. Limits are
set through UNDERSTUDY_ environment variables, the way an operator sets them.
Waits are on conditions, with a deadline only as a hang guard; the figures are
printed, not asserted.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.auth import token_digest
from service.client import MirrorClient
from service.contract import MirrorRequest
from service.server.app import Service
from service.transport.grpc.servicer import SERVICE_NAME
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import shadow_pb2, shadow_pb2_grpc
from tests.hostile.metrics_read import counter_sum

Metadata = tuple[tuple[str, str], ...]
HANG_GUARD_S = 20.0
ATTACKER_TOKEN = "attacker-token"  # a test token, hashed into the settings


def _limits(monkeypatch: pytest.MonkeyPatch, **values: object) -> None:
    for name, value in values.items():
        monkeypatch.setenv(f"UNDERSTUDY_{name.upper()}", str(value))


def _start(make_service: Callable[..., Service], runtime_token: str) -> Service:
    return make_service(
        scoring_enabled=False,
        auth_tokens={
            token_digest(runtime_token): "runtime:scheduler",
            token_digest(ATTACKER_TOKEN): "runtime:attacker",
        },
    )


def _bearer(token: str) -> Metadata:
    return (("authorization", f"Bearer {token}"),)


def _wait(condition: Callable[[], bool], what: str, guard_s: float = HANG_GUARD_S) -> float:
    """Wait until `condition()` holds; returns the seconds it took (hang guard only)."""
    start = time.monotonic()
    tick = threading.Event()
    while not condition():
        assert time.monotonic() - start < guard_s, f"hang guard: still waiting for {what}"
        tick.wait(0.01)
    return time.monotonic() - start


def _gauge(service: Service, name: str = "understudy_grpc_streams_open") -> float:
    return service.metrics.registry.get_sample_value(name) or 0.0


def _readers() -> int:
    """Server threads reading a mirror stream: one per stream whose handler runs."""
    return sum(1 for t in threading.enumerate() if t.name == "mirror-stream-reader")


def _own_connection(service: Service) -> grpc.Channel:
    """A channel on a TCP connection of its own (not shared through the global pool)."""
    return grpc.insecure_channel(
        f"127.0.0.1:{service.grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)]
    )


class IdleStream:
    """A MirrorStream that sends nothing until closed."""

    def __init__(self, channel: grpc.Channel, metadata: Metadata) -> None:
        self._stop = threading.Event()
        method = channel.stream_stream(
            f"/{SERVICE_NAME}/MirrorStream",
            request_serializer=lambda b: b,
            response_deserializer=shadow_pb2.StreamAck.FromString,
        )
        self.call: Any = method(self._nothing(), metadata=metadata, timeout=120)

    def _nothing(self) -> Iterator[bytes]:
        self._stop.wait()
        return
        yield  # pragma: no cover - makes this a generator

    def refused(self) -> bool:
        """Ended already with RESOURCE_EXHAUSTED (an admitted idle stream never ends)."""
        return bool(self.call.done()) and self.call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    def close(self) -> None:
        self._stop.set()
        self.call.cancel()


def _envelopes(requests: list[MirrorRequest], n: int) -> Iterator[shadow_pb2.MirrorStreamRequest]:
    for i in range(n):
        msg = mirror_request_to_pb(requests[i % len(requests)])
        msg.request_id = f"new-client-{i}"
        yield shadow_pb2.MirrorStreamRequest(sequence=i + 1, request=msg)


@pytest.mark.live
def test_idle_streams_leave_new_clients_and_unary_calls_served(
    monkeypatch: pytest.MonkeyPatch,
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
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
    channels = [_own_connection(service) for _ in range(3)]
    idle = [IdleStream(ch, _bearer(ATTACKER_TOKEN)) for ch in channels for _ in range(3)]
    try:
        # At least as many idle streams as there are workers are being served: on the old
        # server this is every thread it had.
        _wait(lambda: _readers() >= workers, f"{workers} idle streams to be served")
        with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
            stub = shadow_pb2_grpc.ShadowEvaluationStub(channel)  # type: ignore[no-untyped-call]
            start = time.monotonic()
            acks = list(
                stub.MirrorStream(
                    _envelopes(requests_sample, 20),
                    metadata=_bearer(runtime_token),
                    timeout=HANG_GUARD_S,
                )
            )
            stream_s = time.monotonic() - start
            assert acks[-1].accepted == 20 and acks[-1].sequence == 20
            start = time.monotonic()
            ack = stub.Mirror(
                mirror_request_to_pb(requests_sample[0]),
                metadata=_bearer(runtime_token),
                timeout=HANG_GUARD_S,
            )
            unary_s = time.monotonic() - start
            assert ack.status == shadow_pb2.ACK_STATUS_ACCEPTED
        # The attacker got its principal's six; the other three were refused and counted.
        _wait(lambda: sum(s.refused() for s in idle) == 3, "three refusals")
        _wait(lambda: _gauge(service) == 6, "six open streams after the new client left")
        refused = counter_sum(service, "understudy_grpc_streams_refused_total", reason="principal")
        assert refused == 3
        details = next(s.call.details() for s in idle if s.refused())
        assert "UNDERSTUDY_GRPC_MAX_STREAMS_PER_PRINCIPAL" in details and "6" in details
        print(
            f"\n{len(idle)} idle streams opened ({workers} workers): 6 held, 3 refused; "
            f"new client's 20-message stream acked in {stream_s * 1000:.1f} ms, "
            f"unary Mirror in {unary_s * 1000:.1f} ms"
        )
    finally:
        for stream in idle:
            stream.close()
        for channel in channels:
            channel.close()


@pytest.mark.live
def test_streams_past_each_limit_are_refused_named_and_counted(
    monkeypatch: pytest.MonkeyPatch,
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    _limits(
        monkeypatch,
        grpc_max_workers=2,
        grpc_max_streams_per_connection=2,
        grpc_max_streams_per_principal=3,
        grpc_max_streams=4,
    )
    service = _start(make_service, runtime_token)
    a1, a2, b1 = (_own_connection(service) for _ in range(3))
    attacker, scheduler = _bearer(ATTACKER_TOKEN), _bearer(runtime_token)
    opened: list[IdleStream] = []

    def open_on(channel: grpc.Channel, metadata: Metadata) -> IdleStream:
        stream = IdleStream(channel, metadata)
        opened.append(stream)
        return stream

    def refused_for(channel: grpc.Channel, metadata: Metadata, reason: str, named: str) -> float:
        start = time.monotonic()
        stream = open_on(channel, metadata)
        _wait(stream.refused, f"a refusal for the {reason} limit")
        assert named in stream.call.details(), stream.call.details()
        assert counter_sum(service, "understudy_grpc_streams_refused_total", reason=reason) == 1
        return time.monotonic() - start

    try:
        figures = {}
        for n, (channel, metadata) in enumerate([(a1, attacker), (a1, attacker)], start=1):
            open_on(channel, metadata)
            _wait(lambda n=n: _gauge(service) == n, f"{n} open streams")  # type: ignore[misc]
        figures["connection"] = refused_for(
            a1, attacker, "connection", "UNDERSTUDY_GRPC_MAX_STREAMS_PER_CONNECTION"
        )
        open_on(a2, attacker)
        _wait(lambda: _gauge(service) == 3, "3 open streams")
        figures["principal"] = refused_for(
            a2, attacker, "principal", "UNDERSTUDY_GRPC_MAX_STREAMS_PER_PRINCIPAL"
        )
        open_on(b1, scheduler)
        _wait(lambda: _gauge(service) == 4, "4 open streams")
        figures["total"] = refused_for(b1, scheduler, "total", "UNDERSTUDY_GRPC_MAX_STREAMS)")
        assert _gauge(service) == 4
        # Unary calls have threads of their own, whatever the streams hold.
        stub = shadow_pb2_grpc.ShadowEvaluationStub(b1)  # type: ignore[no-untyped-call]
        ack = stub.Mirror(
            mirror_request_to_pb(requests_sample[0]), metadata=scheduler, timeout=HANG_GUARD_S
        )
        assert ack.status == shadow_pb2.ACK_STATUS_ACCEPTED
        # A closed stream gives its place back at once.
        opened[0].close()
        _wait(lambda: _gauge(service) == 3, "the closed stream to be released")
        again = open_on(b1, scheduler)
        _wait(lambda: _gauge(service) == 4, "a new stream in the freed place")
        assert not again.refused()
        print(
            "\nrefused RESOURCE_EXHAUSTED in "
            + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in figures.items())
        )
    finally:
        for stream in opened:
            stream.close()
        for channel in (a1, a2, b1):
            channel.close()
    _wait(lambda: _gauge(service) == 0, "every stream released")


@pytest.mark.live
def test_a_stream_idle_past_the_timeout_is_closed_and_counted(
    monkeypatch: pytest.MonkeyPatch,
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    # The active phase must never leave a gap of `idle_s` between two sends; a busy box
    # can stall a thread for a second, so the timeout is far above the 50 ms pace.
    idle_s = 3.0
    _limits(monkeypatch, grpc_stream_idle_timeout_s=idle_s)
    service = _start(make_service, runtime_token)
    outbox: queue.Queue[shadow_pb2.MirrorStreamRequest | None] = queue.Queue()

    def requests() -> Iterator[shadow_pb2.MirrorStreamRequest]:
        while (item := outbox.get()) is not None:
            yield item

    envelopes = _envelopes(requests_sample, 100_000)
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = shadow_pb2_grpc.ShadowEvaluationStub(channel)  # type: ignore[no-untyped-call]
        acks = stub.MirrorStream(requests(), metadata=_bearer(runtime_token), timeout=HANG_GUARD_S)
        try:
            # A stream that keeps sending outlives the idle timeout twice over.
            start = time.monotonic()
            sent = 0
            pace = threading.Event()
            while time.monotonic() - start < 2 * idle_s:
                outbox.put(next(envelopes))
                sent += 1
                assert next(acks).sequence == sent
                pace.wait(0.05)
            assert _readers() >= 1  # still served
            # Then it goes quiet: the server closes it, naming the setting.
            quiet_from = time.monotonic()
            with pytest.raises(grpc.RpcError) as ended:
                for _ in acks:
                    pass
            closed_after = time.monotonic() - quiet_from
        finally:
            outbox.put(None)
    assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "UNDERSTUDY_GRPC_STREAM_IDLE_TIMEOUT_S" in (ended.value.details() or "")
    assert counter_sum(service, "understudy_grpc_streams_idle_closed_total") == 1
    _wait(lambda: _gauge(service) == 0, "the idle stream to be released")
    _wait(lambda: _readers() == 0, "the idle stream's reader thread to end")
    print(
        f"\nactive stream kept for {sent} messages over {2 * idle_s:.1f} s; idle one closed "
        f"{closed_after:.2f} s after its last message (timeout {idle_s} s)"
    )


@pytest.mark.live
def test_health_watch_streams_are_bounded_too_and_unary_check_still_answers(
    monkeypatch: pytest.MonkeyPatch, make_service: Callable[..., Service], runtime_token: str
) -> None:
    _limits(monkeypatch, grpc_max_streams_per_connection=1)
    service = _start(make_service, runtime_token)
    with _own_connection(service) as channel:
        health = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
        everything = health_pb2.HealthCheckRequest(service="")
        watch = health.Watch(everything, timeout=HANG_GUARD_S)
        try:
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as refused:
                next(health.Watch(everything, timeout=HANG_GUARD_S))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "UNDERSTUDY_GRPC_MAX_STREAMS_PER_CONNECTION" in (refused.value.details() or "")
            check = health.Check(everything, timeout=HANG_GUARD_S)
            assert check.status == health_pb2.HealthCheckResponse.SERVING
            assert (
                counter_sum(service, "understudy_grpc_streams_refused_total", reason="connection")
                == 1
            )
        finally:
            watch.cancel()
    _wait(lambda: _gauge(service) == 0, "the watch to be released")


@pytest.mark.live
def test_the_client_library_reopens_an_idle_closed_stream_and_loses_nothing(
    monkeypatch: pytest.MonkeyPatch,
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    _limits(monkeypatch, grpc_stream_idle_timeout_s=0.5)
    service = _start(make_service, runtime_token)
    client = MirrorClient(f"127.0.0.1:{service.grpc_port}", runtime_token)
    try:
        assert client.mirror(mirror_request_to_pb(requests_sample[0]))
        assert client.flush(HANG_GUARD_S)
        idle_closed = "understudy_grpc_streams_idle_closed_total"
        _wait(lambda: counter_sum(service, idle_closed) >= 2, "both lanes to be closed idle")
        assert client.mirror(mirror_request_to_pb(requests_sample[1]))
        assert client.flush(HANG_GUARD_S)
    finally:
        stats = client.close()
    assert stats.mirrors.accepted == 2 and stats.mirrors.dropped == 0
    assert stats.reconnects >= 2
    print(f"\nclient: {stats.reconnects} reconnects after idle closes, nothing dropped")
