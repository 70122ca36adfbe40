"""Batch acks: one `BatchAck` per batch, cumulative on a stream (issue 24).

A batch's ack says what happened to every request in it: `accepted + shed +
rejected` is the batch's size, and each rejected request is named by its
index in the batch, its field (indices dropped and bounded, as a stream ack's
`field`), a reason code of the allow-list (service.contract.rejections) and
the validator's message about that input. Nothing in an ack is computed from
a decision (tests/transport/test_ack_allowlist.py checks the descriptors).

On a stream (`BatchStreamProgress`, the machinery of `streams.AckPipe`): a
batch wholly accepted is covered by the next cumulative ack, `ACCEPTED` with
`sequence` = the highest batch handled so far; any batch with a shed or a
rejected request gets its own ack first, under its sequence. A cumulative
ack's `accepted` is the number of requests in the wholly accepted batches it
retires that no earlier ack counted, so the `accepted` of every ack on a
stream sums to `stream_accepted`. Every ack carries the stream's running
totals of requests, `stream_accepted + stream_shed + stream_rejected` =
requests received (a batch refused whole adds its stated request count to
`stream_rejected`; one that could not be read at all adds 0).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from google.protobuf.message import DecodeError

from service.contract import InvalidInput
from service.contract.errors import MalformedMessage, MissingField, UnderstudyError
from service.contract.rejections import Refusal, RejectionReason, refusal_of
from service.metrics import ServiceMetrics, field_label
from service.pipeline.ingest import BatchResult, Ingest
from service.transport.batches import (
    MAX_MESSAGE_CHARS,
    Indexed,
    decoded_outcomes,
    decoded_requests,
    stated_size,
    validator_text,
)
from service.transport.grpc.envelope import embedded_payload, parse_message, split_envelope
from service.transport.grpc.streams import AckPipe, Opened
from service.wire.batch_codec import DecodedBatch, DecodedOutcomes
from service.wire.understudy.v1 import batch_pb2, shadow_pb2

GRPC_BATCH = "grpc_batch"
"""The `transport` label of the unary batch RPCs (`MirrorMany`, `ReportOutcomes`)."""
GRPC_BATCH_STREAM = "grpc_batch_stream"
"""The `transport` label of the batch streams."""
ENVELOPE_BYTES = 64
"""What a stream envelope may add to `UNDERSTUDY_MAX_REQUEST_BYTES` (as for single messages)."""

_ACCEPTED = shadow_pb2.ACK_STATUS_ACCEPTED
_SHED = shadow_pb2.ACK_STATUS_SHED
_REJECTED = shadow_pb2.ACK_STATUS_REJECTED


def batch_status(shed: int, rejected: int) -> int:
    """ACCEPTED when nothing was shed or rejected; REJECTED when any was rejected; else SHED."""
    if rejected:
        return _REJECTED
    return _SHED if shed else _ACCEPTED


def rejection(index: int, field: str, reason: str, message: str) -> shadow_pb2.BatchRejection:
    """One refused request: bounded field, allow-listed reason, the validator's message."""
    return shadow_pb2.BatchRejection(
        index=index,
        field=field_label(field),
        reason=reason,
        message=message[:MAX_MESSAGE_CHARS],
    )


def rejections_of(refusals: Iterable[Indexed]) -> list[shadow_pb2.BatchRejection]:
    """The `BatchRejection` of each refused request (a loop over refused requests only)."""
    return [
        rejection(
            r.index, r.field, RejectionReason(r.reason).value, validator_text(r.field, r.message)
        )
        for r in refusals
    ]


def batch_ack_of(result: BatchResult, sequence: int = 0) -> shadow_pb2.BatchAck:
    """The `BatchAck` of what ingest made of one batch."""
    return batch_ack(
        result.accepted, result.shed, result.rejected, rejections_of(result.rejections), sequence
    )


def whole_refusal(exc: UnderstudyError, reason: RejectionReason | None = None) -> Refusal:
    """The field and reason of a batch refused whole (the error's, or `reason`)."""
    refusal = refusal_of(exc) or Refusal("", RejectionReason.INVALID_VALUE)
    return Refusal(refusal.field, reason or refusal.reason)


def batch_ack(
    accepted: int,
    shed: int,
    rejected: int,
    rejections: list[shadow_pb2.BatchRejection],
    sequence: int = 0,
    *,
    status: int | None = None,
    whole_batch: bool = False,
) -> shadow_pb2.BatchAck:
    """The ack of one batch (unary calls: sequence 0)."""
    return shadow_pb2.BatchAck(
        status=batch_status(shed, rejected) if status is None else status,  # type: ignore[arg-type]
        sequence=sequence,
        accepted=accepted,
        shed=shed,
        rejected=rejected,
        rejections=rejections,
        whole_batch=whole_batch,
    )


class BatchStreamProgress(AckPipe[shadow_pb2.BatchStreamAck]):
    """Progress of a stream of batches, acked by `BatchStreamAck` (see the module doc)."""

    def __init__(self, idle_close_s: float | None = None) -> None:
        super().__init__(idle_close_s)
        self.accepted = 0
        self.shed = 0
        self.rejected = 0
        self._uncounted_accepted = 0  # in wholly accepted batches not yet covered by an ack

    def record(
        self,
        sequence: int,
        accepted: int,
        shed: int,
        rejected: int,
        rejections: list[shadow_pb2.BatchRejection] | None = None,
        *,
        status: int | None = None,
        whole_batch: bool = False,
    ) -> None:
        """Record the fate of batch `sequence`: its request counts and its rejections.

        `status` overrides the one the counts give (REPEATED_SEQUENCE); a batch
        that is not wholly accepted gets its own ack.
        """
        with self._lock:
            self.accepted += accepted
            self.shed += shed
            self.rejected += rejected
            individual = None
            if status is None and not shed and not rejected:
                self._uncounted_accepted += accepted
            else:
                ack = batch_ack(
                    accepted,
                    shed,
                    rejected,
                    rejections or [],
                    sequence,
                    status=status,
                    whole_batch=whole_batch,
                )
                individual = self._wrap(ack)
            self._advance_locked(individual, sequence)

    def _cumulative_locked(self) -> shadow_pb2.BatchStreamAck:
        accepted, self._uncounted_accepted = self._uncounted_accepted, 0
        return self._wrap(batch_ack(accepted, 0, 0, [], self._through, status=_ACCEPTED))

    def _wrap(self, ack: shadow_pb2.BatchAck) -> shadow_pb2.BatchStreamAck:
        ack.stream_accepted = self.accepted
        ack.stream_shed = self.shed
        ack.stream_rejected = self.rejected
        return shadow_pb2.BatchStreamAck(ack=ack)


class BatchWire:
    """Decoders and stream lanes of the four batch RPCs, over one `Ingest`."""

    def __init__(self, ingest: Ingest, metrics: ServiceMetrics) -> None:
        self._ingest = ingest
        self._metrics = metrics

    def mirror_decoder(
        self, raw: bytes, what: str, limit: int
    ) -> Callable[[], tuple[DecodedBatch, bytes]]:
        """The decode thunk of a unary `MirrorMany` body (journaled as received)."""

        def decode() -> tuple[DecodedBatch, bytes]:
            msg = batch_pb2.MirrorBatch()
            parse_message(msg, raw, what, limit)
            return decoded_requests(msg, self._ingest.limits), raw

        return decode

    def outcome_decoder(
        self, raw: bytes, what: str, limit: int
    ) -> Callable[[], tuple[DecodedOutcomes, bytes]]:
        """The decode thunk of a unary `ReportOutcomes` body."""

        def decode() -> tuple[DecodedOutcomes, bytes]:
            msg = batch_pb2.OutcomeBatch()
            parse_message(msg, raw, what, limit)
            return decoded_outcomes(msg, self._ingest.limits), raw

        return decode

    def mirror_lane(self, limit: int, progress: BatchStreamProgress) -> BatchLane:
        """The lane of one `MirrorManyStream`."""
        ingest = self._ingest

        def open_envelope(raw: bytes) -> Opened:
            sequence, msg, payload, unread = _open(
                raw, limit, shadow_pb2.MirrorBatchStreamRequest, batch_pb2.MirrorBatch
            )

            def decode() -> tuple[DecodedBatch, bytes]:
                _check_opened(msg, payload, unread)
                return decoded_requests(msg, ingest.limits), payload

            return (
                sequence,
                _size(msg, unread),
                lambda: ingest.mirror_batch(GRPC_BATCH_STREAM, decode),
            )

        return BatchLane("mirror", open_envelope, progress, ingest, self._metrics)

    def outcome_lane(self, limit: int, progress: BatchStreamProgress) -> BatchLane:
        """The lane of one `ReportOutcomesStream`."""
        ingest = self._ingest

        def open_envelope(raw: bytes) -> Opened:
            sequence, msg, payload, unread = _open(
                raw, limit, shadow_pb2.OutcomeBatchStreamRequest, batch_pb2.OutcomeBatch
            )

            def decode() -> tuple[DecodedOutcomes, bytes]:
                _check_opened(msg, payload, unread)
                return decoded_outcomes(msg, ingest.limits), payload

            return (
                sequence,
                _size(msg, unread),
                lambda: ingest.outcome_batch(GRPC_BATCH_STREAM, decode),
            )

        return BatchLane("outcome", open_envelope, progress, ingest, self._metrics)


def _open(
    raw: bytes, limit: int, envelope_type: Any, batch_type: Any
) -> tuple[int, Any, bytes, MalformedMessage | None]:
    """Read a batch stream message: its sequence, its batch, the batch's bytes as sent
    (journaled unchanged), and why the batch could not be parsed, if it could not.

    The framing is read first (`split_envelope`): a batch that does not parse is
    refused under the message's own sequence. Raises `InvalidInput` only when the
    message itself is unreadable (refused under sequence 0) or too large.
    """
    parse_limit = limit + ENVELOPE_BYTES
    split = split_envelope(raw) if len(raw) <= parse_limit else None
    if split is None:  # another layout (or too large): parse it whole
        envelope = envelope_type()
        parse_message(envelope, raw, "message", parse_limit)
        payload = embedded_payload(raw) or envelope.batch.SerializeToString()
        return (
            envelope.sequence,
            envelope.batch if envelope.HasField("batch") else None,
            payload,
            None,
        )
    sequence, body = split
    if body is None:
        return sequence, None, b"", None
    msg = batch_type()
    try:
        msg.ParseFromString(body)
    except DecodeError as exc:
        return (
            sequence,
            None,
            body,
            MalformedMessage("batch", f"is not a valid protobuf message: {exc}"),
        )
    return sequence, msg, body, None


def _check_opened(msg: Any, payload: bytes, unread: MalformedMessage | None) -> None:
    # here, not in _open: the message has a sequence, so it is refused under it
    if unread is not None:
        raise unread
    if msg is None:
        raise MissingField("batch", "is required in every stream message")


def _size(msg: Any, unread: MalformedMessage | None) -> int:
    return stated_size(msg) if msg is not None and unread is None else 0


class BatchLane:
    """A batch stream as the servicer's stream driver sees it (`streams.Lane`)."""

    transport = GRPC_BATCH_STREAM

    def __init__(
        self,
        kind: str,
        open_envelope: Callable[[bytes], Opened],
        progress: BatchStreamProgress,
        ingest: Ingest,
        metrics: ServiceMetrics,
    ) -> None:
        self.kind = kind
        self.open = open_envelope
        self.progress = progress
        self._ingest = ingest
        self._metrics = metrics

    def accept(self, sequence: int, result: BatchResult) -> None:
        """Record a batch ingest read: its counts and rejections (counted by ingest)."""
        rejections = rejections_of(result.rejections)
        for r in rejections:  # a loop over the refused requests only
            self._metrics.grpc_stream_refusals.labels(self.kind, r.reason).inc()
        self.progress.record(sequence, result.accepted, result.shed, result.rejected, rejections)

    def refuse(
        self,
        sequence: int,
        exc: UnderstudyError,
        size: int,
        *,
        counted: bool,
        status: int = _REJECTED,
    ) -> None:
        """Ack batch `sequence` refused whole: every one of its `size` requests rejected,
        one rejection at index 0 naming the field and why."""
        repeated = status == shadow_pb2.ACK_STATUS_REPEATED_SEQUENCE
        refusal = whole_refusal(exc, RejectionReason.REPEATED_SEQUENCE if repeated else None)
        if not counted and isinstance(exc, InvalidInput):
            n = max(size, 1)  # as ingest counts a batch refused whole: one when unknown
            self._metrics.ingest.labels(self.transport, self.kind, "rejected").inc(n)
            self._metrics.rejections.labels(self.transport, self.kind, field_label(exc.field)).inc(
                n
            )
        self._metrics.grpc_stream_refusals.labels(self.kind, refusal.reason.value).inc()
        text = (
            validator_text(refusal.field, exc.problem)
            if isinstance(exc, InvalidInput)
            else str(exc)
        )
        self.progress.record(
            sequence,
            0,
            0,
            size,
            [rejection(0, refusal.field, refusal.reason.value, text)],
            status=status,
            whole_batch=True,
        )
