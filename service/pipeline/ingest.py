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
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from service.contract import InvalidInput, MirrorRequest, Outcome, RequestLimits
from service.contract.errors import ConflictingRequest
from service.contract.identity import content_sha256
from service.contract.validation import validate_outcome, validate_request
from service.metrics import ServiceMetrics, field_label
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
                request.request_id,
                f"{request.request_id[:80]!r} was already sent with other content: one id "
                "names one request; re-send it unchanged, or give a changed request a new id",
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
        key = (transport, kind, status.value)
        counter = self._counted.get(key)
        if counter is None:
            counter = self._counted[key] = self._metrics.ingest.labels(*key)
        counter.inc()
        timer = self._timed.get(transport)
        if timer is None:
            timer = self._timed[transport] = self._metrics.ack_latency.labels(transport)
        timer.observe(time.perf_counter() - started)
