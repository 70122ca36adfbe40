"""Wires the reviewer guard into the service: settings in, metrics out (docs/reviewer.md).

Kept beside the other ``*_wiring`` modules so the composition root stays a list
of calls: the guard itself (``service.storage.reviewer.guard``) knows nothing of
settings or Prometheus.
"""

from __future__ import annotations

from service.server.runtime import Service
from service.storage.reviewer.guard import ReviewerGuard, ReviewerGuardLoop, Sweep


def wire_reviewer_guard(service: Service) -> None:
    """Give `service` a reviewer guard loop unless ``reviewer_guard_interval_s`` is 0."""
    settings, metrics = service.settings, service.metrics
    if service.engine is None or settings.reviewer_guard_interval_s <= 0:
        return
    guard = ReviewerGuard(
        service.engine,
        transaction_limit_s=settings.reviewer_transaction_limit_s,
        idle_limit_s=settings.reviewer_idle_limit_s,
    )

    def report(sweep: Sweep) -> None:
        for reason, n in sweep.terminated.items():
            metrics.reviewer_sessions_ended.labels(reason).inc(n)
        if sweep.settings_restored:
            metrics.reviewer_role_settings_restored.inc()

    service.reviewer_guard = ReviewerGuardLoop(
        guard, settings.reviewer_guard_interval_s, report, metrics.reviewer_guard_failures.inc
    )
