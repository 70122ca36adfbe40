"""What the scorer exchanges: logged items, the batch it writes, its sink, observer and knobs.

Kept apart from the loop (`service.pipeline.scorer`, which re-exports every
name here) so the scorer thread and the scorer process
(`service.pipeline.scorer_process`) share one definition of each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from service.contract import MirrorRequest, Outcome
from service.pipeline import batch_record
from service.pipeline.feasibility_log import LoggedFeasibility
from service.pipeline.journal_format import JournalRecord, RecordKind
from service.pipeline.scoring import ScoredDecision
from service.policies.base import Policy
from service.policies.runner import PolicyRun
from service.wire.convert import (
    mirror_request_from_pb,
    mirror_request_to_pb,
    outcome_from_pb,
    outcome_to_pb,
    state_to_pb,
)
from service.wire.understudy.v1 import contract_pb2


@dataclass(frozen=True, eq=False)
class LoggedRequest:
    """An accepted request as the log stores it: raw payload kept for replay.

    A request of a batch record (`RecordKind.MIRROR_BATCH`) shares its record's
    ``seq``; ``row`` is its row in the batch, and ``payload`` its own
    single-request ``MirrorRequest`` protobuf (what the log keeps and a reviewer
    replays), ``digest`` its identity digest as ingest computed it.
    """

    seq: int
    request: MirrorRequest
    payload: bytes
    received_at: float
    digest: bytes | None = None
    """`content_sha256` of the request when ingest journaled it (None: compute it)."""
    row: int | None = None
    """Row in its batch record (None: a single-request record)."""

    @property
    def key(self) -> int | tuple[int, int]:
        """Unique within a scored batch: the seq, or (seq, row) for a batch record's request."""
        return self.seq if self.row is None else (self.seq, self.row)


@dataclass(frozen=True, eq=False)
class LoggedOutcome:
    """An accepted outcome report (``row``: its row in a batch record, else None)."""

    seq: int
    outcome: Outcome
    received_at: float
    payload: bytes = b""
    row: int | None = None


@dataclass(frozen=True, eq=False)
class ScoredBatch:
    """Everything one scorer step hands to the decision log, in one transaction."""

    requests: list[LoggedRequest]
    outcomes: list[LoggedOutcome]
    decisions: list[ScoredDecision]
    policies: list[Policy]
    feature_version: str
    feature_hash: str
    last_seq: int
    feasibility: LoggedFeasibility | None = None
    """The requests' per-option feasibility bits, from the scoring pass (None: not known)."""


@dataclass(frozen=True)
class SinkResult:
    """What the sink inserted, and what it found already there (replays)."""

    requests_inserted: int = 0
    decisions_inserted: int = 0
    outcomes_joined: int = 0
    outcomes_parked: int = 0
    outcomes_joined_from_parked: int = 0
    duplicates: int = 0
    outcome_delays_s: tuple[float, ...] = ()
    request_conflicts: int = 0  # same (request_id, request_time), other content: kept aside


class DecisionSink(Protocol):
    """Where scored batches go; the storage layer implements it."""

    def write(self, batch: ScoredBatch) -> SinkResult:
        """Commit `batch` atomically; raise `Unavailable` when the store is down."""
        ...


class ScorerObserver(Protocol):
    """Metrics hooks; `ServiceMetrics` implements them."""

    def on_batch(
        self, size: int, runs: Sequence[PolicyRun], decisions: Sequence[ScoredDecision]
    ) -> None:
        """A batch was scored."""
        ...

    def on_write(self, seconds: float, result: SinkResult | None, error: str | None) -> None:
        """A write attempt finished (result None on failure)."""
        ...

    def on_dead_letter(self, kind: str) -> None:
        """A record was refused alone and set aside."""
        ...


@dataclass
class ScorerConfig:
    """Tuning knobs of the scorer loop."""

    max_batch: int = 256
    idle_wait_s: float = 0.2
    min_batch: int = 64
    """Below this many waiting records the loop lingers (up to `linger_s`) for more: a
    16-request batch costs the scorer ~1.5x per request what a 64-request one does, a
    single request ~4x, so lone records are not scored the moment they arrive."""
    linger_s: float = 0.02
    """Longest wait for a batch to fill; decisions are logged at most this much later.
    The ack never waits for the scorer, so this delays only the decision log."""
    retry_initial_s: float = 0.1
    retry_max_s: float = 5.0
    poison_attempts: int = 3
    timeout_strike_factor: float = 3.0
    """A timed-out batch counts towards quarantine only beyond this multiple of its
    budget: wall time in a threaded Python process jitters (GIL, preemption), and a
    2x spike is a flagged `timeout`, not a broken policy; a 10x one is."""
    budgets_s: dict[str, float] = field(default_factory=dict)


def decode(record: JournalRecord) -> MirrorRequest | Outcome:
    """The contract object of a single-request journal record (validated at ingest already).

    Ingest's own decoding of the payload is reused when the journal still holds
    it (`JournalRecord.decoded`); otherwise the bytes are decoded here. A batch
    record holds many: see `logged_items`.
    """
    if record.kind == RecordKind.MIRROR:
        if isinstance(record.decoded, MirrorRequest):
            return record.decoded
        return mirror_request_from_pb(contract_pb2.MirrorRequest.FromString(record.payload))
    if record.kind == RecordKind.OUTCOME:
        return outcome_from_pb(contract_pb2.Outcome.FromString(record.payload))
    raise ValueError(f"journal record {record.seq} is a batch ({record.kind.name}): logged_items")


def _payloads(requests: list[MirrorRequest]) -> list[bytes]:
    """Each request's single-request protobuf; a snapshot the requests share (the same
    `ClusterState`, as `RequestBatch.requests` gives them) is converted once."""
    states: dict[int, contract_pb2.ClusterState] = {}
    out = []
    for request in requests:
        state = states.get(id(request.state))
        if state is None:
            state = states[id(request.state)] = state_to_pb(request.state)
        out.append(mirror_request_to_pb(request, state).SerializeToString())
    return out


def logged_items(record: JournalRecord) -> list[LoggedRequest] | list[LoggedOutcome]:
    """What one journal record logs: one request or outcome, or a batch record's accepted ones.

    A batch record's requests keep the record's seq and carry their row, their
    digest (from the record: not computed again) and their own single-request
    protobuf as payload, so the log, replay and dead letters see exactly the
    records a single-request ingest would have journaled.

    Raises:
        DecodeError, InvalidInput, BatchRecordCorrupt: the record does not decode.
    """
    kind, seq, at = record.kind, record.seq, record.appended_at
    if kind == RecordKind.MIRROR_BATCH:
        held = batch_record.unpack(record.payload, RecordKind.MIRROR_BATCH)
        digests = held.digests
        assert digests is not None  # unpack checks a mirror batch record carries them
        rows = held.rows.tolist()
        requests = batch_record.requests_of(held, record.decoded)
        return [
            LoggedRequest(seq, request, payload, at, digests[i].tobytes(), rows[i])
            for i, (request, payload) in enumerate(zip(requests, _payloads(requests), strict=True))
        ]
    if kind == RecordKind.OUTCOME_BATCH:
        held = batch_record.unpack(record.payload, RecordKind.OUTCOME_BATCH)
        rows = held.rows.tolist()
        return [
            LoggedOutcome(seq, outcome, at, outcome_to_pb(outcome).SerializeToString(), rows[i])
            for i, outcome in enumerate(batch_record.outcomes_of(held))
        ]
    item = decode(record)
    if isinstance(item, MirrorRequest):
        return [LoggedRequest(seq, item, record.payload, at)]
    return [LoggedOutcome(seq, item, at, record.payload)]


class StopSignal(Protocol):
    """A `threading.Event` or a `multiprocessing` one (the child's retries end on either)."""

    def is_set(self) -> bool:
        """Whether stopping was asked for."""
        ...

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to `timeout`; True when stopping was asked for."""
        ...

    def set(self) -> None:
        """Ask for stopping."""
        ...


class BatchHandler(Protocol):
    """Where the journal loop hands each batch: a `BatchScorer` here, or a scorer process."""

    @property
    def sink_healthy(self) -> bool:
        """False while the decision log is unavailable (readiness)."""
        ...

    @property
    def sink_error(self) -> str | None:
        """The last outage's error, None while writes succeed."""
        ...

    def score_and_write(self, records: Sequence[JournalRecord]) -> bool:
        """Score and log `records`; True once committed, False when stopped first."""
        ...

    def open(self) -> None:
        """Get ready (start a child process, or nothing)."""
        ...

    def idle(self) -> None:
        """Called by the loop while the journal is empty (restart a dead scorer process)."""
        ...

    def interrupt(self) -> None:
        """Stop retrying: the loop is stopping."""
        ...

    def close(self) -> None:
        """Release what `open` took."""
        ...
