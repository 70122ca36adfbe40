"""The ShadowEvaluation servicer: decode, delegate to `Ingest`, ack.

Handlers receive raw bytes (no deserializer registered) and parse them inside
the ingest call, so a malformed protobuf is an INVALID_ARGUMENT that is counted
like any other rejection, instead of an uncounted INTERNAL raised inside gRPC.

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
from google.protobuf.message import DecodeError

from service.auth import Role, TokenAuthority
from service.contract import InvalidInput, MirrorRequest, Outcome, PayloadTooLarge
from service.contract.errors import AuthError, MalformedMessage, MissingField, UnderstudyError
from service.contract.rejections import Refusal, RejectionReason, refusal_of
from service.metrics import ServiceMetrics, field_label
from service.pipeline.ingest import AckStatus, Ingest, IngestResult
from service.transport.grpc.errors import abort, handle_errors
from service.transport.grpc.stream_limits import StreamLimits
from service.transport.grpc.streams import StreamIdle, StreamProgress
from service.wire.convert import mirror_request_from_pb, outcome_from_pb
from service.wire.understudy.v1 import contract_pb2, shadow_pb2

log = logging.getLogger(__name__)

SERVICE_NAME = "understudy.v1.ShadowEvaluation"
UNAUTHENTICATED_PRINCIPAL = "(no valid token)"  # callers without a token share one limit
NO_SEQUENCE = 0
"""The ack sequence of a message that could not be read: clients number from 1."""
_PB_STATUS = {
    AckStatus.ACCEPTED: shadow_pb2.ACK_STATUS_ACCEPTED,
    AckStatus.SHED: shadow_pb2.ACK_STATUS_SHED,
    AckStatus.REJECTED: shadow_pb2.ACK_STATUS_REJECTED,
}


def _parse(message: Any, raw: bytes, what: str, limit: int) -> None:
    if len(raw) > limit:
        raise PayloadTooLarge(what, f"is {len(raw)} bytes; the limit is {limit}")
    try:
        message.ParseFromString(raw)
    except DecodeError as exc:
        raise MalformedMessage(what, f"is not a valid protobuf message: {exc}") from exc


def _embedded(raw: bytes) -> bytes | None:
    """The bytes of field 2 when a parsed envelope is exactly ``[sequence = 1][field 2]``.

    That is the layout every protobuf serializer writes, and then the slice is the
    message the envelope holds (it occurs once and nothing follows), so it is
    journaled as sent, as the unary RPC journals its body, instead of paying for
    a re-serialisation. Any other valid layout gives None and is re-serialised.
    """
    end, pos = len(raw), 0
    if raw[:1] == b"\x08":  # field 1, varint: skip it
        pos = 1
        while pos < end and raw[pos] & 0x80:
            pos += 1
        pos += 1
    if raw[pos : pos + 1] != b"\x12":  # field 2, length-delimited
        return None
    pos += 1
    length = shift = 0
    while pos < end:
        byte = raw[pos]
        pos += 1
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return raw[pos:] if pos + length == end else None
        shift += 7
    return None


def _leading_sequence(raw: bytes) -> int | None:
    """The sequence of an envelope too large to parse, when it is written first.

    Every serializer writes field 1 first, so an oversized message can still be
    refused under its own number; None when the bytes do not start that way.
    """
    if raw[:1] != b"\x08":
        return None
    value = shift = 0
    for pos in range(1, min(len(raw), 11)):
        byte = raw[pos]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value if value < 2**64 else None
        shift += 7
    return None


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
            _parse(msg, raw, "request", self._limit)
            return mirror_request_from_pb(msg), raw

        return decode

    def _decode_outcome(self, raw: bytes) -> Callable[[], tuple[Outcome, bytes]]:
        def decode() -> tuple[Outcome, bytes]:
            msg = contract_pb2.Outcome()
            _parse(msg, raw, "outcome", self._limit)
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

        def open_envelope(raw: bytes) -> tuple[int, Callable[[], IngestResult]]:
            envelope = shadow_pb2.MirrorStreamRequest()
            _parse(envelope, raw, "message", self._limit + 64)
            payload = _embedded(raw) or envelope.request.SerializeToString()

            def decode() -> tuple[MirrorRequest, bytes]:
                # here, not above: the message has a sequence, so it is refused under it
                if not envelope.HasField("request"):
                    raise MissingField("request", "is required in every stream message")
                return mirror_request_from_pb(envelope.request), payload

            return envelope.sequence, lambda: self._ingest.mirror(
                "grpc_stream", decode, canonical=True
            )

        return self._run_stream(requests, context, open_envelope, "mirror")

    def report_outcome_stream(
        self, requests: Iterator[bytes], context: grpc.ServicerContext
    ) -> Iterator[shadow_pb2.StreamAck]:
        """Bidirectional outcome stream with cumulative acks."""
        self._authorise(context)

        def open_envelope(raw: bytes) -> tuple[int, Callable[[], IngestResult]]:
            envelope = shadow_pb2.OutcomeStreamRequest()
            _parse(envelope, raw, "message", self._limit + 64)
            payload = _embedded(raw) or envelope.outcome.SerializeToString()

            def decode() -> tuple[Outcome, bytes]:
                if not envelope.HasField("outcome"):
                    raise MissingField("outcome", "is required in every stream message")
                return outcome_from_pb(envelope.outcome), payload

            return envelope.sequence, lambda: self._ingest.outcome("grpc_stream", decode)

        return self._run_stream(requests, context, open_envelope, "outcome")

    def _run_stream(
        self,
        requests: Iterator[bytes],
        context: grpc.ServicerContext,
        open_envelope: Callable[[bytes], tuple[int, Callable[[], IngestResult]]],
        kind: str,
    ) -> Iterator[shadow_pb2.StreamAck]:
        idle_s = self.stream_limits.idle_timeout_s
        progress = StreamProgress(idle_close_s=idle_s)

        def consume() -> None:
            try:
                for raw in requests:
                    progress.touch()
                    self._consume_one(raw, open_envelope, progress, kind)
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

    def _consume_one(
        self,
        raw: bytes,
        open_envelope: Callable[[bytes], tuple[int, Callable[[], IngestResult]]],
        progress: StreamProgress,
        kind: str,
    ) -> None:
        # The sequence is checked before ingesting: a message refused for its
        # sequence must not reach the journal (it would be scored, yet acked
        # refused and counted twice).
        unread: InvalidInput | None = None
        try:
            sequence, ingest = open_envelope(raw)
        except InvalidInput as exc:
            unread = exc
            leading = _leading_sequence(raw) if isinstance(exc, PayloadTooLarge) else None
            if leading is None:
                # Unreadable: it has no sequence of its own, and taking the next
                # one would refuse the client's real next message as repeated.
                self._ingest.count_rejection("grpc_stream", kind, exc)
                self._refuse(progress, kind, NO_SEQUENCE, exc)
                return
            sequence = leading
        if sequence == NO_SEQUENCE:  # proto3's absent field: the client numbered nothing
            absent = MissingField("sequence", "is required in every stream message, from 1")
            self._ingest.count_rejection("grpc_stream", kind, absent)
            self._refuse(progress, kind, NO_SEQUENCE, absent)
            return
        if sequence <= progress.last_sequence:
            stale = InvalidInput(
                "sequence", f"must increase; got {sequence} after {progress.last_sequence}"
            )
            self._ingest.count_rejection("grpc_stream", kind, stale)
            self._refuse(progress, kind, sequence, stale, shadow_pb2.ACK_STATUS_REPEATED_SEQUENCE)
            return
        progress.last_sequence = sequence
        if unread is not None:  # too large, but numbered: refused under its own sequence
            self._ingest.count_rejection("grpc_stream", kind, unread)
            self._refuse(progress, kind, sequence, unread)
            return
        try:
            result = ingest()
        except UnderstudyError as exc:  # an InvalidInput is already counted by the engine
            if refusal_of(exc) is None:
                raise  # not about this message (e.g. a dependency down): ends the stream
            self._refuse(progress, kind, sequence, exc)
            return
        progress.record(_PB_STATUS[result.status], sequence)

    def _refuse(
        self,
        progress: StreamProgress,
        kind: str,
        sequence: int,
        exc: UnderstudyError,
        status: int = shadow_pb2.ACK_STATUS_REJECTED,
    ) -> None:
        """Ack one refused message with its bounded field and reason code, and count it."""
        refusal = refusal_of(exc) or Refusal("", RejectionReason.INVALID_VALUE)
        reason = (
            RejectionReason.REPEATED_SEQUENCE
            if status == shadow_pb2.ACK_STATUS_REPEATED_SEQUENCE
            else refusal.reason
        )
        self._metrics.grpc_stream_refusals.labels(kind, reason.value).inc()
        progress.record(status, sequence, field_label(refusal.field), reason.value)


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
    }
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)
