"""`MirrorClient`: never blocks, never raises, batches, resends what was not acked.

The caller's thread only touches `Batcher.offer` / `Lane.offer` (a lock and a
deque append). Per kind (mirrors, outcomes), one background thread keeps a
bidirectional batch stream (`MirrorManyStream`, `ReportOutcomesStream`) open:
its request generator cuts the offered requests into columnar batches
(`MirrorBatch`, `OutcomeBatch`) of up to `max_batch_requests` requests or
`max_batch_bytes` encoded bytes, or `linger_s` after a batch's first request,
whichever comes first; the thread reads per-batch acks and retires what they
cover. When the stream breaks -- server absent, killed, restarted, or silent
longer than `ack_timeout_s` -- the thread reconnects with exponential backoff
and jitter and resends every unacked batch first, whole, in order.

A request that a batch cannot carry goes on the single-request stream of its
kind (`MirrorStream`, `ReportOutcomeStream`), opened only when first needed:
a request of schema version other than 2 (a batch speaks schema 2 only), and
a protobuf message that cannot be read into a request (the service then names
what is wrong with it, as it always did). Drops (buffer full, or undelivered at
close) are counted per request, so ``offered == delivered + dropped +
in_flight`` always holds, summed over both paths.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from service.client.batcher import Batcher, BatchStats
from service.client.lane import Lane, LaneStats
from service.contract import MirrorRequest, Outcome
from service.contract.batch import BATCH_SCHEMA_VERSION, OutcomeColumns, RequestBatch
from service.wire.batch_codec import batch_to_pb, outcomes_to_pb
from service.wire.convert import (
    mirror_request_from_pb,
    mirror_request_to_pb,
    outcome_from_pb,
    outcome_to_pb,
)
from service.wire.understudy.v1 import contract_pb2, shadow_pb2

log = logging.getLogger(__name__)

_SERVICE = "/understudy.v1.ShadowEvaluation/"


@dataclass(frozen=True)
class ClientStats:
    """Per-request counters of both kinds (batched and single paths summed), how often
    the client had to reconnect, and how each kind batched."""

    mirrors: LaneStats
    outcomes: LaneStats
    reconnects: int
    last_error: str | None
    mirror_batches: BatchStats = field(default_factory=BatchStats)
    outcome_batches: BatchStats = field(default_factory=BatchStats)


class NotBatchable(Exception):
    """A request a batch cannot carry (schema version other than 2)."""


@dataclass
class _Route:
    """One stream: its RPC, how to take the next message, envelope it and read acks."""

    method: str
    take: Callable[[float, Callable[[], bool]], tuple[int, Any] | None]
    envelope: Callable[[int, Any], Any]
    ack_type: Any
    on_ack: Callable[[Any], None]
    requeue: Callable[[], None]
    age: Callable[[], float]
    has_work: Callable[[], bool]
    lazy: bool  # open the stream only once there is something to send


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
        max_batch_requests: int = 256,
        max_batch_bytes: int = 1 << 20,
        linger_s: float = 0.005,
        batching: bool = True,
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
        self._mirror_batches: Batcher | None = None
        self._outcome_batches: Batcher | None = None
        routes = [
            self._single_route(self._mirrors, "MirrorStream", _mirror_envelope, lazy=batching),
            self._single_route(
                self._outcomes, "ReportOutcomeStream", _outcome_envelope, lazy=batching
            ),
        ]
        if batching:
            self._mirror_batches = request_batcher(
                buffer_size,
                lambda item, exc: self._divert(self._mirrors, "request", item, exc),
                max_requests=max_batch_requests,
                max_bytes=max_batch_bytes,
                linger_s=linger_s,
            )
            self._outcome_batches = outcome_batcher(
                buffer_size,
                lambda item, exc: self._divert(self._outcomes, "outcome", item, exc),
                max_requests=max_batch_requests,
                max_bytes=max_batch_bytes,
                linger_s=linger_s,
            )
            routes += [
                self._batch_route(self._mirror_batches, "MirrorManyStream"),
                self._batch_route(self._outcome_batches, "ReportOutcomesStream"),
            ]
        self._threads = [self._spawn(route) for route in routes]

    # -- the scheduler's side: never blocks, never raises -------------------------------

    def mirror(self, request: contract_pb2.MirrorRequest) -> bool:
        """Queue a mirrored request (protobuf); False if it was dropped."""
        try:
            if self._mirror_batches is None or request.schema_version != BATCH_SCHEMA_VERSION:
                return self._mirrors.offer(request)
            return self._mirror_batches.offer(request)
        except Exception:  # the caller is production: nothing may escape
            log.exception("mirror() failed; request dropped")
            return False

    def mirror_request(self, request: MirrorRequest) -> bool:
        """Queue a mirrored request (contract object); False if it was dropped.

        Requests holding the same `ClusterState` object (one scheduling cycle's)
        share one snapshot in their batch.
        """
        try:
            if self._mirror_batches is None or request.schema_version != BATCH_SCHEMA_VERSION:
                return self._mirrors.offer(request)
            return self._mirror_batches.offer(request)
        except Exception:
            log.exception("mirror_request() failed; request dropped")
            return False

    def report_outcome(self, outcome: contract_pb2.Outcome) -> bool:
        """Queue an outcome report (protobuf); False if it was dropped."""
        return self._report(outcome)

    def report(self, outcome: Outcome) -> bool:
        """Queue an outcome report (contract object); False if it was dropped."""
        return self._report(outcome)

    def _report(self, outcome: Any) -> bool:
        try:
            if self._outcome_batches is None:
                return self._outcomes.offer(outcome)
            return self._outcome_batches.offer(outcome)
        except Exception:
            log.exception("report_outcome() failed; outcome dropped")
            return False

    # -- off the hot path ---------------------------------------------------------------

    def stats(self) -> ClientStats:
        """Counters now; exposed so Runtime can export them as its own metrics."""
        with self._lock:
            reconnects, error = self._reconnects, self._last_error
        return ClientStats(
            mirrors=_summed(self._mirrors, self._mirror_batches),
            outcomes=_summed(self._outcomes, self._outcome_batches),
            reconnects=reconnects,
            last_error=error,
            mirror_batches=(
                self._mirror_batches.batch_stats() if self._mirror_batches else BatchStats()
            ),
            outcome_batches=(
                self._outcome_batches.batch_stats() if self._outcome_batches else BatchStats()
            ),
        )

    def flush(self, timeout: float) -> bool:
        """Wait (off the hot path) until everything offered so far is acked or dropped.

        Batches are cut at once while it waits (no linger)."""
        deadline = time.monotonic() + timeout
        batchers = [b for b in (self._mirror_batches, self._outcome_batches) if b is not None]
        for b in batchers:
            b.hurry(True)
        try:
            # batchers first: what they divert to the single lanes is then waited for too
            queues: list[Lane | Batcher] = [*batchers, self._mirrors, self._outcomes]
            return all(q.wait_empty(max(0.0, deadline - time.monotonic())) for q in queues)
        finally:
            for b in batchers:
                b.hurry(False)

    def close(self, timeout: float = 5.0) -> ClientStats:
        """Flush for up to `timeout`, stop, count what is left as dropped."""
        if not self._stop.is_set():
            self.flush(timeout)
        self._stop.set()
        queues: list[Lane | Batcher] = [self._mirrors, self._outcomes]
        queues += [b for b in (self._mirror_batches, self._outcome_batches) if b is not None]
        for q in queues:
            q.wake()
        self._channel.close()
        for thread in self._threads:
            thread.join(timeout)
        for q in queues:
            q.abandon()
        return self.stats()

    def __enter__(self) -> MirrorClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- streams ------------------------------------------------------------------------

    def _single_route(
        self, lane: Lane, method: str, envelope: Callable[[int, Any], Any], *, lazy: bool
    ) -> _Route:
        def on_ack(ack: shadow_pb2.StreamAck) -> None:
            if ack.status in _REFUSED:
                _log_refusal(method, ack)
            lane.acknowledge(ack.status, ack.sequence, ack.reason)

        return _Route(
            method=method,
            take=lambda timeout, live: lane.next_to_send(timeout, live=live),
            envelope=envelope,
            ack_type=shadow_pb2.StreamAck,
            on_ack=on_ack,
            requeue=lane.requeue_unacked,
            age=lane.oldest_unacked_age,
            has_work=lane.has_work,
            lazy=lazy,
        )

    def _batch_route(self, batcher: Batcher, method: str) -> _Route:
        def on_ack(message: shadow_pb2.BatchStreamAck) -> None:
            ack = message.ack
            if ack.status in _REFUSED or ack.rejections:
                _log_batch_refusal(method, ack, batcher.ids_of(ack.sequence))
            batcher.acknowledge(ack)

        return _Route(
            method=method,
            take=lambda timeout, live: batcher.next_batch(timeout, live=live),
            envelope=_batch_envelope,
            ack_type=shadow_pb2.BatchStreamAck,
            on_ack=on_ack,
            requeue=batcher.requeue_unacked,
            age=batcher.oldest_unacked_age,
            has_work=batcher.has_work,
            lazy=False,
        )

    def _divert(self, lane: Lane, what: str, item: Any, exc: Exception) -> None:
        """A request no batch can carry goes on the single stream, where the service
        gives its own verdict on it (and names the field, if it is bad)."""
        log.debug("%s not batched (%s): sent on the single stream", what, exc)
        lane.offer(item)

    def _spawn(self, route: _Route) -> threading.Thread:
        thread = threading.Thread(
            target=self._run, args=(route,), name=f"understudy-{route.method}", daemon=True
        )
        thread.start()
        return thread

    def _run(self, route: _Route) -> None:
        call_stream = self._channel.stream_stream(
            _SERVICE + route.method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=route.ack_type.FromString,
        )
        delay = self._backoff[0]
        while not self._stop.is_set():
            if route.lazy and not route.has_work():
                self._stop.wait(0.05)
                continue
            if self._stream_once(route, call_stream):
                delay = self._backoff[0]
            route.requeue()
            if self._stop.is_set():
                return
            with self._lock:
                self._reconnects += 1
            self._stop.wait(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, self._backoff[1])

    def _stream_once(self, route: _Route, call_stream: Any) -> bool:
        """Run one stream until it breaks; True if the server acked anything on it."""
        broken = threading.Event()
        holder: list[Any] = []

        def live() -> bool:
            return not broken.is_set()

        def requests() -> Iterator[Any]:
            while not (self._stop.is_set() or broken.is_set()):
                if route.age() > self._ack_timeout_s and holder:
                    holder[0].cancel()  # a silent server: tear down and resend elsewhere
                    return
                item = route.take(0.05, live)
                if item is not None:
                    yield route.envelope(*item)

        acked = False
        try:
            responses = call_stream(requests(), metadata=self._metadata)
            holder.append(responses)
            for ack in responses:
                route.on_ack(ack)
                acked = True
        except grpc.RpcError as exc:
            with self._lock:
                self._last_error = f"{route.method} {exc.code().name}: {exc.details()}"
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


def _log_batch_refusal(method: str, ack: shadow_pb2.BatchAck, ids: Sequence[str] | None) -> None:
    """One line per refused request of a batch, by index (and request id, when known)."""
    status = shadow_pb2.AckStatus.Name(ack.status).removeprefix("ACK_STATUS_")
    if ack.whole_batch or not ack.rejections:
        first = ack.rejections[0] if ack.rejections else shadow_pb2.BatchRejection()
        log.warning(
            "%s: batch %d %s as a whole: field %s, reason %s: %s",
            method,
            ack.sequence,
            status,
            first.field or "-",
            first.reason or "-",
            first.message or "-",
        )
        return
    for r in ack.rejections:
        rid = ids[r.index] if ids is not None and r.index < len(ids) else "?"
        log.warning(
            "%s: batch %d request %d (%s) %s: field %s, reason %s: %s",
            method,
            ack.sequence,
            r.index,
            rid,
            status,
            r.field or "-",
            r.reason or "-",
            r.message or "-",
        )


def _summed(lane: Lane, batcher: Batcher | None) -> LaneStats:
    """Per-request counters of one kind over both paths (a diverted request counts once)."""
    if batcher is None:
        return lane.stats()
    s, b, diverted = batcher.locked(
        lambda: (lane.stats(), batcher.stats(), batcher.batch_stats().diverted)
    )
    reasons = dict(s.rejected_by_reason)
    for k, v in b.rejected_by_reason.items():
        reasons[k] = reasons.get(k, 0) + v
    return LaneStats(
        offered=s.offered + b.offered - diverted,
        accepted=s.accepted + b.accepted,
        shed=s.shed + b.shed,
        rejected=s.rejected + b.rejected,
        dropped=s.dropped + b.dropped,
        in_flight=s.in_flight + b.in_flight,
        resent=s.resent + b.resent,
        protocol_errors=s.protocol_errors + b.protocol_errors,
        rejected_by_reason=reasons,
    )


def request_batcher(
    capacity: int, divert: Callable[[Any, Exception], None], **limits: Any
) -> Batcher:
    """The mirror lane's `Batcher`: takes protobuf or contract requests, sends `MirrorBatch`
    envelopes (`MirrorBatchStreamRequest`); `limits` are `Batcher`'s keyword limits."""
    return Batcher(
        capacity,
        convert=_RequestReader(),
        encode=_encode_requests,
        ids=lambda rs: [r.request_id for r in rs],
        divert=divert,
        **limits,
    )


def outcome_batcher(
    capacity: int, divert: Callable[[Any, Exception], None], **limits: Any
) -> Batcher:
    """The outcome lane's `Batcher` (`OutcomeBatch` envelopes), as `request_batcher`."""
    return Batcher(
        capacity,
        convert=_batchable_outcome,
        encode=_encode_outcomes,
        ids=lambda os: [o.request_id for o in os],
        divert=divert,
        **limits,
    )


class _RequestReader:
    """On the sender thread: the contract request a batch carries (raises if none can).

    A protobuf request whose `state` equals the previous one's (the requests of one
    scheduling cycle, mirrored one after another) reuses the previous request's
    converted `ClusterState`, so the batch stores that snapshot once, as it does for
    `mirror_request` callers that share one object. Comparing two equal snapshots
    costs ~8 us against ~66 us to convert one (64 nodes; docs/client.md).
    """

    def __init__(self) -> None:
        self._last: tuple[int, contract_pb2.ClusterState, Any] | None = None

    def __call__(self, item: Any) -> MirrorRequest:
        if isinstance(item, contract_pb2.MirrorRequest):
            last = self._last  # one read: the pair stays consistent
            shared = None
            if last is not None and last[0] == item.schema_version and item.HasField("state"):
                shared = last[2] if item.state == last[1] else None
            request = mirror_request_from_pb(item, state=shared)
            if shared is None:
                self._last = (item.schema_version, item.state, request.state)
        else:
            request = item
        if request.schema_version != BATCH_SCHEMA_VERSION:
            raise NotBatchable(f"schema version {request.schema_version}")
        return request


def _batchable_outcome(item: Any) -> Outcome:
    return outcome_from_pb(item) if isinstance(item, contract_pb2.Outcome) else item


def _encode_requests(requests: list[MirrorRequest]) -> tuple[Any, int]:
    envelope = shadow_pb2.MirrorBatchStreamRequest()
    envelope.batch.CopyFrom(batch_to_pb(RequestBatch.from_requests(requests)))
    return envelope, envelope.batch.ByteSize()


def _encode_outcomes(outcomes: list[Outcome]) -> tuple[Any, int]:
    envelope = shadow_pb2.OutcomeBatchStreamRequest()
    envelope.batch.CopyFrom(outcomes_to_pb(OutcomeColumns.from_outcomes(outcomes)))
    return envelope, envelope.batch.ByteSize()


def _batch_envelope(sequence: int, envelope: Any) -> Any:
    """A built batch already is its stream envelope; only its sequence is per send."""
    envelope.sequence = sequence
    return envelope


def _mirror_envelope(sequence: int, request: Any) -> shadow_pb2.MirrorStreamRequest:
    if isinstance(request, MirrorRequest):  # converted here, on the sender thread
        request = mirror_request_to_pb(request)
    return shadow_pb2.MirrorStreamRequest(sequence=sequence, request=request)


def _outcome_envelope(sequence: int, outcome: Any) -> shadow_pb2.OutcomeStreamRequest:
    if isinstance(outcome, Outcome):
        outcome = outcome_to_pb(outcome)
    return shadow_pb2.OutcomeStreamRequest(sequence=sequence, outcome=outcome)
