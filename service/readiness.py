"""Readiness: named checks that together say whether the service can do its job.

Liveness (`/healthz`) only says the process answers. Readiness lists each
dependency with its state, so a database outage shows up as "not ready:
database down" while ingest keeps acking into the journal.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

Check = Callable[[], tuple[bool, str]]


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check's verdict and a human-readable detail."""

    name: str
    ok: bool
    detail: str


class Readiness:
    """A registry of readiness checks, evaluated on demand."""

    def __init__(self) -> None:
        self._checks: dict[str, Check] = {}
        self._lock = threading.Lock()

    def register(self, name: str, check: Check) -> None:
        """Add or replace the check called `name`."""
        with self._lock:
            self._checks[name] = check

    def evaluate(self) -> list[CheckResult]:
        """Run every check; a check that raises counts as failed, with the error."""
        with self._lock:
            checks = list(self._checks.items())
        results = []
        for name, check in checks:
            try:
                ok, detail = check()
            except Exception as exc:  # a broken check must not break /readyz
                ok, detail = False, f"check raised {type(exc).__name__}: {exc}"
            results.append(CheckResult(name, ok, detail))
        return results

    def ready(self) -> bool:
        """True when every check passes."""
        return all(r.ok for r in self.evaluate())
