"""The evaluator's observer, recording into the service's Prometheus metrics.

Per experiment (``id@version``) and criterion: value, bound, threshold,
sample size and a one-hot status; per experiment: verdicts applied and the
rollback signal; per process: leadership and its fencing generation, ticks.
Only the leader sets experiment series; a replica that loses the lease
removes its series, so a dashboard can sum across replicas. An ended
experiment keeps its last values (the criterion that fired stays visible).

The metric objects belong to `ServiceMetrics` (``service/metrics.py``);
`EvaluatorMetricFamilies` is the attribute set this observer needs, and
`evaluator_families` makes them on the service's registry when that
`ServiceMetrics` does not define them yet.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from service.protocols import Action
from service.protocols.criteria import Evaluation, Status

_STATUSES = tuple(s.value for s in Status)


class EvaluatorMetricFamilies(Protocol):
    """The metrics the evaluator records (attributes of `ServiceMetrics`)."""

    @property
    def experiment_criterion_value(self) -> Gauge: ...
    @property
    def experiment_criterion_bound(self) -> Gauge: ...
    @property
    def experiment_criterion_threshold(self) -> Gauge: ...
    @property
    def experiment_criterion_samples(self) -> Gauge: ...
    @property
    def experiment_criterion_status(self) -> Gauge: ...
    @property
    def experiment_transitions(self) -> Counter: ...
    @property
    def experiment_rollback_signalled(self) -> Gauge: ...
    @property
    def evaluator_leader(self) -> Gauge: ...
    @property
    def evaluator_lease_generation(self) -> Gauge: ...
    @property
    def evaluator_ticks(self) -> Counter: ...
    @property
    def evaluator_tick_seconds(self) -> Histogram: ...
    @property
    def evaluator_refused(self) -> Counter: ...


@dataclass(frozen=True)
class EvaluatorGauges:
    """The families, made here (same names and help as in `ServiceMetrics`)."""

    experiment_criterion_value: Gauge
    experiment_criterion_bound: Gauge
    experiment_criterion_threshold: Gauge
    experiment_criterion_samples: Gauge
    experiment_criterion_status: Gauge
    experiment_transitions: Counter
    experiment_rollback_signalled: Gauge
    evaluator_leader: Gauge
    evaluator_lease_generation: Gauge
    evaluator_ticks: Counter
    evaluator_tick_seconds: Histogram
    evaluator_refused: Counter

    @staticmethod
    def register(registry: CollectorRegistry) -> EvaluatorGauges:
        """Create every family on `registry`."""
        ec = ["experiment", "criterion"]
        return EvaluatorGauges(
            experiment_criterion_value=Gauge(
                "understudy_experiment_criterion_value",
                "Latest estimate per experiment and criterion, in the metric's units (for "
                "baseline criteria the difference candidate minus baseline).",
                ec,
                registry=registry,
            ),
            experiment_criterion_bound=Gauge(
                "understudy_experiment_criterion_bound",
                "The anytime-valid bound each criterion compares with its threshold.",
                ec,
                registry=registry,
            ),
            experiment_criterion_threshold=Gauge(
                "understudy_experiment_criterion_threshold",
                "Each criterion's threshold, signed, in the metric's units.",
                ec,
                registry=registry,
            ),
            experiment_criterion_samples=Gauge(
                "understudy_experiment_criterion_samples",
                "Samples behind each criterion's latest evaluation.",
                ec,
                registry=registry,
            ),
            experiment_criterion_status=Gauge(
                "understudy_experiment_criterion_status",
                "1 for each criterion's current status (insufficient, pending, fired, passed, "
                "failed, not_identifiable, unavailable), 0 for the others.",
                [*ec, "status"],
                registry=registry,
            ),
            experiment_transitions=Counter(
                "understudy_experiment_transitions",
                "Verdicts the evaluator applied, by experiment, action and criterion.",
                ["experiment", "action", "criterion"],
                registry=registry,
            ),
            experiment_rollback_signalled=Gauge(
                "understudy_experiment_rollback_signalled",
                "1 once the evaluator signalled rollback of an online experiment (a signal "
                "for Runtime and Safety; Understudy never acts).",
                ["experiment"],
                registry=registry,
            ),
            evaluator_leader=Gauge(
                "understudy_evaluator_leader",
                "1 while this replica holds the evaluator lease.",
                registry=registry,
            ),
            evaluator_lease_generation=Gauge(
                "understudy_evaluator_lease_generation",
                "Fencing generation of the lease this replica holds (0 when it does not).",
                registry=registry,
            ),
            evaluator_ticks=Counter(
                "understudy_evaluator_ticks",
                "Evaluator loop iterations by result (evaluated, follower, error).",
                ["result"],
                registry=registry,
            ),
            evaluator_tick_seconds=Histogram(
                "understudy_evaluator_tick_seconds",
                "Wall time of one evaluator tick.",
                buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
                registry=registry,
            ),
            evaluator_refused=Counter(
                "understudy_evaluator_refused",
                "Verdicts or evaluation writes refused, by reason (lease: the lease moved; "
                "conflict: the protocol moved).",
                ["reason"],
                registry=registry,
            ),
        )


def evaluator_families(metrics: object, registry: CollectorRegistry) -> EvaluatorMetricFamilies:
    """The families `metrics` (`ServiceMetrics`) defines, else made on `registry` once."""
    if hasattr(metrics, "experiment_criterion_value"):
        return metrics  # type: ignore[return-value]
    made = getattr(metrics, "_evaluator_families", None)
    if isinstance(made, EvaluatorGauges):
        return made
    made = EvaluatorGauges.register(registry)
    setattr(metrics, "_evaluator_families", made)  # noqa: B010 - one set per registry
    return made


def _set(gauge: Gauge, labels: tuple[str, ...], value: float | None) -> None:
    gauge.labels(*labels).set(value if value is not None and math.isfinite(value) else math.nan)


class EvaluatorMetrics:
    """Implements `EvaluatorObserver` on the metric families."""

    def __init__(self, families: EvaluatorMetricFamilies) -> None:
        self._m = families
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
