"""Which policies the scorer may score: every registered one except halted candidates.

When the evaluator stops an experiment on a stop criterion, its candidate
stops being scored — on every replica, not only the leader — until a new
protocol version naming it is started. The halted set lives in PostgreSQL
(the protocol events themselves: `halted` reads it), and each replica's
gate re-reads it at most every `refresh_s` from the scorer's thread; the
leader also halts a candidate locally the moment its stop is recorded. A
database outage keeps the last known set (stopping is never undone by an
outage).

The scorer takes ``active_policies: Callable[[], Sequence[Policy]]``; the
composition root passes ``gate.active(lambda: registry.policies.values())``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from service.contract.errors import Unavailable
from service.policies.base import Policy

log = logging.getLogger(__name__)


class CandidateGate:
    """The halted candidates, cached (module docstring).

    Args:
        halted: reads the ``(policy, version)`` pairs halted now (the store).
        refresh_s: how stale the cached set may get.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        halted: Callable[[], set[tuple[str, str]]],
        refresh_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = halted
        self._refresh_s = refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        self._halted: set[tuple[str, str]] = set()
        self._local: dict[tuple[str, str], float] = {}
        self._read_at = -float("inf")

    def halted(self) -> frozenset[tuple[str, str]]:
        """The halted ``(policy, version)`` pairs, re-read when the cache is stale."""
        now = self._clock()
        with self._lock:
            stale = now - self._read_at >= self._refresh_s
        if stale:
            try:
                fresh = self._read()
            except Unavailable as err:
                log.warning("halted candidates not refreshed (keeping the last set): %s", err)
                fresh = None
            with self._lock:
                self._read_at = now
                if fresh is not None:
                    # The read saw every stop committed before it started.
                    self._halted = fresh
                    self._local = {k: t for k, t in self._local.items() if t >= now}
        with self._lock:
            return frozenset(self._halted | set(self._local))

    def halt(self, policy: str, version: str) -> None:
        """Stop scoring `policy@version` now on this replica (the leader, after a stop)."""
        with self._lock:
            self._local[(policy, version)] = self._clock()

    def allows(self, policy: Policy) -> bool:
        """Whether `policy` may be scored now."""
        return (str(policy.name), str(policy.version)) not in self.halted()

    def active(self, source: Callable[[], Iterable[Policy]]) -> Callable[[], list[Policy]]:
        """Wrap the scorer's policy source so halted candidates are left out."""

        def policies() -> list[Policy]:
            halted = self.halted()
            return [p for p in source() if (str(p.name), str(p.version)) not in halted]

        return policies
