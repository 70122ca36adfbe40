"""Ingest: validate, append to the journal, ack. Nothing else on the ack path.

This is the one engine both transports delegate to (the MLServer shape): a
transport hands over a *decode* thunk that turns its bytes into a contract
object plus the canonical payload to journal, so that every rejection — a
malformed protobuf, bad JSON, a failed contract rule — is counted here, by
field, in one place. Scoring and logging happen behind the journal; the ack
latency therefore does not depend on policy count, model speed or database
health (ARCHITECTURE.md, non-negotiable 2).

A journal that cannot take a record -- at its bound, or its disk full, or any
write failing -- sheds it: the client is told "shed" (the answer it already
handles and may retry), never an internal error or a file path, and the shed is
counted by reason, so accepted + shed + rejected = received holds through a
disk failure too.

``request_id`` is a request's identity (docs/ingest.md, "Identity"): a bounded
`RequestIndex` of recent ids and their content digests answers a re-send at
ack time. The same content again is a duplicate, acked ACCEPTED without being
journaled a second time; other content under a known id is refused with
`ConflictingRequest` (naming ``request_id``) and counted. What the index does
not know is caught by the decision-log writer.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from service.contract import InvalidInput, MirrorRequest, Outcome, RequestLimits
from service.contract.batch import OutcomeColumns, RequestBatch
from service.contract.batch.identity import request_digests
from service.contract.batch.validation import (
    IndexedRefusal,
    validate_batch,
    validate_outcome_batch,
)
from service.contract.errors import ConflictingRequest
from service.contract.identity import content_sha256
from service.contract.rejections import RejectionReason
from service.contract.validation import validate_outcome, validate_request
from service.metrics import ServiceMetrics, field_label
from service.pipeline import batch_record
from service.pipeline.journal import NO_SPACE, IngestJournal
from service.pipeline.journal_format import JournalClosed, JournalIOError, RecordKind
from service.pipeline.request_index import RequestIndex, Seen


class AckStatus(StrEnum):
    """What an ack may say. Never a decision."""

    ACCEPTED = "accepted"
    SHED = "shed"
    REJECTED = "rejected"


class ShedReason(StrEnum):
    """Why a message was shed: the bounded label set of `understudy_ingest_sheds`."""

    JOURNAL_FULL = "journal_full"  # the bound on unconsumed bytes (the scorer is behind)
    DISK_FULL = "disk_full"  # no space (or quota) left on the journal's disk
    JOURNAL_ERROR = "journal_error"  # any other write, fsync or segment-creation failure


@dataclass(frozen=True, slots=True)
class IngestResult:
    """The result of one ingest call: its status, echoed id and journal sequence."""

    status: AckStatus
    request_id: str
    journal_seq: int | None


MirrorDecoder = Callable[[], tuple[MirrorRequest, bytes]]
OutcomeDecoder = Callable[[], tuple[Outcome, bytes]]


class DecodedRequests(Protocol):
    """What a batch decoder hands over (`service.wire.batch_codec.DecodedBatch`)."""

    @property
    def batch(self) -> RequestBatch:
        """The requests that decoded, in columns."""
        ...

    @property
    def index(self) -> NDArray[np.int64]:
        """Position in what was sent of each row of `batch`."""
        ...

    @property
    def refusals(self) -> tuple[IndexedRefusal, ...]:
        """Requests refused while decoding (their positions in what was sent)."""
        ...

    @property
    def n_sent(self) -> int:
        """Requests sent."""
        ...


class DecodedOutcomeRows(Protocol):
    """What an outcome batch decoder hands over (`service.wire.batch_codec.DecodedOutcomes`)."""

    @property
    def outcomes(self) -> OutcomeColumns:
        """The outcomes that decoded, in columns."""
        ...

    @property
    def index(self) -> NDArray[np.int64]:
        """Position in what was sent of each row of `outcomes`."""
        ...

    @property
    def refusals(self) -> tuple[IndexedRefusal, ...]:
        """Outcomes refused while decoding."""
        ...

    @property
    def n_sent(self) -> int:
        """Outcomes sent."""
        ...


MirrorBatchDecoder = Callable[[], tuple[DecodedRequests, bytes]]
"""Returns the decoded batch and the `MirrorBatch` protobuf bytes to journal."""
OutcomeBatchDecoder = Callable[[], tuple[DecodedOutcomeRows, bytes]]
"""Returns the decoded outcomes and the `OutcomeBatch` protobuf bytes to journal."""


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What became of each request of one batch; accepted + shed + rejected == sent.

    ``duplicates`` (re-sends acked without a new record) are counted in
    ``accepted`` too. ``rejections`` name each rejected request by its position
    in what was sent, sorted; ``journal_seq`` is the one record holding the
    accepted part (None when nothing new was journaled).
    """

    accepted: int
    shed: int
    rejected: int
    duplicates: int
    rejections: tuple[IndexedRefusal, ...]
    journal_seq: int | None
    shed_reason: ShedReason | None = None
    """Why the batch's new requests were shed (None when none were)."""

    @property
    def sent(self) -> int:
        """Requests in the batch."""
        return self.accepted + self.shed + self.rejected


def _request_digests(batch: RequestBatch, rows: NDArray[np.intp]) -> NDArray[np.uint8]:
    """The identity digests of the valid `rows` of `batch`, (len(rows), 32).

    One pass over the whole batch (`request_digests`: a row's digest depends on
    that row alone). A refused row may hold what the columnar encoder cannot
    index (a ``state_index`` out of range, say); only then are the valid rows
    hashed one by one, as single requests (the same digest, by definition).
    """
    if len(rows) == batch.n_requests:
        return request_digests(batch)
    try:
        return request_digests(batch)[rows]
    except (IndexError, ValueError):  # a refused row the encoder cannot read
        out = np.empty((len(rows), 32), dtype=np.uint8)
        for i, request in enumerate(batch.requests(rows.tolist())):
            out[i] = np.frombuffer(content_sha256(request), dtype=np.uint8)
        return out


CONFLICT_MESSAGE = (
    "was already sent with other content: one id names one request; re-send it "
    "unchanged, or give a changed request a new id"
)


class Ingest:
    """Validates and journals mirrored requests and outcomes."""

    def __init__(
        self,
        journal: IngestJournal,
        metrics: ServiceMetrics,
        limits: RequestLimits,
        index: RequestIndex | None = None,
    ) -> None:
        self._journal = journal
        self._metrics = metrics
        self._limits = limits
        self.index = index if index is not None else RequestIndex()
        """Recent request ids and their content digests (public: startup fills it)."""
        # labelled children, looked up once: `labels()` costs microseconds on every ack
        self._counted: dict[tuple[str, str, str], Any] = {}
        self._timed: dict[str, Any] = {}

    @property
    def limits(self) -> RequestLimits:
        """The size limits requests are held to (batch decoders read them too)."""
        return self._limits

    def mirror(
        self, transport: str, decode: MirrorDecoder, *, canonical: bool = False
    ) -> IngestResult:
        """Decode, validate and journal one mirrored request.

        `canonical` says the decoded request is exactly what decoding the
        journaled payload gives (true where the payload is the very protobuf
        the request was built from); the journal then hands the object to the
        scorer, which skips a second decode. Otherwise the scorer decodes the
        bytes, as replay does.

        A request whose id the index knows is not journaled again: with the
        same content it is acked ACCEPTED (a duplicate, ``journal_seq`` None),
        with other content it is refused.

        Raises:
            InvalidInput: the request was refused (already counted).
            ConflictingRequest: its ``request_id`` is known with other content
                (counted here, as a rejection and a request conflict).
        """
        started = time.perf_counter()
        try:
            request, payload = decode()
            validate_request(request, self._limits)
        except InvalidInput as exc:
            self.count_rejection(transport, "mirror", exc)
            raise
        decoded = request if canonical else None
        claim = self.index.claim(
            request.request_id,
            content_sha256(request),
            lambda: self._journal_append(RecordKind.MIRROR, payload, decoded),
            lambda appended: appended[0] is not None,
        )
        if claim.seen is Seen.CONFLICT:
            self._count(transport, "mirror", AckStatus.REJECTED, started)
            self._metrics.rejections.labels(transport, "mirror", "request_id").inc()
            self._metrics.request_conflicts.labels("ingest").inc()
            raise ConflictingRequest(
                request.request_id, f"{request.request_id[:80]!r} {CONFLICT_MESSAGE}"
            )
        if claim.seen is Seen.DUPLICATE:
            self._metrics.ingest_duplicates.labels(transport).inc()
            self._count(transport, "mirror", AckStatus.ACCEPTED, started)
            return IngestResult(AckStatus.ACCEPTED, request.request_id, None)
        assert claim.appended is not None
        seq, reason = claim.appended
        return self._acked(transport, "mirror", request.request_id, seq, reason, started)

    def outcome(self, transport: str, decode: OutcomeDecoder) -> IngestResult:
        """Decode, validate and journal one outcome report.

        Raises:
            InvalidInput: the outcome was refused (already counted).
        """
        started = time.perf_counter()
        try:
            outcome, payload = decode()
            validate_outcome(outcome, self._limits)
        except InvalidInput as exc:
            self.count_rejection(transport, "outcome", exc)
            raise
        seq, reason = self._journal_append(RecordKind.OUTCOME, payload)
        return self._acked(transport, "outcome", outcome.request_id, seq, reason, started)

    def mirror_batch(self, transport: str, decode: MirrorBatchDecoder) -> BatchResult:
        """Decode, validate and journal one batch of mirrored requests; refuse by index.

        The valid requests the index does not know are journaled as ONE
        `RecordKind.MIRROR_BATCH` record (`service.pipeline.batch_record`: the
        accepted rows, their digests, and the batch bytes `decode` returned,
        unchanged). A known id with the same content is a duplicate (accepted,
        not journaled again), with other content a conflict (refused, field
        ``request_id``); so is a second copy of an id inside the batch (the
        first wins). When the journal cannot take the record, every new
        request is shed and none is remembered. Every request is counted.
        The decoded batch rides with the record in the journal's bounded
        in-memory cache, so the scorer does not parse the bytes again.

        Raises:
            InvalidInput: the batch cannot be read as requests at all (counted as
                the rejection of its requests; the transport refuses it whole).
        """
        started = time.perf_counter()
        try:
            decoded, payload = decode()
        except InvalidInput as exc:
            self._count_whole_batch(transport, "mirror", exc, started)
            raise
        batch = decoded.batch
        try:
            verdict = validate_batch(batch, self._limits)
        except InvalidInput as exc:  # columns that cannot be read into requests
            exc.n_sent = decoded.n_sent  # type: ignore[attr-defined]
            self._count_whole_batch(transport, "mirror", exc, started)
            raise
        ok_rows = np.flatnonzero(verdict.ok)
        refusals = list(decoded.refusals)
        sent_at = decoded.index
        for r in verdict.refusals:  # rows of `batch` -> positions in what was sent
            refusals.append(IndexedRefusal(int(sent_at[r.index]), r.field, r.message, r.reason))
        digests = _request_digests(batch, ok_rows)
        every_id = batch.request_id.values()  # the one str per request the index needs
        ids = list(every_id) if len(ok_rows) == len(every_id) else [every_id[r] for r in ok_rows]
        n_batch = batch.n_requests

        def append(new: NDArray[np.intp]) -> tuple[int | None, ShedReason]:
            rows = ok_rows[new]
            held = digests[new]
            body = batch_record.pack(RecordKind.MIRROR_BATCH, rows, n_batch, payload, held)
            # the batch is what decoding `payload` gives: the scorer reuses it (bounded cache)
            return self._journal_append(RecordKind.MIRROR_BATCH, body, batch)

        claim = self.index.claim_batch(
            ids, digests.tobytes(), append, lambda appended: appended[0] is not None
        )
        for c in claim.conflicts.tolist():
            request_id = ids[c]
            refusals.append(
                IndexedRefusal(
                    int(sent_at[ok_rows[c]]),
                    "request_id",
                    f"{request_id[:80]!r} {CONFLICT_MESSAGE}",
                    RejectionReason.CONFLICTING_REQUEST,
                )
            )
        seq, reason = claim.appended if claim.appended is not None else (None, None)
        carried = len(claim.new) + len(claim.repeats)  # the new ids and their repeats
        journaled = seq is not None
        duplicates = len(claim.duplicates) + (len(claim.repeats) if journaled else 0)
        accepted = len(claim.duplicates) + (carried if journaled else 0)
        shed = 0 if journaled or not len(claim.new) else carried
        refusals.sort(key=lambda r: r.index)
        result = BatchResult(
            accepted=accepted,
            shed=shed,
            rejected=len(refusals),
            duplicates=duplicates,
            rejections=tuple(refusals),
            journal_seq=seq,
            shed_reason=reason if shed else None,
        )
        self._count_batch(
            transport, "mirror", result, len(claim.conflicts), decoded.n_sent, started
        )
        return result

    def outcome_batch(self, transport: str, decode: OutcomeBatchDecoder) -> BatchResult:
        """Decode, validate and journal one batch of outcome reports; refuse by index.

        The valid outcomes are ONE `RecordKind.OUTCOME_BATCH` record (the
        accepted rows and the batch bytes as received); shed together when the
        journal cannot take it. Outcomes have no index: a re-sent outcome is
        the writer's to join once.

        Raises:
            InvalidInput: the batch cannot be read as outcomes at all (counted).
        """
        started = time.perf_counter()
        try:
            decoded, payload = decode()
        except InvalidInput as exc:
            self._count_whole_batch(transport, "outcome", exc, started)
            raise
        cols = decoded.outcomes
        try:
            verdict = validate_outcome_batch(cols, self._limits)
        except InvalidInput as exc:
            exc.n_sent = decoded.n_sent  # type: ignore[attr-defined]
            self._count_whole_batch(transport, "outcome", exc, started)
            raise
        ok_rows = np.flatnonzero(verdict.ok)
        refusals = list(decoded.refusals)
        sent_at = decoded.index
        for r in verdict.refusals:
            refusals.append(IndexedRefusal(int(sent_at[r.index]), r.field, r.message, r.reason))
        seq: int | None = None
        reason: ShedReason | None = None
        if len(ok_rows):
            body = batch_record.pack(RecordKind.OUTCOME_BATCH, ok_rows, cols.n_outcomes, payload)
            seq, reason = self._journal_append(RecordKind.OUTCOME_BATCH, body)
        refusals.sort(key=lambda r: r.index)
        journaled = seq is not None
        result = BatchResult(
            accepted=len(ok_rows) if journaled else 0,
            shed=0 if journaled else len(ok_rows),
            rejected=len(refusals),
            duplicates=0,
            rejections=tuple(refusals),
            journal_seq=seq,
            shed_reason=reason if len(ok_rows) and not journaled else None,
        )
        self._count_batch(transport, "outcome", result, 0, decoded.n_sent, started)
        return result

    def _count_whole_batch(
        self, transport: str, kind: str, exc: InvalidInput, started: float
    ) -> None:
        """A batch refused whole: each of its requests (when known; else one) is a rejection."""
        n = getattr(exc, "n_sent", None)
        n = n if isinstance(n, int) and n > 0 else 1
        self._metrics.ingest.labels(transport, kind, AckStatus.REJECTED.value).inc(n)
        self._metrics.rejections.labels(transport, kind, field_label(exc.field)).inc(n)
        self._metrics.ingest_batch_requests.labels(transport, kind).observe(n)
        self._timer(transport).observe(time.perf_counter() - started)

    def _count_batch(
        self,
        transport: str,
        kind: str,
        result: BatchResult,
        conflicts: int,
        n_sent: int,
        started: float,
    ) -> None:
        """Count a batch's requests by result, field, shed reason; one ack latency."""
        metrics = self._metrics
        for status, n in (
            (AckStatus.ACCEPTED, result.accepted),
            (AckStatus.SHED, result.shed),
            (AckStatus.REJECTED, result.rejected),
        ):
            if n:
                self._counter(transport, kind, status).inc(n)
        if result.rejected:  # a loop over the refused requests only
            by_field = Counter(field_label(r.field) for r in result.rejections)
            for label, n in by_field.items():
                metrics.rejections.labels(transport, kind, label).inc(n)
        if conflicts:
            metrics.request_conflicts.labels("ingest").inc(conflicts)
        if result.shed and result.shed_reason is not None:
            metrics.sheds.labels(transport, kind, result.shed_reason.value).inc(result.shed)
        if result.duplicates:
            metrics.ingest_duplicates.labels(transport).inc(result.duplicates)
        metrics.ingest_batch_requests.labels(transport, kind).observe(n_sent)
        self._timer(transport).observe(time.perf_counter() - started)

    def count_rejection(self, transport: str, kind: str, exc: InvalidInput) -> None:
        """Count a refused input by transport, kind and (normalised) field."""
        self._metrics.ingest.labels(transport, kind, AckStatus.REJECTED.value).inc()
        self._metrics.rejections.labels(transport, kind, field_label(exc.field)).inc()

    def _journal_append(
        self, record_kind: RecordKind, payload: bytes, decoded: object = None
    ) -> tuple[int | None, ShedReason]:
        """Journal one record: its seq, or None and why it was shed."""
        try:
            seq = self._journal.append(record_kind, payload, decoded)
        except JournalIOError as exc:  # logged by the journal, shown by its readiness check
            return None, ShedReason.DISK_FULL if exc.errno in NO_SPACE else ShedReason.JOURNAL_ERROR
        except JournalClosed:  # shutting down: the client resends elsewhere or later
            return None, ShedReason.JOURNAL_ERROR
        return seq, ShedReason.JOURNAL_FULL

    def _acked(
        self,
        transport: str,
        kind: str,
        request_id: str,
        seq: int | None,
        reason: ShedReason,
        started: float,
    ) -> IngestResult:
        status = AckStatus.ACCEPTED if seq is not None else AckStatus.SHED
        if seq is None:
            self._metrics.sheds.labels(transport, kind, reason.value).inc()
        self._count(transport, kind, status, started)
        return IngestResult(status, request_id, seq)

    def _count(self, transport: str, kind: str, status: AckStatus, started: float) -> None:
        self._counter(transport, kind, status).inc()
        self._timer(transport).observe(time.perf_counter() - started)

    def _counter(self, transport: str, kind: str, status: AckStatus) -> Any:
        key = (transport, kind, status.value)
        counter = self._counted.get(key)
        if counter is None:
            counter = self._counted[key] = self._metrics.ingest.labels(*key)
        return counter

    def _timer(self, transport: str) -> Any:
        timer = self._timed.get(transport)
        if timer is None:
            timer = self._timed[transport] = self._metrics.ack_latency.labels(transport)
        return timer
