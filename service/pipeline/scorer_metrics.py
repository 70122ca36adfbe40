"""The scorer's observer, recording into `ServiceMetrics`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from service.metrics import ServiceMetrics
from service.pipeline.quarantine import QuarantineEvent
from service.pipeline.scorer import SinkResult
from service.pipeline.scoring import ScoredDecision
from service.policies.runner import PolicyRun


class ScorerMetrics:
    """Implements `ScorerObserver` on the service's metrics."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self._m = metrics

    def on_batch(
        self, size: int, runs: Sequence[PolicyRun], decisions: Sequence[ScoredDecision]
    ) -> None:
        """Batch size, per-policy latency, decisions by status, agreement, infeasible favourites."""
        if size:
            self._m.batch_size.observe(size)
        for run in runs:
            self._m.policy_latency.labels(run.policy).observe(run.latency_s)
        by_status = Counter((d.policy, d.status.value) for d in decisions)
        for (policy, status), n in by_status.items():
            self._m.decisions.labels(policy, status).inc(n)
        agreement = Counter(
            (d.policy, str(d.agrees_with_production).lower())
            for d in decisions
            if d.agrees_with_production is not None
        )
        for (policy, agrees), n in agreement.items():
            self._m.agreement.labels(policy, agrees).inc(n)
        infeasible = Counter(d.policy for d in decisions if d.raw_favourite_infeasible)
        for policy, n in infeasible.items():
            self._m.raw_favourite_infeasible.labels(policy).inc(n)

    def on_write(self, seconds: float, result: SinkResult | None, error: str | None) -> None:
        """Write outcome, latency, rows and outcome join states.

        Not `understudy_db_up`: a write says nothing while the log is idle, and one
        that hangs on a frozen database says nothing at all; the bounded readiness
        probe sets it (`service.storage.db_probe`).
        """
        if result is None:
            self._m.db_writes.labels("error").inc()
            return
        self._m.db_writes.labels("ok").inc()
        self._m.db_write_latency.observe(seconds)
        self._m.db_rows.labels("requests").inc(result.requests_inserted)
        self._m.db_rows.labels("decisions").inc(result.decisions_inserted)
        self._m.db_duplicates.inc(result.duplicates)
        self._m.request_conflicts.labels("writer").inc(result.request_conflicts)
        self._m.outcomes.labels("joined_on_arrival").inc(result.outcomes_joined)
        self._m.outcomes.labels("parked").inc(result.outcomes_parked)
        self._m.outcomes.labels("joined_from_parked").inc(result.outcomes_joined_from_parked)
        for delay in result.outcome_delays_s:
            self._m.outcome_delay.observe(delay)

    def on_quarantine(self, event: QuarantineEvent) -> None:
        """Count the transition and flip the per-policy gauge."""
        self._m.quarantine_events.labels(event.policy, event.event).inc()
        self._m.quarantined.labels(event.policy).set(0 if event.event == "released" else 1)

    def on_dead_letter(self, kind: str) -> None:
        """Count a record set aside because the log refused it."""
        self._m.dead_letters.labels(kind).inc()
