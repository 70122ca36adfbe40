"""A bounded, loopback-only load generator for the reliability tests."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from service.contract import MirrorRequest
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import shadow_pb2, shadow_pb2_grpc


@dataclass
class LoadResult:
    """What one load run sent and what the service said."""

    sent: int = 0
    accepted: list[str] = field(default_factory=list)
    shed: int = 0
    rejected: int = 0
    latencies_s: list[float] = field(default_factory=list)
    sent_at: list[float] = field(default_factory=list)

    def p99_ms(self, since: float = 0.0, until: float = float("inf")) -> float:
        """99th percentile ack latency (ms) of the calls sent in [since, until) (monotonic)."""
        chosen = [
            lat for lat, t in zip(self.latencies_s, self.sent_at, strict=True) if since <= t < until
        ]
        if len(chosen) < 2:
            return float("nan")
        return statistics.quantiles(chosen, n=100)[98] * 1e3


def rss_mb(field: str = "VmRSS") -> float:
    """Resident set size (VmRSS) or its peak (VmHWM) of this process, service included, MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def steady_load(
    port: int,
    token: str,
    requests: list[MirrorRequest],
    rate_per_s: float,
    duration_s: float,
    tag: str,
    invalid_every: int = 0,
    stop: threading.Event | None = None,
    on_accepted: Callable[[int], None] | None = None,
    max_sent: int | None = None,
) -> LoadResult:
    """Unary mirrors at `rate_per_s` for `duration_s` (bounded), counting every answer.

    The pacing sleep below spaces the calls; it synchronises nothing. A test
    that must act after some acks passes `on_accepted` (called with the
    number accepted so far) and waits on that, not on a time; one that needs
    an exact amount of traffic passes `max_sent`.
    """
    result = LoadResult()
    auth = (("authorization", f"Bearer {token}"),)
    interval = 1.0 / rate_per_s
    start = time.perf_counter()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = shadow_pb2_grpc.ShadowEvaluationStub(channel)  # type: ignore[no-untyped-call]
        i = 0
        while time.perf_counter() - start < duration_s and not (stop and stop.is_set()):
            if max_sent is not None and result.sent >= max_sent:
                break
            msg = mirror_request_to_pb(requests[i % len(requests)])
            msg.request_id = f"{tag}-{i}"
            if invalid_every and i % invalid_every == invalid_every - 1:
                msg.state.cpu_free[0] = float("nan")
            sent_at = time.perf_counter()
            result.sent += 1
            try:
                ack = stub.Mirror(msg, metadata=auth, timeout=60)  # a hang guard
                if ack.status == shadow_pb2.ACK_STATUS_ACCEPTED:
                    result.accepted.append(msg.request_id)
                    if on_accepted is not None:
                        on_accepted(len(result.accepted))
                else:
                    result.shed += 1
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    break  # the server went away (crash tests): stop offering
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
                result.rejected += 1
            result.latencies_s.append(time.perf_counter() - sent_at)
            result.sent_at.append(time.monotonic())
            i += 1
            next_at = start + i * interval
            delay = next_at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)  # pacing of the generator, not a synchronisation
    return result
