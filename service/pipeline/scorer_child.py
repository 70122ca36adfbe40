"""The scorer process's side of process mode (`service.pipeline.scorer_process`).

`child_main` runs in a process started with ``spawn``: it builds a
`BatchScorer` with a picklable `ScorerFactory`, says ``ready``, then scores
every batch the parent sends and answers with a `Report` — committed or not,
plus everything observed meanwhile: metric updates recorded on a
`MetricRelay`, quarantine events, the sink's health. A failed write is
reported at once (`ReportingObserver`), while the child keeps retrying.
The child stops when asked, on EOF of its pipe, or when its parent dies.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

from service.pipeline.journal_format import JournalRecord, RecordKind
from service.pipeline.metric_relay import MetricRelay, Op
from service.pipeline.quarantine import QuarantineEvent
from service.pipeline.scorer import BatchScorer, StopSignal
from service.pipeline.scorer_types import ScorerObserver, SinkResult
from service.pipeline.scoring import ScoredDecision
from service.policies.base import Policy
from service.policies.runner import PolicyRun

log = logging.getLogger(__name__)

Halted = frozenset[tuple[str, str]]
Row = tuple[int, int, bytes, float]
"""A journal record on the pipe: (seq, kind, payload, appended_at)."""


@dataclass(frozen=True)
class Report:
    """One message from the child: what happened, and everything observed since the last one."""

    kind: str  # "ready" (value: pid) | "events" | "done" (value: committed) | "failed" (error)
    value: Any
    ops: list[Op] = field(default_factory=list)
    quarantine: list[QuarantineEvent] = field(default_factory=list)
    sink_healthy: bool = True
    sink_error: str | None = None


class ChildLink:
    """The child's end: its metrics relay, the halted set, and how it reports."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.relay = MetricRelay()
        self.halted: Halted = frozenset()
        self.scorer: BatchScorer | None = None
        self._events: list[QuarantineEvent] = []
        self._closers: list[Callable[[], None]] = []

    def active(self, source: Callable[[], Sequence[Policy]]) -> Callable[[], list[Policy]]:
        """`source` without the candidates the parent's gate has halted."""
        return lambda: [p for p in source() if (str(p.name), str(p.version)) not in self.halted]

    def on_quarantine(self, event: QuarantineEvent) -> None:
        """Keep a quarantine transition for the next report."""
        self._events.append(event)

    def on_close(self, closer: Callable[[], None]) -> None:
        """Call `closer` when the child stops (dispose the engine)."""
        self._closers.append(closer)

    def report(self, kind: str, value: Any = None) -> None:
        """Send a report with everything observed since the last one."""
        events, self._events = self._events, []
        scorer = self.scorer
        self._conn.send(
            Report(
                kind,
                value,
                self.relay.take(),
                events,
                scorer.sink_healthy if scorer is not None else True,
                scorer.sink_error if scorer is not None else None,
            )
        )

    def close(self) -> None:
        """Run the closers (errors logged: the child is exiting anyway)."""
        for closer in self._closers:
            try:
                closer()
            except Exception:
                log.exception("scorer process: closing failed")


class ReportingObserver:
    """A `ScorerObserver` that reports at once when a write fails or a record is dead-lettered.

    Successful batches ride with the ``done`` report; a failure is sent while
    the child is still retrying, so readiness shows an outage as it happens.
    """

    def __init__(self, inner: ScorerObserver, link: ChildLink) -> None:
        self._inner = inner
        self._link = link

    def on_batch(
        self, size: int, runs: Sequence[PolicyRun], decisions: Sequence[ScoredDecision]
    ) -> None:
        """Pass on."""
        self._inner.on_batch(size, runs, decisions)

    def on_write(self, seconds: float, result: SinkResult | None, error: str | None) -> None:
        """Pass on; report now when the write failed."""
        self._inner.on_write(seconds, result, error)
        if result is None:
            self._link.report("events")

    def on_dead_letter(self, kind: str) -> None:
        """Pass on and report."""
        self._inner.on_dead_letter(kind)
        self._link.report("events")


class PipeSignal:
    """The child's `StopSignal`: set once the parent writes to the pipe, or dies (EOF).

    A pipe rather than a ``multiprocessing.Event``: no named semaphore to leak.
    """

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._set = False

    def is_set(self) -> bool:
        """Whether the parent asked to stop."""
        return self._set or self._poll(0)

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to `timeout` unless the parent asks to stop; whether it did."""
        return self._set or self._poll(timeout)

    def set(self) -> None:
        """Stop from this side too."""
        self._set = True

    def _poll(self, timeout: float | None) -> bool:
        try:
            asked = self._conn.poll(timeout)
        except (EOFError, OSError):
            asked = True
        self._set = self._set or asked
        return asked


class ScorerFactory(Protocol):
    """Builds the child's `BatchScorer` (in the child); must pickle (``spawn``)."""

    def __call__(self, stop: StopSignal, link: ChildLink) -> BatchScorer:
        """The scorer, its sink and observers wired to `link`."""
        ...


def _die_with_parent() -> None:
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        wait([parent.sentinel])
        os._exit(70)  # the parent is gone: its checkpoint is the truth, nothing to finish

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


@dataclass(frozen=True)
class ChildRuntime:
    """The parent's process-wide settings the child copies: log level, GC thresholds."""

    log_level: int
    gc_threshold: tuple[int, ...]
    gc_frozen: bool
    """Whether the parent froze its start-up heap; the child then freezes its own once built."""

    @classmethod
    def of_this_process(cls) -> ChildRuntime:
        """This process's settings."""
        return cls(
            logging.getLogger().getEffectiveLevel(), gc.get_threshold(), gc.get_freeze_count() > 0
        )

    def apply(self) -> None:
        """Log like the parent (to the inherited stderr); collect garbage as it does."""
        logging.basicConfig(
            level=self.log_level,
            format="%(asctime)s %(levelname)s %(name)s [scorer process]: %(message)s",
        )
        gc.set_threshold(*self.gc_threshold)


def child_main(
    conn: Connection, stop_conn: Connection, factory: ScorerFactory, runtime: ChildRuntime
) -> None:
    """The scorer process: build the scorer, then score every batch the parent sends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    _die_with_parent()
    runtime.apply()
    link = ChildLink(conn)
    try:
        link.scorer = factory(PipeSignal(stop_conn), link)
        if runtime.gc_frozen:  # as `service.server.app.tune_garbage_collector` does in the parent
            gc.freeze()
        link.report("ready", os.getpid())
        while True:
            try:
                message = conn.recv()
            except EOFError:
                break
            if message[0] == "stop":
                break
            _, rows, halted = message
            link.halted = halted
            records = [JournalRecord(s, RecordKind(k), p, t) for s, k, p, t in rows]
            try:
                committed = link.scorer.score_and_write(records)
            except Exception as exc:  # the parent logs it and retries the batch
                log.exception("scorer process: batch failed")
                link.report("failed", f"{type(exc).__name__}: {exc}")
                continue
            link.report("done", committed)
    finally:
        link.close()
