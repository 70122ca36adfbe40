"""A daemon thread that calls `tick` every `interval_s` until stopped.

The storage-side background loops (the chain sealer, the reviewer guard, the
embedded-server watch) differ in what a tick does, not in how they run; this
is the one place that starts, paces and stops such a thread. `tick` must not
raise (each loop reports its own failures); `stopping` is public so a tick that
waits (a backoff) wakes at once when the service stops.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class PeriodicThread:
    """Runs `tick` every `interval_s` on a daemon thread named `name`."""

    def __init__(self, name: str, interval_s: float, tick: Callable[[], None]) -> None:
        if interval_s <= 0:
            raise ValueError(f"`interval_s` must be > 0, got {interval_s}")
        self.name = name
        self.interval_s = interval_s
        self._tick = tick
        self.stopping = threading.Event()
        """Set by `stop`: a tick that waits should wait on it."""
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """Started and not stopped since."""
        return self._thread is not None

    def start(self) -> None:
        """Start the thread (again after a `stop`); a no-op while it runs."""
        if self._thread is not None:
            return
        self.stopping.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        """Stop and wait up to `timeout_s` for a tick in progress to finish."""
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            self._tick()
