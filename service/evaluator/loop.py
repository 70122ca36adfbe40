"""The evaluator loop: one leader evaluates every running experiment and applies verdicts.

Each tick (every `interval_s`, on its own thread, never near the ack path):

1. take or renew the lease (`service.evaluator.leader`); a follower does
   nothing else, and forgets any state from an earlier term;
2. for each running or rollback-signalled protocol version: read what is new
   in the decision log since the last tick (`RoundSource`, with time cursors
   that tolerate late commits), fold it into the experiment's
   `ExperimentMonitor`, judge every criterion, store the evaluations (fenced
   by the lease generation) and report them to the observer (metrics);
3. apply at most one verdict per experiment through the protocol desk, as the
   `system` role, fenced twice: by the sequence number the tick read and by
   the lease generation carried in the verdict's evidence; then store the
   evidence snapshot and, on a stop, halt the candidate in the scorer.

A new term rebuilds each experiment's statistics from the experiment's start,
so a takeover needs no hand-over. Understudy never acts: a verdict is a
state, an event, a metric and an evidence package; rollback is a signal for
Runtime and Safety.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from service.contract.errors import Conflict, Unavailable
from service.evaluator.candidate_gate import CandidateGate
from service.evaluator.leader import Lease, Term
from service.protocols import Action, ProtocolDesk, RecordedProtocol
from service.protocols.criteria import Evaluation
from service.protocols.monitor import ExperimentMonitor
from service.protocols.rounds import Decisions, JoinedRounds, QualityCounts
from service.protocols.schema import Mode
from service.protocols.schema import Protocol as ProtocolDoc
from service.protocols.verdicts import Verdict, decide

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvaluatorConfig:
    """Tuning of the evaluator loop (the settings `evaluator_*` map onto these)."""

    interval_s: float = 5.0
    """Seconds between ticks."""
    lease_ttl_s: float = 15.0
    """How long a renewal holds the lease; a paused leader loses it after this."""
    lease_name: str = "evaluator"
    """The lease row (one evaluator role per database)."""
    overlap_s: float = 30.0
    """How far back each incremental read looks again, for rows committed late."""
    join_grace_s: float = 3600.0
    """Requests younger than this are not yet expected to have an outcome (join rate)."""
    max_rows: int = 5_000
    """Most rows one read takes per experiment and tick (a backlog takes several ticks;
    each joined round's request is decoded, ~0.5 ms, so a tick stays well inside the TTL)."""


class Cursor:
    """An incremental read position: a time, and the ids seen within the overlap.

    Rows are read with ``ts > since - overlap``; `admit` drops the ids it has
    seen, so a row committed late (with an earlier time than rows already
    read) is still taken exactly once, as long as it lands within the overlap.
    """

    def __init__(self, overlap_s: float) -> None:
        self.overlap_s = overlap_s
        self.since = 0.0
        self._seen: dict[str, float] = {}

    def window(self) -> float:
        """Read rows whose time is after this."""
        return self.since - self.overlap_s

    def admit(self, ids: Sequence[str], times: Sequence[float]) -> NDArray[np.bool_]:
        """Which of the rows read are new; remembers them and moves the cursor."""
        keep = np.zeros(len(ids), dtype=bool)
        for i, (key, ts) in enumerate(zip(ids, times, strict=True)):
            if key not in self._seen:
                self._seen[key] = ts
                keep[i] = True
        if len(times):
            self.since = max(self.since, max(times))
            horizon = self.window()
            self._seen = {k: ts for k, ts in self._seen.items() if ts > horizon}
        return keep


@dataclass(frozen=True)
class Watched:
    """An experiment the evaluator watches now: its record, protocol and start (Unix s)."""

    record: RecordedProtocol
    protocol: ProtocolDoc
    started_at: float

    @property
    def label(self) -> str:
        """``id@version``, the metrics' `experiment` label."""
        return f"{self.record.protocol_id}@{self.record.version}"


class RoundSource(Protocol):
    """What is new in the decision log for an experiment (``service.server.evaluator_wiring``)."""

    @property
    def n_features(self) -> int | None:
        """Option features the reward model reads (None: a constant model)."""
        ...

    def joined(self, watched: Watched, cursor: Cursor) -> JoinedRounds | None:
        """Rounds whose outcome joined since the cursor (None: nothing new)."""
        ...

    def decisions(self, watched: Watched, cursor: Cursor) -> tuple[Decisions, Decisions | None]:
        """The candidate's (and a named baseline's) decisions since the cursor."""
        ...

    def quality(self, watched: Watched) -> QualityCounts:
        """The data-quality counts now."""
        ...

    def breaches(self, watched: Watched, cursor: Cursor) -> list[str]:
        """Authority breaches in Runtime's acted placements since the cursor (online only)."""
        ...


class EvaluationRecords(Protocol):
    """Where evaluations are kept (``service.storage.stores.evaluation.EvaluationStore``)."""

    def record_evaluations(
        self,
        protocol_id: str,
        version: int,
        judged: Sequence[Evaluation],
        holder: str,
        generation: int,
    ) -> None:
        """Append them, fenced by the lease; `Conflict` when the lease moved."""
        ...


class EvidenceRecorder(Protocol):
    """Builds and stores the evidence package of a recorded transition."""

    def snapshot(self, record: RecordedProtocol, holder: str, generation: int) -> None:
        """Package the version as it is now (its newest event) and store it, fenced."""
        ...


class EvaluatorObserver(Protocol):
    """Metrics hooks (``service.evaluator.metrics.EvaluatorMetrics``)."""

    def on_leadership(self, leader: bool, generation: int) -> None:
        """After each lease attempt."""
        ...

    def on_evaluations(self, experiment: str, judged: Sequence[Evaluation]) -> None:
        """Every criterion of an experiment was judged."""
        ...

    def on_transition(self, experiment: str, action: Action, criterion: str, state: str) -> None:
        """A verdict was recorded."""
        ...

    def on_refused(self, experiment: str, reason: str) -> None:
        """A verdict or write was refused (lease lost, state moved)."""
        ...

    def on_tick(self, seconds: float, result: str) -> None:
        """A tick ended: `evaluated`, `follower` or `error`."""
        ...

    def forget(self, experiment: str) -> None:
        """This replica no longer evaluates the experiment (it lost the lease)."""
        ...


@dataclass
class _Slot:
    """One experiment's running state in this term."""

    monitor: ExperimentMonitor
    joined: Cursor
    decisions: Cursor
    placements: Cursor
    last: tuple[tuple[str, str, int], ...] = field(default=())


BeforeApply = Callable[[RecordedProtocol, Verdict], None]
"""Called just before a verdict is applied (a test seam for pausing a leader there)."""


class Evaluator:
    """The loop (module docstring)."""

    def __init__(
        self,
        desk: ProtocolDesk,
        records: EvaluationRecords,
        source: RoundSource,
        lease: Lease,
        observer: EvaluatorObserver,
        evidence: EvidenceRecorder,
        config: EvaluatorConfig | None = None,
        gate: CandidateGate | None = None,
        before_apply: BeforeApply | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.desk = desk
        self.records = records
        self.source = source
        self.lease = lease
        self.observer = observer
        self.evidence = evidence
        self.config = config or EvaluatorConfig()
        self.gate = gate
        self._before_apply = before_apply
        self._wall = wall_clock
        self._slots: dict[tuple[str, int], _Slot] = {}
        self._generation = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> int:
        """One pass; the number of experiments evaluated (0 as a follower)."""
        term = self.lease.hold()
        self.observer.on_leadership(term is not None, term.generation if term else 0)
        if term is None or term.generation != self._generation:
            self._forget_all()
            self._generation = term.generation if term else 0
        if term is None:
            return 0
        records = self.desk.evaluated()
        live = {(r.protocol_id, r.version) for r in records}
        for key in [k for k in self._slots if k not in live]:
            del self._slots[key]  # ended: its last evaluations stay in the metrics
        for i, record in enumerate(records):
            if i:  # a long tick must not outlive its lease: renew between experiments
                renewed = self.lease.hold()
                if renewed is None or renewed.generation != term.generation:
                    self._forget_all()
                    return i
            try:
                self._evaluate(_watched(record), term)
            except Unavailable:
                raise
            except Exception:  # one broken experiment must not starve the others
                log.exception("evaluating %s@%s failed", record.protocol_id, record.version)
        return len(records)

    def _forget_all(self) -> None:
        for pid, version in self._slots:
            self.observer.forget(f"{pid}@{version}")
        self._slots.clear()

    def _slot(self, w: Watched) -> _Slot:
        key = (w.record.protocol_id, w.record.version)
        slot = self._slots.get(key)
        if slot is None:
            overlap = self.config.overlap_s
            monitor = ExperimentMonitor(w.protocol, n_features=self.source.n_features)
            slot = _Slot(monitor, Cursor(overlap), Cursor(overlap), Cursor(overlap))
            self._slots[key] = slot
        return slot

    def _evaluate(self, w: Watched, term: Term) -> None:
        slot = self._slot(w)
        monitor = slot.monitor
        rounds = self.source.joined(w, slot.joined)
        if rounds is not None:
            monitor.update_joined(rounds)
        candidate, baseline = self.source.decisions(w, slot.decisions)
        monitor.update_decisions(candidate, baseline)
        monitor.observe_quality(self.source.quality(w))
        if w.protocol.mode is Mode.ONLINE_BOUNDED:
            monitor.observe_breaches(self.source.breaches(w, slot.placements))
        judged = monitor.evaluations(self._wall() - w.started_at)
        self.observer.on_evaluations(w.label, judged)
        verdict = decide(judged, w.record.state, w.record.mode)
        fingerprint = tuple((e.name, e.status.value, e.n) for e in judged)
        if fingerprint != slot.last or verdict is not None:
            try:
                self.records.record_evaluations(
                    w.record.protocol_id, w.record.version, judged, term.holder, term.generation
                )
            except Conflict as err:
                self.observer.on_refused(w.label, "lease")
                log.warning("evaluations of %s not recorded: %s", w.label, err)
                return
            slot.last = fingerprint
        if verdict is not None:
            self._apply(w, verdict, judged, term)

    def _apply(
        self, w: Watched, verdict: Verdict, judged: Sequence[Evaluation], term: Term
    ) -> None:
        if not self.lease.valid():
            self.observer.on_refused(w.label, "lease")
            log.warning("%s: not applying %s, the lease may have expired", w.label, verdict.action)
            return
        if self._before_apply is not None:
            self._before_apply(w.record, verdict)
        monitor = self._slots[(w.record.protocol_id, w.record.version)].monitor
        evidence: dict[str, Any] = {
            "lease": {"holder": term.holder, "generation": term.generation},
            "criterion": verdict.evaluation.summary(),
            "evaluations": [e.summary() for e in judged],
            "samples": {
                "joined": monitor.n_joined,
                "decisions": monitor.n_decisions,
                "unusable_pscore": monitor.unusable_pscore,
                "no_candidate_decision": monitor.no_candidate_decision,
            },
        }
        try:
            moved = self.desk.apply_verdict(
                w.record.protocol_id,
                w.record.version,
                verdict.action,
                reason=verdict.reason,
                evidence=evidence,
                criterion=verdict.criterion,
                expected_seq=w.record.seq,
            )
        except Conflict as err:
            self.observer.on_refused(w.label, "conflict")
            log.warning("%s: %s not applied: %s", w.label, verdict.action.value, err)
            return
        log.warning("%s: %s", w.label, verdict.reason)
        self.observer.on_transition(w.label, verdict.action, verdict.criterion, moved.state.value)
        if verdict.action is Action.STOP and self.gate is not None:
            c = w.protocol.candidate
            self.gate.halt(c.name, c.version)
        try:
            self.evidence.snapshot(moved, term.holder, term.generation)
        except (Conflict, Unavailable) as err:
            log.warning("%s: evidence snapshot not stored: %s", w.label, err)

    def run(self) -> None:
        """Tick every `interval_s` until stopped; the loop survives any failure."""
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                result = "evaluated" if self.tick() or self.lease.term else "follower"
            except Unavailable as err:
                result = "error"
                log.warning("evaluator tick: database unavailable: %s", err)
            except Exception:  # the loop must survive anything a tick throws
                result = "error"
                log.exception("evaluator tick failed")
            self.observer.on_tick(time.perf_counter() - started, result)
            self._stop.wait(self.config.interval_s)

    def start(self) -> None:
        """Start the background thread."""
        self._thread = threading.Thread(target=self.run, name="evaluator", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread and give the lease up so another replica takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.lease.release()
        self._forget_all()


def _watched(record: RecordedProtocol) -> Watched:
    started = record.started_at if record.started_at is not None else record.recorded_at
    return Watched(record, record.protocol(), started)
