"""`MirrorClient`: never blocks, never raises, resends what was not acked.

The caller's thread only touches `Lane.offer` (a lock and a deque append).
Per lane, one background thread keeps a bidirectional stream open: a request
generator feeds buffered messages with their sequence numbers, the thread
reads cumulative acks and retires what they cover. When the stream breaks —
server absent, killed, restarted, or silent longer than `ack_timeout_s` — the
thread reconnects with exponential backoff and jitter and resends every
unacked message first, in order. Drops (buffer full, or undelivered at close)
are counted, so ``offered == delivered + dropped + in_flight`` always holds.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from service.client.lane import Lane, LaneStats
from service.wire.understudy.v1 import contract_pb2, shadow_pb2

log = logging.getLogger(__name__)

_SERVICE = "/understudy.v1.ShadowEvaluation/"


@dataclass(frozen=True)
class ClientStats:
    """Counters of both lanes, plus how often the client had to reconnect."""

    mirrors: LaneStats
    outcomes: LaneStats
    reconnects: int
    last_error: str | None


class MirrorClient:
    """Mirror requests and outcomes to Understudy from inside a scheduler."""

    def __init__(
        self,
        target: str,
        token: str | None = None,
        *,
        buffer_size: int = 10_000,
        ack_timeout_s: float = 10.0,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 2.0,
        channel_options: Sequence[tuple[str, Any]] = (),
        root_certificates: bytes | None = None,
        tls: bool = False,
    ) -> None:
        options = list(channel_options)
        if tls or root_certificates is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
            self._channel = grpc.secure_channel(target, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._ack_timeout_s = ack_timeout_s
        self._backoff = (backoff_initial_s, backoff_max_s)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._reconnects = 0
        self._last_error: str | None = None
        self._mirrors = Lane(buffer_size)
        self._outcomes = Lane(buffer_size)
        self._threads = [
            self._spawn(self._mirrors, "MirrorStream", _mirror_envelope),
            self._spawn(self._outcomes, "ReportOutcomeStream", _outcome_envelope),
        ]

    def mirror(self, request: contract_pb2.MirrorRequest) -> bool:
        """Queue a mirrored request; False if it was dropped. Never blocks or raises."""
        try:
            return self._mirrors.offer(request)
        except Exception:  # the caller is production: nothing may escape
            log.exception("mirror() failed; request dropped")
            return False

    def report_outcome(self, outcome: contract_pb2.Outcome) -> bool:
        """Queue an outcome report; False if it was dropped. Never blocks or raises."""
        try:
            return self._outcomes.offer(outcome)
        except Exception:
            log.exception("report_outcome() failed; outcome dropped")
            return False

    def stats(self) -> ClientStats:
        """Counters now; exposed so Runtime can export them as its own metrics."""
        with self._lock:
            reconnects, error = self._reconnects, self._last_error
        return ClientStats(self._mirrors.stats(), self._outcomes.stats(), reconnects, error)

    def flush(self, timeout: float) -> bool:
        """Wait (off the hot path) until everything offered so far is acked or dropped."""
        return self._mirrors.wait_empty(timeout) and self._outcomes.wait_empty(timeout)

    def close(self, timeout: float = 5.0) -> ClientStats:
        """Flush for up to `timeout`, stop, count what is left as dropped."""
        self.flush(timeout)
        self._stop.set()
        self._mirrors.wake()
        self._outcomes.wake()
        self._channel.close()
        for thread in self._threads:
            thread.join(timeout)
        self._mirrors.abandon()
        self._outcomes.abandon()
        return self.stats()

    def __enter__(self) -> MirrorClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _spawn(
        self, lane: Lane, method: str, envelope: Callable[[int, Any], Any]
    ) -> threading.Thread:
        thread = threading.Thread(
            target=self._run,
            args=(lane, method, envelope),
            name=f"understudy-{method}",
            daemon=True,
        )
        thread.start()
        return thread

    def _run(self, lane: Lane, method: str, envelope: Callable[[int, Any], Any]) -> None:
        call_stream = self._channel.stream_stream(
            _SERVICE + method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=shadow_pb2.StreamAck.FromString,
        )
        delay = self._backoff[0]
        while not self._stop.is_set():
            if self._stream_once(lane, call_stream, envelope, method):
                delay = self._backoff[0]
            lane.requeue_unacked()
            if self._stop.is_set():
                return
            with self._lock:
                self._reconnects += 1
            self._stop.wait(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, self._backoff[1])

    def _stream_once(
        self, lane: Lane, call_stream: Any, envelope: Callable[[int, Any], Any], method: str = ""
    ) -> bool:
        """Run one stream until it breaks; True if the server acked anything on it."""
        broken = threading.Event()
        holder: list[Any] = []

        def requests() -> Iterator[Any]:
            while not (self._stop.is_set() or broken.is_set()):
                if lane.oldest_unacked_age() > self._ack_timeout_s and holder:
                    holder[0].cancel()  # a silent server: tear down and resend elsewhere
                    return
                item = lane.next_to_send(0.05, live=lambda: not broken.is_set())
                if item is not None:
                    yield envelope(*item)

        acked = False
        try:
            responses = call_stream(requests(), metadata=self._metadata)
            holder.append(responses)
            for ack in responses:
                if ack.status in _REFUSED:
                    _log_refusal(method, ack)
                lane.acknowledge(ack.status, ack.sequence, ack.reason)
                acked = True
        except grpc.RpcError as exc:
            with self._lock:
                self._last_error = f"{exc.code().name}: {exc.details()}"
        finally:
            broken.set()
        return acked


_REFUSED = (shadow_pb2.ACK_STATUS_REJECTED, shadow_pb2.ACK_STATUS_REPEATED_SEQUENCE)


def _log_refusal(method: str, ack: shadow_pb2.StreamAck) -> None:
    """One line per refused message: the field and reason say what to fix in the sender."""
    status = shadow_pb2.AckStatus.Name(ack.status).removeprefix("ACK_STATUS_")
    log.warning(
        "%s: message %d %s: field %s, reason %s",
        method,
        ack.sequence,
        status,
        ack.field or "-",
        ack.reason or "-",
    )


def _mirror_envelope(sequence: int, request: Any) -> shadow_pb2.MirrorStreamRequest:
    return shadow_pb2.MirrorStreamRequest(sequence=sequence, request=request)


def _outcome_envelope(sequence: int, outcome: Any) -> shadow_pb2.OutcomeStreamRequest:
    return shadow_pb2.OutcomeStreamRequest(sequence=sequence, outcome=outcome)
