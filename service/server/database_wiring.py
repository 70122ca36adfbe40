"""Database health wiring: the bounded probe, `understudy_db_up`, the embedded server's watch.

Kept out of `service.server.app` so the composition root only says "wire the
database's health" (docs/reliability.md):

* the ``database`` readiness check is `DatabaseProbe.check` on its own
  one-connection engine, bounded by the readiness round;
* `understudy_db_up` follows every readiness round: 1 when the probe
  answered in time, 0 when it failed or did not answer;
* when the service owns (or reuses) the embedded PostgreSQL, an
  `EmbeddedWatch` restarts its postmaster if it dies, counted in
  `understudy_embedded_db_restarts_total`; the ``database`` check says
  "restarting (attempt N)" meanwhile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.readiness import CheckResult
from service.storage.db_probe import CHECK_NAME, DatabaseProbe
from service.storage.embedded_watch import EmbeddedWatch

if TYPE_CHECKING:
    from service.server.runtime import Service


def wire_database_health(service: Service, database_url: str) -> None:
    """Register the ``database`` check and db_up on `service`; add the embedded watch."""
    settings, metrics = service.settings, service.metrics
    watch: EmbeddedWatch | None = None
    if service.embedded_db is not None and settings.embedded_db_watch_interval_s > 0:
        restarts = metrics.embedded_db_restarts
        watch = EmbeddedWatch(
            service.embedded_db.data_dir,
            lambda ok: restarts.labels("ok" if ok else "failed").inc(),
            interval_s=settings.embedded_db_watch_interval_s,
        )
        service.embedded_watch = watch
    probe = DatabaseProbe(
        database_url,
        timeout_s=settings.readiness_check_timeout_s,
        override=None if watch is None else watch.status,
    )
    service.db_probe = probe
    service.readiness.register(CHECK_NAME, probe.check)

    def db_up(results: list[CheckResult]) -> None:
        mine = next((r for r in results if r.name == CHECK_NAME), None)
        if mine is not None:
            metrics.db_up.set(probe.up(mine.answered))

    service.readiness.subscribe(db_up)
