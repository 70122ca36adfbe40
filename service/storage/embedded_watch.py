"""Bring the embedded PostgreSQL back when its postmaster dies.

A service that owns (or reuses) the embedded server is its only operator:
nobody else restarts it when the OOM killer or a ``kill -9`` takes the
postmaster, and without it the journal grows until it sheds. `EmbeddedWatch`
looks at the server every `interval_s` on a daemon thread and, when the
postmaster died (`service.storage.embedded.died_pid`: its ``postmaster.pid``
names a process that is gone), starts it again through `start_embedded`,
with exponential backoff between failed attempts (a killed postmaster may
not be reaped yet, or its children may still hold its shared memory).
PostgreSQL's crash recovery runs at that start; the log writer's engine
reconnects (``pool_pre_ping``) and journal replay fills in what was acked
meanwhile.

A server stopped on purpose (an orderly shutdown removes ``postmaster.pid``)
is left stopped. While restarting, `status` says "restarting (attempt N)",
which the ``database`` readiness check shows instead of its probe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from service.storage.embedded import died_pid, start_embedded
from service.storage.periodic import PeriodicThread

log = logging.getLogger(__name__)

Outcome = Callable[[bool], None]
"""Told of every restart attempt: True when the server came back."""


class EmbeddedWatch:
    """Restarts a dead embedded postmaster, with backoff.

    Args:
        data_dir: the server's data directory.
        on_attempt: called after each restart attempt with whether it worked (metrics).
        interval_s: how often the postmaster is looked at.
        backoff_s: the wait after the first failed attempt; doubles per failure...
        backoff_max_s: ...up to this.
        stop_at_exit: passed to `start_embedded` (pgserver's cleanup at process exit).
    """

    def __init__(
        self,
        data_dir: Path,
        on_attempt: Outcome,
        *,
        interval_s: float = 1.0,
        backoff_s: float = 0.5,
        backoff_max_s: float = 30.0,
        stop_at_exit: bool = True,
    ) -> None:
        self.data_dir = Path(data_dir)
        self._on_attempt = on_attempt
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._stop_at_exit = stop_at_exit
        self._thread = PeriodicThread("embedded-db-watch", interval_s, self.check)
        self._stop = self._thread.stopping
        self._attempt = 0
        self.restarts = 0
        """Restarts that brought the server back."""

    def status(self) -> str | None:
        """ "restarting (attempt N)" while the server is being brought back, else None."""
        attempt = self._attempt
        return f"restarting (attempt {attempt})" if attempt else None

    def start(self) -> None:
        """Watch on a daemon thread until `stop`."""
        self._thread.start()

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop watching (an attempt in progress finishes first, bounded by `timeout_s`)."""
        self._thread.stop(timeout_s)

    def check(self) -> None:
        """One look at the postmaster: restart it if it died."""
        dead = died_pid(self.data_dir)
        if dead is not None:
            log.error("embedded PostgreSQL pid %d on %s died; restarting it", dead, self.data_dir)
            self._restart()

    def _restart(self) -> None:
        wait_s = self._backoff_s
        attempt = 0
        while not self._stop.is_set():
            attempt += 1
            self._attempt = attempt
            try:
                server = start_embedded(self.data_dir, stop_at_exit=self._stop_at_exit)
            except Exception as exc:
                log.warning(
                    "restart %d of the embedded PostgreSQL failed (%s); next in %.1f s",
                    attempt,
                    exc,
                    wait_s,
                )
                self._on_attempt(False)
                if self._stop.wait(wait_s):
                    break
                wait_s = min(wait_s * 2, self._backoff_max_s)
                continue
            self.restarts += 1
            self._on_attempt(True)
            log.warning(
                "embedded PostgreSQL on %s is back as pid %d after %d attempt(s)",
                self.data_dir,
                server.pid,
                attempt,
            )
            break
        self._attempt = 0
