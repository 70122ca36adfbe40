"""Quarantine: a policy that keeps failing stops being scored for a while.

A failing policy never stops the others (the runner isolates each call), but
one that errors, returns non-finite output or overruns its time budget on
every batch still costs the scorer its latency. After `threshold` failed
batches within `window_s` it is quarantined for `cooldown_s`, then retried:
one good batch ends the quarantine, one more failure starts it again at once.
Each transition is an event (`QuarantineEvent`) handed to listeners (metrics,
the event log) and kept in memory for the readiness report.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class QuarantineEvent:
    """A policy entered or left quarantine."""

    policy: str
    event: str  # "quarantined" | "released" | "retry_failed"
    at: float
    reason: str


@dataclass
class _State:
    failures: deque[float] = field(default_factory=deque)
    until: float | None = None
    probation: bool = False
    last_error: str = ""


class Quarantine:
    """Tracks failures per policy and decides which policies are scored."""

    def __init__(
        self,
        threshold: int = 3,
        window_s: float = 60.0,
        cooldown_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._threshold = threshold
        self._window_s = window_s
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._wall = wall_clock
        self._states: dict[str, _State] = {}
        self._lock = threading.Lock()
        self._listeners: list[Callable[[QuarantineEvent], None]] = []
        self.events: list[QuarantineEvent] = []

    def subscribe(self, listener: Callable[[QuarantineEvent], None]) -> None:
        """Call `listener` with every event (metrics, the event table)."""
        self._listeners.append(listener)

    def is_active(self, policy: str) -> bool:
        """Whether `policy` should be scored now (quarantine over, or never started)."""
        with self._lock:
            state = self._states.get(policy)
            if state is None or state.until is None:
                return True
            if self._clock() >= state.until:
                state.until, state.probation = None, True
                return True
            return False

    def quarantined(self) -> dict[str, str]:
        """Policies in quarantine now, with the failure that put them there."""
        now = self._clock()
        with self._lock:
            return {
                name: s.last_error
                for name, s in self._states.items()
                if s.until is not None and now < s.until
            }

    def record(self, policy: str, error: str | None) -> None:
        """Record one batch's result for `policy` (error None = it went fine)."""
        event: QuarantineEvent | None = None
        now = self._clock()
        with self._lock:
            state = self._states.setdefault(policy, _State())
            if error is None:
                if state.probation:
                    state.probation = False
                    state.failures.clear()
                    event = QuarantineEvent(policy, "released", self._wall(), "a batch succeeded")
            else:
                state.last_error = error
                state.failures.append(now)
                while state.failures and state.failures[0] < now - self._window_s:
                    state.failures.popleft()
                if state.probation or len(state.failures) >= self._threshold:
                    kind = "retry_failed" if state.probation else "quarantined"
                    state.until, state.probation = now + self._cooldown_s, False
                    state.failures.clear()
                    event = QuarantineEvent(policy, kind, self._wall(), error)
        if event is not None:
            self.events.append(event)
            for listener in self._listeners:
                listener(event)
