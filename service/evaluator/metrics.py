"""The evaluator's observer, recording into the service's Prometheus metrics.

Per experiment (``id@version``) and criterion: value, bound, threshold,
sample size and a one-hot status; per experiment: verdicts applied and the
rollback signal; per process: leadership and its fencing generation, ticks.
Only the leader sets experiment series; a replica that loses the lease
removes its series, so a dashboard can sum across replicas. An ended
experiment keeps its last values (the criterion that fired stays visible).

The metric families are defined once, in `ServiceMetrics` (``service/metrics.py``),
beside every other series of the service; this module only records into them, so a
name or help text cannot drift between two definitions.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

from prometheus_client import Gauge

from service.metrics import ServiceMetrics
from service.protocols import Action
from service.protocols.criteria import Evaluation, Status

_STATUSES = tuple(s.value for s in Status)


def _set(gauge: Gauge, labels: tuple[str, ...], value: float | None) -> None:
    gauge.labels(*labels).set(value if value is not None and math.isfinite(value) else math.nan)


class EvaluatorMetrics:
    """Implements `EvaluatorObserver` on the evaluator families of `ServiceMetrics`."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self._m = metrics
        self._criteria: dict[str, set[str]] = {}

    def on_leadership(self, leader: bool, generation: int) -> None:
        """Leader gauge and generation."""
        self._m.evaluator_leader.set(1 if leader else 0)
        self._m.evaluator_lease_generation.set(generation if leader else 0)

    def on_evaluations(self, experiment: str, judged: Sequence[Evaluation]) -> None:
        """Value, bound, threshold, samples and one-hot status per criterion."""
        names = self._criteria.setdefault(experiment, set())
        for e in judged:
            labels = (experiment, e.name)
            names.add(e.name)
            _set(self._m.experiment_criterion_value, labels, e.value)
            _set(self._m.experiment_criterion_bound, labels, e.bound)
            _set(self._m.experiment_criterion_threshold, labels, e.threshold)
            self._m.experiment_criterion_samples.labels(*labels).set(e.n)
            for status in _STATUSES:
                self._m.experiment_criterion_status.labels(*labels, status).set(
                    1 if status == e.status.value else 0
                )

    def on_transition(self, experiment: str, action: Action, criterion: str, state: str) -> None:
        """Count the verdict; raise the rollback signal."""
        self._m.experiment_transitions.labels(experiment, action.value, criterion).inc()
        if action is Action.SIGNAL_ROLLBACK:
            self._m.experiment_rollback_signalled.labels(experiment).set(1)

    def on_refused(self, experiment: str, reason: str) -> None:
        """Count the refusal."""
        self._m.evaluator_refused.labels(reason).inc()

    def on_tick(self, seconds: float, result: str) -> None:
        """Count the tick and its duration."""
        self._m.evaluator_ticks.labels(result).inc()
        self._m.evaluator_tick_seconds.observe(seconds)

    def forget(self, experiment: str) -> None:
        """Remove the experiment's series (this replica lost the lease)."""
        for name in self._criteria.pop(experiment, set()):
            labels = (experiment, name)
            for gauge in (
                self._m.experiment_criterion_value,
                self._m.experiment_criterion_bound,
                self._m.experiment_criterion_threshold,
                self._m.experiment_criterion_samples,
            ):
                _remove(gauge, labels)
            for status in _STATUSES:
                _remove(self._m.experiment_criterion_status, (*labels, status))


def _remove(gauge: Gauge, labels: tuple[str, ...]) -> None:
    with contextlib.suppress(KeyError):
        gauge.remove(*labels)
