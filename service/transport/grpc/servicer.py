"""The ShadowEvaluation servicer: decode, delegate to `Ingest`, ack.

Handlers receive raw bytes (no deserializer registered) and parse them inside
the ingest call, so a malformed protobuf is an INVALID_ARGUMENT that is counted
like any other rejection, instead of an uncounted INTERNAL raised inside gRPC.

The batch RPCs (`MirrorMany`, `MirrorManyStream`, `ReportOutcomes`,
`ReportOutcomesStream`) decode, ack and count as `batch_streams.py` says; their
streams share the driver below (reader thread, sequence checks, idle close).

On a stream, a refused message gets its own ack with the field and a reason
code (service.contract.rejections; the vocabulary is in docs/ingest.md): a
sequence that does not increase is REPEATED_SEQUENCE, never REJECTED under the
number of a message already accepted, and a message that cannot be read at all
is REJECTED under sequence 0 (it has none), so one number never stands for two
messages.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from service.auth import Role, TokenAuthority
from service.contract import InvalidInput, MirrorRequest, Outcome, PayloadTooLarge
from service.contract.errors import AuthError, MissingField, UnderstudyError
from service.contract.rejections import Refusal, RejectionReason, refusal_of
from service.metrics import ServiceMetrics, field_label
from service.pipeline.ingest import AckStatus, Ingest, IngestResult
from service.transport.grpc.batch_streams import (
    GRPC_BATCH,
    BatchStreamProgress,
    BatchWire,
    batch_ack_of,
)
from service.transport.grpc.envelope import embedded_payload, leading_sequence, parse_message
from service.transport.grpc.errors import abort, handle_errors
from service.transport.grpc.stream_limits import StreamLimits
from service.transport.grpc.streams import A, Lane, Opened, StreamIdle, StreamProgress
from service.wire.convert import mirror_request_from_pb, outcome_from_pb
from service.wire.snapshot_cache import SnapshotCache
from service.wire.understudy.v1 import contract_pb2, shadow_pb2

log = logging.getLogger(__name__)

SERVICE_NAME = "understudy.v1.ShadowEvaluation"
UNAUTHENTICATED_PRINCIPAL = "(no valid token)"  # callers without a token share one limit
NO_SEQUENCE = 0
"""The ack sequence of a message that could not be read: clients number from 1."""
_REPEATED = shadow_pb2.ACK_STATUS_REPEATED_SEQUENCE
_PB_STATUS = {
    AckStatus.ACCEPTED: shadow_pb2.ACK_STATUS_ACCEPTED,
    AckStatus.SHED: shadow_pb2.ACK_STATUS_SHED,
    AckStatus.REJECTED: shadow_pb2.ACK_STATUS_REJECTED,
}


class ShadowEvaluationServicer:
    """Implements the four RPCs of `ShadowEvaluation` over raw bytes."""

    def __init__(
        self,
        ingest: Ingest,
        authority: TokenAuthority,
        metrics: ServiceMetrics,
        max_request_bytes: int,
        stream_limits: StreamLimits | None = None,
    ) -> None:
        self._ingest = ingest
        self._authority = authority
        self._metrics = metrics
        self._limit = max_request_bytes
        self.stream_limits = stream_limits or StreamLimits()
        self._batches = BatchWire(ingest, metrics)
        self._snapshots = SnapshotCache()
        """Decoded snapshots by their exact bytes: single requests of one scheduling
        cycle share one (service.wire.snapshot_cache)."""

    @property
    def metrics(self) -> ServiceMetrics:
        """Where the servicer counts; the server's stream admission counts there too."""
        return self._metrics

    def principal_of(self, context: grpc.ServicerContext) -> str:
        """Whose stream this is, for the per-principal stream limit (never raises)."""
        metadata = dict(context.invocation_metadata())
        try:
            return self._authority.identify(metadata.get("authorization")).principal
        except AuthError:
            return UNAUTHENTICATED_PRINCIPAL

    def _authorise(self, context: grpc.ServicerContext) -> None:
        metadata = dict(context.invocation_metadata())
        try:
            self._authority.require(metadata.get("authorization"), Role.RUNTIME)
        except AuthError as exc:
            self._metrics.auth_failures.labels("grpc", type(exc).__name__).inc()
            abort(context, exc)

    def _decode_mirror(self, raw: bytes) -> Callable[[], tuple[MirrorRequest, bytes]]:
        def decode() -> tuple[MirrorRequest, bytes]:
            msg = contract_pb2.MirrorRequest()
            parse_message(msg, raw, "request", self._limit)
            return mirror_request_from_pb(msg, snapshots=self._snapshots), raw

        return decode

    def _decode_outcome(self, raw: bytes) -> Callable[[], tuple[Outcome, bytes]]:
        def decode() -> tuple[Outcome, bytes]:
            msg = contract_pb2.Outcome()
            parse_message(msg, raw, "outcome", self._limit)
            return outcome_from_pb(msg), raw

        return decode

    @handle_errors
    def mirror(self, raw: bytes, context: grpc.ServicerContext) -> shadow_pb2.MirrorAck:
        """Unary mirror: INVALID_ARGUMENT on bad input, else ACCEPTED or SHED."""
        self._authorise(context)
        result = self._ingest.mirror("grpc", self._decode_mirror(raw), canonical=True)
        return shadow_pb2.MirrorAck(status=_PB_STATUS[result.status], request_id=result.request_id)

    @handle_errors
    def report_outcome(self, raw: bytes, context: grpc.ServicerContext) -> shadow_pb2.OutcomeAck:
        """Unary outcome report."""
        self._authorise(context)
        result = self._ingest.outcome("grpc", self._decode_outcome(raw))
        return shadow_pb2.OutcomeAck(status=_PB_STATUS[result.status], request_id=result.request_id)

    def mirror_stream(
        self, requests: Iterator[bytes], context: grpc.ServicerContext
    ) -> Iterator[shadow_pb2.StreamAck]:
        """Bidirectional mirror stream with cumulative acks by sequence number."""
        self._authorise(context)

        def open_envelope(raw: bytes) -> Opened:
            envelope = shadow_pb2.MirrorStreamRequest()
            parse_message(envelope, raw, "message", self._limit + 64)
            payload = embedded_payload(raw) or envelope.request.SerializeToString()

            def decode() -> tuple[MirrorRequest, bytes]:
                # here, not above: the message has a sequence, so it is refused under it
                if not envelope.HasField("request"):
                    raise MissingField("request", "is required in every stream message")
                request = mirror_request_from_pb(envelope.request, snapshots=self._snapshots)
                return request, payload

            return (
                envelope.sequence,
                1,
                lambda: self._ingest.mirror("grpc_stream", decode, canonical=True),
            )

        lane = _SingleLane(self, "mirror", open_envelope, self._stream_progress())
        return self._run_stream(requests, context, lane)

    def report_outcome_stream(
        self, requests: Iterator[bytes], context: grpc.ServicerContext
    ) -> Iterator[shadow_pb2.StreamAck]:
        """Bidirectional outcome stream with cumulative acks."""
        self._authorise(context)

        def open_envelope(raw: bytes) -> Opened:
            envelope = shadow_pb2.OutcomeStreamRequest()
            parse_message(envelope, raw, "message", self._limit + 64)
            payload = embedded_payload(raw) or envelope.outcome.SerializeToString()

            def decode() -> tuple[Outcome, bytes]:
                if not envelope.HasField("outcome"):
                    raise MissingField("outcome", "is required in every stream message")
                return outcome_from_pb(envelope.outcome), payload

            return envelope.sequence, 1, lambda: self._ingest.outcome("grpc_stream", decode)

        lane = _SingleLane(self, "outcome", open_envelope, self._stream_progress())
        return self._run_stream(requests, context, lane)

    # -- batches (issue 24; the acks: batch_streams.py) -------------------------------

    @handle_errors
    def mirror_many(self, raw: bytes, context: grpc.ServicerContext) -> shadow_pb2.BatchAck:
        """Unary batch: per-request refusals in the ack; a batch refused whole is
        INVALID_ARGUMENT naming the field, as the unary `Mirror` refuses a request."""
        self._authorise(context)
        batch = self._batches.mirror_decoder(raw, "batch", self._limit)
        return batch_ack_of(self._ingest.mirror_batch(GRPC_BATCH, batch))

    @handle_errors
    def report_outcomes(self, raw: bytes, context: grpc.ServicerContext) -> shadow_pb2.BatchAck:
        """Unary outcome batch, as `mirror_many`."""
        self._authorise(context)
        batch = self._batches.outcome_decoder(raw, "batch", self._limit)
        return batch_ack_of(self._ingest.outcome_batch(GRPC_BATCH, batch))

    def mirror_many_stream(
        self, requests: Iterator[bytes], context: grpc.ServicerContext
    ) -> Iterator[shadow_pb2.BatchStreamAck]:
        """Bidirectional batch stream: cumulative acks, a batch not wholly accepted acked alone."""
        self._authorise(context)
        lane = self._batches.mirror_lane(self._limit, self._batch_progress())
        return self._run_stream(requests, context, lane)

    def report_outcomes_stream(
        self, requests: Iterator[bytes], context: grpc.ServicerContext
    ) -> Iterator[shadow_pb2.BatchStreamAck]:
        """Bidirectional outcome batch stream, as `mirror_many_stream`."""
        self._authorise(context)
        lane = self._batches.outcome_lane(self._limit, self._batch_progress())
        return self._run_stream(requests, context, lane)

    # -- the stream driver, shared by every stream -------------------------------------

    def _stream_progress(self) -> StreamProgress:
        return StreamProgress(idle_close_s=self.stream_limits.idle_timeout_s)

    def _batch_progress(self) -> BatchStreamProgress:
        return BatchStreamProgress(idle_close_s=self.stream_limits.idle_timeout_s)

    def _run_stream(
        self, requests: Iterator[bytes], context: grpc.ServicerContext, lane: Lane[A]
    ) -> Iterator[A]:
        idle_s = self.stream_limits.idle_timeout_s
        progress, kind = lane.progress, lane.kind

        def consume() -> None:
            try:
                for raw in requests:
                    progress.touch()
                    _consume_one(raw, lane)
                    if not progress.wait_for_room(idle_s):
                        # Sends but reads no ack: cancel rather than hold its acks for ever.
                        self._metrics.grpc_streams_unread_closed.inc()
                        log.warning("%s stream cancelled: its acks went unread", kind)
                        context.cancel()
                        break
            except grpc.RpcError:
                log.info("%s stream ended by the client", kind)
            except Exception:  # a reader must never die silently and hang the acks
                log.exception("%s stream reader failed", kind)
            finally:
                progress.finish()

        threading.Thread(target=consume, name=f"{kind}-stream-reader", daemon=True).start()
        try:
            yield from progress.acks()
        except StreamIdle as exc:
            # Ends the call; gRPC then ends the reader's request iterator.
            self._metrics.grpc_streams_idle_closed.inc()
            context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{exc}: nothing was sent for UNDERSTUDY_GRPC_STREAM_IDLE_TIMEOUT_S = "
                f"{idle_s:g} s, so the stream was closed; open a new one to send more",
            )


def _consume_one(raw: bytes, lane: Lane[Any]) -> None:
    """Check one stream message's sequence, then ingest it and record its fate.

    The sequence is checked before ingesting: a message refused for its
    sequence must not reach the journal (it would be scored, yet acked refused
    and counted twice). `size` is what the message holds (1, or a batch's
    stated request count; 0 where it could not be read), for the per-request
    totals of batch streams.
    """
    unread: InvalidInput | None = None
    try:
        sequence, size, ingest = lane.open(raw)
    except InvalidInput as exc:
        unread = exc
        leading = leading_sequence(raw) if isinstance(exc, PayloadTooLarge) else None
        if leading is None:
            # Unreadable: it has no sequence of its own, and taking the next
            # one would refuse the client's real next message as repeated.
            lane.refuse(NO_SEQUENCE, exc, 0, counted=False)
            return
        sequence, size = leading, 0
    progress = lane.progress
    if sequence == NO_SEQUENCE:  # proto3's absent field: the client numbered nothing
        absent = MissingField("sequence", "is required in every stream message, from 1")
        lane.refuse(NO_SEQUENCE, absent, size, counted=False)
        return
    if sequence <= progress.last_sequence:
        stale = InvalidInput(
            "sequence", f"must increase; got {sequence} after {progress.last_sequence}"
        )
        lane.refuse(sequence, stale, size, counted=False, status=_REPEATED)
        return
    progress.last_sequence = sequence
    if unread is not None:  # too large, but numbered: refused under its own sequence
        lane.refuse(sequence, unread, 0, counted=False)
        return
    try:
        result = ingest()
    except UnderstudyError as exc:  # an InvalidInput is already counted by the engine
        if refusal_of(exc) is None:
            raise  # not about this message (e.g. a dependency down): ends the stream
        lane.refuse(sequence, exc, size, counted=True)
        return
    lane.accept(sequence, result)


class _SingleLane:
    """A stream of single messages: `StreamAck`s, one refusal per refused message."""

    transport = "grpc_stream"

    def __init__(
        self,
        servicer: ShadowEvaluationServicer,
        kind: str,
        open_envelope: Callable[[bytes], Opened],
        progress: StreamProgress,
    ) -> None:
        self.kind = kind
        self.open = open_envelope
        self.progress = progress
        self._ingest = servicer._ingest
        self._metrics = servicer.metrics

    def accept(self, sequence: int, result: IngestResult) -> None:
        self.progress.record(_PB_STATUS[result.status], sequence)

    def refuse(
        self,
        sequence: int,
        exc: UnderstudyError,
        size: int,
        *,
        counted: bool,
        status: int = shadow_pb2.ACK_STATUS_REJECTED,
    ) -> None:
        """Ack one refused message with its bounded field and reason code, and count it."""
        if not counted and isinstance(exc, InvalidInput):
            self._ingest.count_rejection(self.transport, self.kind, exc)
        refusal = refusal_of(exc) or Refusal("", RejectionReason.INVALID_VALUE)
        reason = RejectionReason.REPEATED_SEQUENCE if status == _REPEATED else refusal.reason
        self._metrics.grpc_stream_refusals.labels(self.kind, reason.value).inc()
        self.progress.record(status, sequence, field_label(refusal.field), reason.value)


def generic_handler(servicer: ShadowEvaluationServicer) -> grpc.GenericRpcHandler:
    """Method handlers with raw-bytes requests and protobuf responses."""

    def serialize(message: Any) -> bytes:
        return bytes(message.SerializeToString())

    handlers = {
        "Mirror": grpc.unary_unary_rpc_method_handler(
            servicer.mirror, response_serializer=serialize
        ),
        "ReportOutcome": grpc.unary_unary_rpc_method_handler(
            servicer.report_outcome, response_serializer=serialize
        ),
        "MirrorStream": grpc.stream_stream_rpc_method_handler(
            servicer.mirror_stream, response_serializer=serialize
        ),
        "ReportOutcomeStream": grpc.stream_stream_rpc_method_handler(
            servicer.report_outcome_stream, response_serializer=serialize
        ),
        "MirrorMany": grpc.unary_unary_rpc_method_handler(
            servicer.mirror_many, response_serializer=serialize
        ),
        "ReportOutcomes": grpc.unary_unary_rpc_method_handler(
            servicer.report_outcomes, response_serializer=serialize
        ),
        "MirrorManyStream": grpc.stream_stream_rpc_method_handler(
            servicer.mirror_many_stream, response_serializer=serialize
        ),
        "ReportOutcomesStream": grpc.stream_stream_rpc_method_handler(
            servicer.report_outcomes_stream, response_serializer=serialize
        ),
    }
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)
