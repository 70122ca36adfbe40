"""The scorer: journal -> micro-batches -> every active policy -> decision log.

Runs on its own thread behind the journal, so nothing here can slow an ack.
Batches adapt by themselves: each step takes whatever is waiting, up to
`max_batch` records — one request when traffic is light, full batches under
load. The journal checkpoint advances only after the sink (the decision log)
has committed the batch; a sink outage is retried with backoff while the
journal absorbs traffic, and a crash replays from the last checkpoint (the
log's writes are idempotent, so replays never duplicate).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from google.protobuf.message import DecodeError

from service.contract import FeatureFunction, InvalidInput, MirrorRequest, Outcome
from service.contract.errors import Unavailable
from service.pipeline.dead_letter import DeadLetter, DeadLetterBox
from service.pipeline.journal import IngestJournal
from service.pipeline.journal_format import JournalRecord, RecordKind
from service.pipeline.quarantine import Quarantine
from service.pipeline.scoring import REFERENCE_BATCH, ScoredDecision, score_requests
from service.policies.base import DecisionStatus, Policy, ScoringBatch
from service.policies.runner import PolicyRun
from service.wire.convert import mirror_request_from_pb, outcome_from_pb
from service.wire.understudy.v1 import contract_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class LoggedRequest:
    """An accepted request as the log stores it: raw payload kept for replay."""

    seq: int
    request: MirrorRequest
    payload: bytes
    received_at: float


@dataclass(frozen=True, eq=False)
class LoggedOutcome:
    """An accepted outcome report."""

    seq: int
    outcome: Outcome
    received_at: float
    payload: bytes = b""


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
    """The contract object of a journal record (validated at ingest already).

    Ingest's own decoding of the payload is reused when the journal still holds
    it (`JournalRecord.decoded`); otherwise the bytes are decoded here.
    """
    if record.kind == RecordKind.MIRROR:
        if isinstance(record.decoded, MirrorRequest):
            return record.decoded
        return mirror_request_from_pb(contract_pb2.MirrorRequest.FromString(record.payload))
    return outcome_from_pb(contract_pb2.Outcome.FromString(record.payload))


class Scorer:
    """Consumes the journal on a background thread."""

    CONSUMER = "scorer"

    def __init__(
        self,
        journal: IngestJournal,
        active_policies: Callable[[], Sequence[Policy]],
        sink: DecisionSink,
        observer: ScorerObserver,
        features: FeatureFunction,
        config: ScorerConfig | None = None,
        quarantine: Quarantine | None = None,
        dead_letters: DeadLetterBox | None = None,
    ) -> None:
        self.dead_letters = dead_letters
        self.quarantine = quarantine or Quarantine()
        self._journal = journal
        self._policies = active_policies
        self._sink = sink
        self._observer = observer
        self.on_scored: Callable[[ScoringBatch, list[ScoredDecision]], None] | None = None
        self._features = features
        self._config = config or ScorerConfig()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sink_healthy = True
        self.sink_error: str | None = None

    def step(self) -> int:
        """Score and log one batch; returns the number of journal records consumed."""
        records = self._journal.read(self.CONSUMER, self._config.max_batch)
        if not records:
            return 0
        requests: list[LoggedRequest] = []
        outcomes: list[LoggedOutcome] = []
        for record in records:
            try:
                item = decode(record)
            except (DecodeError, InvalidInput) as exc:  # validated at ingest: should not happen
                log.error("journal record %s is undecodable, skipped: %s", record.seq, exc)
                continue
            if isinstance(item, MirrorRequest):
                requests.append(LoggedRequest(record.seq, item, record.payload, record.appended_at))
            else:
                outcomes.append(LoggedOutcome(record.seq, item, record.appended_at, record.payload))
        policies = [p for p in self._policies() if self.quarantine.is_active(str(p.name))]
        decisions: list[ScoredDecision] = []
        runs: list[PolicyRun] = []
        if requests and policies:
            scored, decisions, runs = score_requests(
                [r.request for r in requests], policies, self._features, self._config.budgets_s
            )
            scale = max(1.0, len(requests) / REFERENCE_BATCH)
            for run in runs:
                self.quarantine.record(run.policy, self._strike(run, scale))
        if self.on_scored is not None and decisions:  # drift (service.pipeline.drift_monitor)
            self.on_scored(scored, decisions)
        self._observer.on_batch(len(requests), runs, decisions)
        batch = ScoredBatch(
            requests=requests,
            outcomes=outcomes,
            decisions=decisions,
            policies=policies,
            feature_version=self._features.version,
            feature_hash=self._features.definition_hash,
            last_seq=records[-1].seq,
        )
        if not self._write_until_committed(batch):
            return 0
        self._journal.commit(self.CONSUMER, batch.last_seq)
        return len(records)

    def _strike(self, run: PolicyRun, scale: float) -> str | None:
        """The failure that counts towards quarantine, if any (see `timeout_strike_factor`)."""
        if run.error is None:
            return None
        if DecisionStatus.TIMEOUT not in run.decisions.status:
            return run.error
        budget = self._config.budgets_s.get(run.policy)
        limit = self._config.timeout_strike_factor * budget * scale if budget else 0.0
        return run.error if run.latency_s > limit else None

    def _write_until_committed(self, batch: ScoredBatch) -> bool:
        delay = self._config.retry_initial_s
        refusals = 0
        while True:
            started = time.perf_counter()
            try:
                result = self._sink.write(batch)
            except Unavailable as exc:
                self.sink_healthy, self.sink_error = False, str(exc)
                self._observer.on_write(time.perf_counter() - started, None, str(exc))
                log.warning("decision log unavailable, retrying in %.2fs: %s", delay, exc)
                if self._stop.wait(delay):
                    return False
                delay = min(delay * 2, self._config.retry_max_s)
                continue
            except Exception as exc:  # refused for its content: retried, then bisected
                refusals += 1
                self._observer.on_write(time.perf_counter() - started, None, str(exc))
                log.error(
                    "decision log refused a batch (%d/%d): %s",
                    refusals,
                    self._config.poison_attempts,
                    exc,
                )
                if refusals < self._config.poison_attempts or self.dead_letters is None:
                    if self._stop.wait(delay):
                        return False
                    delay = min(delay * 2, self._config.retry_max_s)
                    continue
                return self._bisect(batch, f"{type(exc).__name__}: {exc}")
            self.sink_healthy, self.sink_error = True, None
            self._observer.on_write(time.perf_counter() - started, result, None)
            return True

    def _bisect(self, batch: ScoredBatch, reason: str) -> bool:
        """Commit every record the log accepts; dead-letter the ones it refuses alone."""
        items: list[LoggedRequest | LoggedOutcome] = [*batch.requests, *batch.outcomes]
        pending = [items]
        while pending:
            part = pending.pop()
            sub = self._sub_batch(batch, part)
            try:
                result = self._sink.write(sub)
            except Unavailable:
                return False  # an outage after all: retry the whole batch later
            except Exception as exc:
                if len(part) == 1:
                    self._dead_letter(part[0], f"{type(exc).__name__}: {exc}")
                    continue
                half = len(part) // 2
                pending += [part[:half], part[half:]]
                continue
            self._observer.on_write(0.0, result, None)
        log.error("batch ending at seq %d bisected after refusals: %s", batch.last_seq, reason)
        return True

    def _sub_batch(
        self, batch: ScoredBatch, part: list[LoggedRequest | LoggedOutcome]
    ) -> ScoredBatch:
        requests = [p for p in part if isinstance(p, LoggedRequest)]
        ids = {r.request.request_id for r in requests}
        return ScoredBatch(
            requests=requests,
            outcomes=[p for p in part if isinstance(p, LoggedOutcome)],
            decisions=[d for d in batch.decisions if d.request_id in ids],
            policies=batch.policies,
            feature_version=batch.feature_version,
            feature_hash=batch.feature_hash,
            last_seq=batch.last_seq,
        )

    def _dead_letter(self, item: LoggedRequest | LoggedOutcome, reason: str) -> None:
        assert self.dead_letters is not None
        if isinstance(item, LoggedRequest):
            letter = DeadLetter(item.seq, "mirror", item.request.request_id, item.payload, reason)
        else:
            letter = DeadLetter(item.seq, "outcome", item.outcome.request_id, item.payload, reason)
        path = self.dead_letters.put(letter)
        self._observer.on_dead_letter(letter.kind)
        log.error(
            "journal record %d (%s) dead-lettered to %s: %s",
            item.seq,
            letter.request_id,
            path,
            reason,
        )

    def run(self) -> None:
        """Loop until stopped: wait for records, let a batch fill (briefly), step."""
        lingered = False
        while not self._stop.is_set():
            depth = self._journal.depth_records(self.CONSUMER)
            if depth == 0:
                self._journal.wait_for_records(self.CONSUMER, self._config.idle_wait_s)
                continue
            if depth < self._config.min_batch and not lingered and self._config.linger_s > 0:
                lingered = True
                self._stop.wait(self._config.linger_s)
                continue
            lingered = False
            try:
                self.step()
            except Exception:  # the loop must survive anything a batch throws
                log.exception("scorer step failed; retrying")
                self._stop.wait(self._config.retry_initial_s)

    def start(self) -> None:
        """Start the background thread."""
        self._thread = threading.Thread(target=self.run, name="scorer", daemon=True)
        self._thread.start()

    def stop(self, drain_timeout_s: float = 5.0) -> None:
        """Finish what is journaled (up to a deadline), then stop the thread."""
        deadline = time.monotonic() + drain_timeout_s
        while (
            self.sink_healthy
            and self._journal.depth_records(self.CONSUMER) > 0
            and time.monotonic() < deadline
        ):
            time.sleep(0.02)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(drain_timeout_s + 5)
