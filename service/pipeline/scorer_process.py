"""Process mode: the scorer's batches are scored and logged in a child process.

One Python process spends its GIL about evenly on ingest and on scoring
(py-spy, docs/capacity.md), so the service uses about one core however many
it has. In process mode the ingest process keeps the journal (it owns it:
``flock``) and the `ScorerLoop` thread, which hands each journal batch —
``(seq, kind, payload, appended_at)`` tuples — over a pipe to a child started
with the ``spawn`` method (never ``fork`` in a process with gRPC threads). The
child decodes, scores and writes with the same `BatchScorer` the thread mode
runs, then answers; only then does the loop commit the journal checkpoint.

At-least-once is unchanged: if the child dies (crash, OOM kill, SIGKILL) the
parent starts another and sends the same batch again from the checkpoint;
the decision log's writes are idempotent, so nothing acked is lost or doubled.
The child dies with its parent: a thread waits on the parent's sentinel.

What the child observes comes back with each answer: metric updates
(`service.pipeline.metric_relay`), quarantine events (kept here in a
`QuarantineMirror` for readiness) and the sink's health. An outage is
reported while the child retries, not only when the batch ends.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from service.metrics import ServiceMetrics
from service.pipeline.journal_format import JournalRecord
from service.pipeline.metric_relay import replay
from service.pipeline.quarantine import QuarantineEvent
from service.pipeline.scorer_child import (
    ChildRuntime,
    Halted,
    Report,
    Row,
    ScorerFactory,
    child_main,
)

log = logging.getLogger(__name__)


class QuarantineMirror:
    """The child's quarantine as readiness sees it, rebuilt here from its events."""

    def __init__(self, cooldown_s: float, clock: Callable[[], float]) -> None:
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._held: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def apply(self, event: QuarantineEvent) -> None:
        """Record a transition."""
        with self._lock:
            if event.event == "released":
                self._held.pop(event.policy, None)
            else:
                self._held[event.policy] = (event.reason, self._clock() + self._cooldown_s)

    def quarantined(self) -> dict[str, str]:
        """Policies in quarantine now, with the failure that put them there."""
        now = self._clock()
        with self._lock:
            return {name: error for name, (error, until) in self._held.items() if now < until}


class ChildLost(Exception):
    """Raised when the scorer process exited or its pipe broke."""


class ProcessScorer:
    """The parent's end: a `BatchHandler` that ships batches to the scorer process.

    Args:
        factory: builds the child's scorer (pickled to the child).
        metrics: where the child's metric updates are replayed.
        halted: the candidates not to score now (the evaluator's gate), read per batch.
        cooldown_s: the quarantine cooldown (for `quarantine`).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        factory: ScorerFactory,
        metrics: ServiceMetrics,
        halted: Callable[[], Halted] | None = None,
        cooldown_s: float = 300.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._ctx = multiprocessing.get_context("spawn")
        self._factory = factory
        self._metrics = metrics
        self._halted = halted or frozenset
        self._stop_child: Connection | None = None  # writing to it ends the child's retries
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # the child handle, against close()
        self._proc: BaseProcess | None = None
        self._conn: Connection | None = None
        self._ready = False
        self.restarts = 0
        self._restart_delay = 0.5  # grows while children die before saying ready
        self._restart_at = 0.0  # monotonic time before which no restart is due
        self.quarantine = QuarantineMirror(cooldown_s, clock or time.monotonic)
        self.sink_healthy = True
        self.sink_error: str | None = None

    @property
    def child_pid(self) -> int | None:
        """The scorer process's pid (None before `open`)."""
        proc = self._proc
        return proc.pid if proc is not None else None

    def health(self) -> tuple[bool, str]:
        """Readiness: the child is up and has said it is ready."""
        proc = self._proc
        alive = proc is not None and proc.is_alive()
        state = "ready" if alive and self._ready else "starting" if alive else "down"
        return alive, f"scorer process {self.child_pid} {state}; {self.restarts} restart(s)"

    def open(self, ready_timeout_s: float = 60.0) -> None:
        """Start the scorer process and wait (bounded) until it has loaded its policies.

        A child that dies or is slow here is left to the loop, which restarts or awaits it.
        """
        with self._lock:
            self._spawn_locked()
            proc, conn = self._proc, self._conn
        assert proc is not None and conn is not None
        try:
            self._await_ready(proc, conn, time.monotonic() + ready_timeout_s)
        except ChildLost as exc:
            log.error("scorer process failed to start (%s); the loop restarts it", exc)

    def _spawn_locked(self) -> None:
        parent_end, child_end = self._ctx.Pipe(duplex=True)
        stop_reader, stop_writer = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(
            target=child_main,
            args=(child_end, stop_reader, self._factory, ChildRuntime.of_this_process()),
            name="understudy-scorer",
            daemon=True,
        )
        proc.start()
        child_end.close()
        stop_reader.close()
        self._proc, self._conn, self._ready = proc, parent_end, False
        self._stop_child = stop_writer

    def score_and_write(self, records: Sequence[JournalRecord]) -> bool:
        """Send `records` to the child until one child commits them; False once stopping."""
        rows: list[Row] = [(r.seq, int(r.kind), r.payload, r.appended_at) for r in records]
        while not self._stopping.is_set():
            try:
                return self._round_trip(rows)
            except ChildLost as exc:
                log.error("scorer process lost (%s); restarting, batch resent", exc)
            if self._stopping.wait(max(0.0, self._restart_at - time.monotonic())):
                break
            self._restart()
        return False

    def _restart(self) -> None:
        """Replace the child; restarts without a `ready` between them back off (0.5 s .. 5 s)."""
        with self._lock:
            if self._stopping.is_set():
                return
            self._discard_locked()
            self._spawn_locked()
            self.restarts += 1
            self._metrics.scorer_process_restarts.inc()
            self._restart_at = time.monotonic() + self._restart_delay
            self._restart_delay = min(self._restart_delay * 2, 5.0)

    def idle(self) -> None:
        """Between batches, on the loop's thread: restart a child that died while idle.

        Recovery must not wait for traffic: readiness reports the child down, and a
        balancer that follows readiness would send none.
        """
        proc, conn = self._proc, self._conn
        if self._stopping.is_set():
            return
        try:
            if proc is not None and conn is not None and proc.is_alive():
                self._await_ready(proc, conn, time.monotonic())  # collect a pending "ready"
                return
        except ChildLost:
            pass
        if time.monotonic() >= self._restart_at:
            log.error("scorer process %s exited while idle; restarting", self.child_pid)
            self._restart()

    def _round_trip(self, rows: list[Row]) -> bool:
        proc, conn = self._proc, self._conn
        if proc is None or conn is None:
            raise ChildLost("not started")
        self._await_ready(proc, conn)
        try:
            conn.send(("batch", rows, self._halted()))
        except OSError as exc:
            raise ChildLost(f"pipe broke: {exc}") from exc
        while True:
            report = self._receive(proc, conn)
            assert report is not None  # no deadline
            if report.kind == "done":
                return bool(report.value)
            if report.kind == "failed":
                raise RuntimeError(f"scorer process failed a batch: {report.value}")

    def _await_ready(
        self, proc: BaseProcess, conn: Connection, deadline: float = float("inf")
    ) -> None:
        while not self._ready:
            report = self._receive(proc, conn, deadline)
            if report is None:
                return  # not yet: whoever calls next waits again
            self._ready = report.kind == "ready"
            if self._ready:
                self._restart_delay = 0.5

    def _receive(
        self, proc: BaseProcess, conn: Connection, deadline: float = float("inf")
    ) -> Report | None:
        """The next report (applied here); None past `deadline`; `ChildLost` if the child died."""
        while True:
            try:
                if conn.poll(0.2):
                    report: Report = conn.recv()
                    break
            except (EOFError, OSError) as exc:
                raise ChildLost(f"exit code {proc.exitcode}") from exc
            if not proc.is_alive():
                raise ChildLost(f"exit code {proc.exitcode}")
            if time.monotonic() > deadline:
                return None
        replay(report.ops, self._metrics)
        for event in report.quarantine:
            self.quarantine.apply(event)
        self.sink_healthy, self.sink_error = report.sink_healthy, report.sink_error
        return report

    def interrupt(self) -> None:
        """Stop retrying: the child abandons a write retry, no child is restarted."""
        self._stopping.set()
        stop = self._stop_child
        if stop is not None:
            with contextlib.suppress(OSError):  # the child may be gone already
                stop.send_bytes(b"s")

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask the child to exit, join it; SIGTERM then SIGKILL it (by its pid) if it lingers."""
        self.interrupt()
        with self._lock:
            self._discard_locked(timeout_s)

    def _discard_locked(self, timeout_s: float = 5.0) -> None:
        proc, conn, stop = self._proc, self._conn, self._stop_child
        self._proc, self._conn, self._ready, self._stop_child = None, None, False, None
        if proc is None:
            return
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
        proc.join(timeout_s)
        if proc.is_alive():
            log.warning("scorer process %s did not stop; terminating it", proc.pid)
            proc.terminate()
            proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        for end in (conn, stop):
            if end is not None:
                end.close()
