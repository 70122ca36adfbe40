"""Readiness: named checks that together say whether the service can do its job.

Liveness (`/healthz`) only says the process answers. Readiness lists each
dependency with its state, so a database outage shows up as "not ready:
database down" while ingest keeps acking into the journal.

Checks are evaluated in rounds on a background thread (`start`), never on a
thread that serves ingest: a check may wait on the database or the disk, and
one that waited on the HTTP event loop stalled every ack while the database
was frozen. Each check runs on its own daemon thread and has a bound
(`timeout_s`); one that has not answered within it counts as failed ("no
answer within 1.0 s") and, while it hangs, is not called again — so a hung
check never delays the next round, never piles up threads, and never holds
up the other checks. Readers either take the latest round (`snapshot`,
`ready`: no waiting at all) or ask for the next one (`next_round`: a future
that the background thread resolves within the checks' bounds).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

Check = Callable[[], tuple[bool, str]]
Listener = Callable[[list["CheckResult"]], None]

DEFAULT_TIMEOUT_S = 1.0
"""How long a check may take before it counts as failed."""
DEFAULT_INTERVAL_S = 1.0
"""Seconds between two rounds when nobody asks for one."""
_MIN_GAP_S = 0.05
"""Rounds asked for back to back are at least this far apart (a /readyz storm)."""
NOT_EVALUATED = "not evaluated yet"


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check's verdict and a human-readable detail.

    `answered` is False when the check did not return within its bound (or
    has not run yet): the verdict then says nothing about the dependency's
    state except that it does not answer.
    """

    name: str
    ok: bool
    detail: str
    answered: bool = True


@dataclass
class _Slot:
    """A registered check and the call of it still running, if any."""

    check: Check
    timeout_s: float
    running: Future[tuple[bool, str]] | None = None
    started_at: float = 0.0
    result: CheckResult | None = None


def _call(check: Check, future: Future[tuple[bool, str]]) -> None:
    try:
        future.set_result(check())
    except BaseException as exc:  # a broken check must not break readiness
        future.set_exception(exc)


def _resolve(waiter: Future[list[CheckResult]], outcome: list[CheckResult] | Exception) -> None:
    """Settle a `next_round` future unless its reader gave up (cancelled it)."""
    try:
        if isinstance(outcome, Exception):
            waiter.set_exception(outcome)
        else:
            waiter.set_result(outcome)
    except InvalidStateError:
        pass


@dataclass
class Readiness:
    """A registry of readiness checks, evaluated in bounded rounds off the serving threads."""

    interval_s: float = DEFAULT_INTERVAL_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    """The bound of checks registered without one of their own."""
    _slots: dict[str, _Slot] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _round_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _waiters: list[Future[list[CheckResult]]] = field(default_factory=list, repr=False)
    _listeners: list[Listener] = field(default_factory=list, repr=False)
    _wake: threading.Event = field(default_factory=threading.Event, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def register(self, name: str, check: Check, timeout_s: float | None = None) -> None:
        """Add or replace the check called `name`; it counts as failed after `timeout_s`
        (default: the registry's `timeout_s`)."""
        bound = self.timeout_s if timeout_s is None else timeout_s
        if bound <= 0:
            raise ValueError(f"`timeout_s` must be positive, got {bound}")
        with self._lock:
            self._slots[name] = _Slot(check, bound)

    def subscribe(self, listener: Listener) -> None:
        """Call `listener` with every round's results, on the readiness thread."""
        with self._lock:
            self._listeners.append(listener)

    # -- readers ---------------------------------------------------------------

    def snapshot(self) -> list[CheckResult]:
        """The latest result of every check; never waits on a check."""
        with self._lock:
            return [
                slot.result or CheckResult(name, False, NOT_EVALUATED, answered=False)
                for name, slot in self._slots.items()
            ]

    def result(self, name: str) -> CheckResult | None:
        """The latest result of check `name` (None if no such check); never waits."""
        return next((r for r in self.snapshot() if r.name == name), None)

    def ready(self) -> bool:
        """True when every check passed in the latest round; never waits on a check."""
        return all(r.ok for r in self.snapshot())

    def next_round(self) -> Future[list[CheckResult]]:
        """A future of the next round to start, which starts at once.

        It resolves within the longest check bound (plus scheduling); meant for
        ``/readyz``, which awaits it without blocking its event loop, so a
        state change made before the request is in the answer. Starts the
        background thread if it is not running.
        """
        future: Future[list[CheckResult]] = Future()
        if self._stop.is_set():  # stopped (shutting down): the last round is the answer
            future.set_result(self.snapshot())
            return future
        with self._lock:
            self._waiters.append(future)
        if self._thread is None:
            self.start()
        self._wake.set()
        return future

    @property
    def round_bound_s(self) -> float:
        """The longest a round can take: the largest check bound."""
        with self._lock:
            return max((s.timeout_s for s in self._slots.values()), default=0.0)

    # -- evaluation ------------------------------------------------------------

    def evaluate(self) -> list[CheckResult]:
        """Run one round now, bounded by the checks' bounds, and return it.

        A check that raises counts as failed, with the error; one still running
        from an earlier round (so past its bound) is not called again and reads
        as not answering, without a wait: a round during a freeze is quick.
        """
        with self._round_lock:
            with self._lock:
                slots = list(self._slots.items())
            started = time.monotonic()
            for _, slot in slots:
                running = slot.running
                if running is None or running.done():
                    future: Future[tuple[bool, str]] = Future()
                    slot.running, slot.started_at = future, started
                    threading.Thread(
                        target=_call, args=(slot.check, future), name="readiness", daemon=True
                    ).start()
            results = [self._settle(name, slot) for name, slot in slots]
        with self._lock:
            for (_, slot), result in zip(slots, results, strict=True):
                slot.result = result
        return results

    @staticmethod
    def _settle(name: str, slot: _Slot) -> CheckResult:
        """The check's answer, waiting at most until its bound from when its call began.

        A call carried over from an earlier round is past its bound already: no wait.
        """
        running = slot.running
        assert running is not None
        remaining = slot.started_at + slot.timeout_s - time.monotonic()
        try:
            ok, detail = running.result(timeout=max(0.0, remaining))
        except TimeoutError:
            waited = time.monotonic() - slot.started_at
            detail = f"no answer within {float(slot.timeout_s)} s"
            if waited > slot.timeout_s * 1.5:
                detail += f" (the call has been waiting {waited:.0f} s)"
            return CheckResult(name, False, detail, answered=False)
        except Exception as exc:
            slot.running = None
            return CheckResult(name, False, f"check raised {type(exc).__name__}: {exc}")
        slot.running = None
        return CheckResult(name, bool(ok), detail)

    # -- the background thread -------------------------------------------------

    def start(self) -> None:
        """Evaluate every `interval_s` (and when a round is asked for) on a daemon thread."""
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="readiness", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the background thread (waits at most `timeout_s`)."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        self._thread = None

    def _run(self) -> None:
        last = 0.0
        while not self._stop.is_set():
            self._wake.wait(max(0.0, last + self.interval_s - time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                break
            gap = last + _MIN_GAP_S - time.monotonic()
            if gap > 0 and self._stop.wait(gap):
                break
            with self._lock:
                waiters, self._waiters = self._waiters, []
                listeners = list(self._listeners)
            last = time.monotonic()
            try:
                results = self.evaluate()
            except Exception as exc:  # never lose the thread
                log.exception("readiness round failed")
                for waiter in waiters:
                    _resolve(waiter, exc)
                continue
            for listener in listeners:  # first: a reader of the round sees what it set
                try:
                    listener(results)
                except Exception:
                    log.exception("readiness listener failed")
            for waiter in waiters:
                _resolve(waiter, results)
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            _resolve(waiter, self.snapshot())
