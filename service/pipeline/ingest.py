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
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from service.contract import InvalidInput, MirrorRequest, Outcome, RequestLimits
from service.contract.validation import validate_outcome, validate_request
from service.metrics import ServiceMetrics, field_label
from service.pipeline.journal import NO_SPACE, IngestJournal
from service.pipeline.journal_format import JournalClosed, JournalIOError, RecordKind


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
        self, journal: IngestJournal, metrics: ServiceMetrics, limits: RequestLimits
    ) -> None:
        self._journal = journal
        self._metrics = metrics
        self._limits = limits
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

        Raises:
            InvalidInput: the request was refused (already counted).
        """
        started = time.perf_counter()
        try:
            request, payload = decode()
            validate_request(request, self._limits)
        except InvalidInput as exc:
            self.count_rejection(transport, "mirror", exc)
            raise
        return self._append(
            transport,
            "mirror",
            RecordKind.MIRROR,
            request.request_id,
            payload,
            started,
            request if canonical else None,
        )

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
        return self._append(
            transport, "outcome", RecordKind.OUTCOME, outcome.request_id, payload, started
        )

    def count_rejection(self, transport: str, kind: str, exc: InvalidInput) -> None:
        """Count a refused input by transport, kind and (normalised) field."""
        self._metrics.ingest.labels(transport, kind, AckStatus.REJECTED.value).inc()
        self._metrics.rejections.labels(transport, kind, field_label(exc.field)).inc()

    def _append(
        self,
        transport: str,
        kind: str,
        record_kind: RecordKind,
        request_id: str,
        payload: bytes,
        started: float,
        decoded: object = None,
    ) -> IngestResult:
        reason = ShedReason.JOURNAL_FULL
        try:
            seq = self._journal.append(record_kind, payload, decoded)
        except JournalIOError as exc:  # logged by the journal, shown by its readiness check
            seq = None
            reason = ShedReason.DISK_FULL if exc.errno in NO_SPACE else ShedReason.JOURNAL_ERROR
        except JournalClosed:  # shutting down: the client resends elsewhere or later
            seq = None
            reason = ShedReason.JOURNAL_ERROR
        status = AckStatus.ACCEPTED if seq is not None else AckStatus.SHED
        if seq is None:
            self._metrics.sheds.labels(transport, kind, reason.value).inc()
        key = (transport, kind, status.value)
        counter = self._counted.get(key)
        if counter is None:
            counter = self._counted[key] = self._metrics.ingest.labels(*key)
        counter.inc()
        timer = self._timed.get(transport)
        if timer is None:
            timer = self._timed[transport] = self._metrics.ack_latency.labels(transport)
        timer.observe(time.perf_counter() - started)
        return IngestResult(status, request_id, seq)
