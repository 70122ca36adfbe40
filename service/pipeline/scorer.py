"""The scorer: journal -> micro-batches -> every active policy -> decision log.

Runs on its own thread behind the journal, so nothing here can slow an ack.
Batches adapt by themselves: each step takes whatever is waiting, up to
`max_batch` records — one request when traffic is light, full batches under
load. The journal checkpoint advances only after the sink (the decision log)
has committed the batch; a sink outage is retried with backoff while the
journal absorbs traffic, and a crash replays from the last checkpoint (the
log's writes are idempotent, so replays never duplicate).

The per-batch work (decode, score, write until committed) is `BatchScorer`;
`ScorerLoop` feeds it journal batches and commits the checkpoint. `Scorer` is
the two in one process (thread mode, the default); in process mode the loop
hands batches to a child process instead (`service.pipeline.scorer_process`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from google.protobuf.message import DecodeError

from service.contract import FeatureFunction, InvalidInput
from service.contract.errors import Unavailable
from service.pipeline import batch_record
from service.pipeline.dead_letter import DeadLetter, DeadLetterBox
from service.pipeline.feasibility_log import logged_feasibility
from service.pipeline.journal import IngestJournal
from service.pipeline.journal_format import JournalRecord
from service.pipeline.quarantine import Quarantine
from service.pipeline.scorer_types import (
    BatchHandler,
    DecisionSink,
    LoggedOutcome,
    LoggedRequest,
    ScoredBatch,
    ScorerConfig,
    ScorerObserver,
    SinkResult,
    StopSignal,
    decode,
    logged_items,
)
from service.pipeline.scoring import REFERENCE_BATCH, ScoredDecision, score_requests
from service.policies.base import DecisionStatus, Policy, ScoringBatch
from service.policies.runner import PolicyRun

__all__ = [
    "BatchHandler",
    "BatchScorer",
    "DecisionSink",
    "LoggedOutcome",
    "LoggedRequest",
    "ScoredBatch",
    "Scorer",
    "ScorerConfig",
    "ScorerLoop",
    "ScorerObserver",
    "SinkResult",
    "StopSignal",
    "decode",
    "logged_items",
]

log = logging.getLogger(__name__)


class BatchScorer:
    """One batch at a time: decode, score with every active policy, write until committed.

    Knows no journal, so the same code runs on the scorer thread and in the
    scorer process (`service.pipeline.scorer_process`).
    """

    def __init__(
        self,
        active_policies: Callable[[], Sequence[Policy]],
        sink: DecisionSink,
        observer: ScorerObserver,
        features: FeatureFunction,
        config: ScorerConfig | None = None,
        quarantine: Quarantine | None = None,
        dead_letters: DeadLetterBox | None = None,
        stop: StopSignal | None = None,
    ) -> None:
        self.dead_letters = dead_letters
        self.quarantine = quarantine or Quarantine()
        self._policies = active_policies
        self._sink = sink
        self._observer = observer
        self.on_scored: Callable[[ScoringBatch, list[ScoredDecision]], None] | None = None
        self._features = features
        self._config = config or ScorerConfig()
        self._stop: StopSignal = stop if stop is not None else threading.Event()
        self.sink_healthy = True
        self.sink_error: str | None = None

    def open(self) -> None:
        """Nothing to start in this process."""

    def idle(self) -> None:
        """Nothing to look after between batches."""

    def interrupt(self) -> None:
        """End a write retry at its next wait."""
        self._stop.set()

    def close(self) -> None:
        """Nothing to release."""

    def score_and_write(self, records: Sequence[JournalRecord]) -> bool:
        """Score and log `records` in one transaction; False when stopped before the commit."""
        requests: list[LoggedRequest] = []
        outcomes: list[LoggedOutcome] = []
        for record in records:
            try:
                items = logged_items(record)
            except (DecodeError, InvalidInput, ValueError) as exc:  # validated at ingest
                log.error("journal record %s is undecodable, skipped: %s", record.seq, exc)
                continue
            for item in items:
                if isinstance(item, LoggedRequest):
                    requests.append(item)
                else:
                    outcomes.append(item)
        policies = [p for p in self._policies() if self.quarantine.is_active(str(p.name))]
        decisions: list[ScoredDecision] = []
        runs: list[PolicyRun] = []
        scored: ScoringBatch | None = None
        if requests and policies:
            scored, decisions, runs = score_requests(
                [r.request for r in requests], policies, self._features, self._config.budgets_s
            )
            scale = max(1.0, len(requests) / REFERENCE_BATCH)
            for run in runs:
                self.quarantine.record(run.policy, self._strike(run, scale))
        # drift (service.evaluator.drift_monitor)
        if self.on_scored is not None and scored is not None and decisions:
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
            feasibility=logged_feasibility(
                [r.key for r in requests], [r.request for r in requests], scored
            ),
        )
        return self._write_until_committed(batch)

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
            feasibility=batch.feasibility,
        )

    def _dead_letter(self, item: LoggedRequest | LoggedOutcome, reason: str) -> None:
        assert self.dead_letters is not None
        if isinstance(item, LoggedRequest):
            letter = DeadLetter(
                item.seq, "mirror", item.request.request_id, item.payload, reason, item.row
            )
        else:
            letter = DeadLetter(
                item.seq, "outcome", item.outcome.request_id, item.payload, reason, item.row
            )
        path = self.dead_letters.put(letter)
        self._observer.on_dead_letter(letter.kind)
        log.error(
            "journal record %d (%s) dead-lettered to %s: %s",
            item.seq,
            letter.request_id,
            path,
            reason,
        )


def _up_to(records: list[JournalRecord], most: int) -> list[JournalRecord]:
    """The leading records holding at most `most` items in all (at least one record)."""
    total = 0
    for i, record in enumerate(records):
        if record.kind in batch_record.BATCH_KINDS:
            try:
                total += batch_record.row_count(record.payload)
            except ValueError:  # undecodable: the scorer logs and skips it
                total += 1
        else:
            total += 1
        if total > most and i:
            return records[:i]
    return records


class ScorerLoop:
    """Consumes the journal on a background thread, handing batches to a `BatchHandler`.

    The checkpoint moves only after the handler says the batch is committed.
    """

    CONSUMER = "scorer"

    def __init__(self, journal: IngestJournal, handler: BatchHandler, config: ScorerConfig) -> None:
        self._journal = journal
        self._handler = handler
        self._config = config
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def handler(self) -> BatchHandler:
        """What scores the batches (this process's `BatchScorer`, or a scorer process)."""
        return self._handler

    @property
    def sink_healthy(self) -> bool:
        """False while the decision log is unavailable."""
        return self._handler.sink_healthy

    @property
    def sink_error(self) -> str | None:
        """The decision log's last error, None while writes succeed."""
        return self._handler.sink_error

    def step(self) -> int:
        """Score and log one batch; returns the number of journal records consumed.

        A batch holds at most `max_batch` requests (and outcomes), however they
        were journaled: a batch record counts as its rows, and a step takes
        whole records only (at least one), so the checkpoint stays on a
        record boundary.
        """
        records = _up_to(
            self._journal.read(self.CONSUMER, self._config.max_batch), self._config.max_batch
        )
        if not records or not self._handler.score_and_write(records):
            return 0
        self._journal.commit(self.CONSUMER, records[-1].seq)
        return len(records)

    def run(self) -> None:
        """Loop until stopped: wait for records, let a batch fill (briefly), step."""
        lingered = False
        while not self._stop.is_set():
            depth = self._journal.depth_records(self.CONSUMER)
            if depth == 0:
                self._handler.idle()
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
        """Open the handler, start the background thread."""
        self._handler.open()
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
        self._handler.interrupt()
        if self._thread is not None:
            self._thread.join(drain_timeout_s + 5)
        self._handler.close()


class Scorer(ScorerLoop):
    """Thread mode: the journal loop and a `BatchScorer` in this process (the default)."""

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
        config = config or ScorerConfig()
        self.batches = BatchScorer(
            active_policies, sink, observer, features, config, quarantine, dead_letters
        )
        super().__init__(journal, self.batches, config)

    @property
    def quarantine(self) -> Quarantine:
        """Which policies are held back after repeated failures."""
        return self.batches.quarantine

    @property
    def dead_letters(self) -> DeadLetterBox | None:
        """Where records the log refuses alone are set aside."""
        return self.batches.dead_letters

    @property
    def on_scored(self) -> Callable[[ScoringBatch, list[ScoredDecision]], None] | None:
        """Called with every scored batch (the drift monitor)."""
        return self.batches.on_scored

    @on_scored.setter
    def on_scored(self, hook: Callable[[ScoringBatch, list[ScoredDecision]], None] | None) -> None:
        self.batches.on_scored = hook
