"""Live calibration: every predictor policy checked on the outcomes of the last window.

Every `interval_s`, `CalibrationMonitor.run_once` reads the predictions that
met their outcomes in the last `window_s` (outcomes *received* in the window:
jobs report long after their request) through a `CalibrationSource`, and
publishes per policy (``service.checks.calibration``):

- ``understudy_calibration_coverage{policy,level}``: coverage of the central
  interval at levels 0.5 / 0.8 / 0.9 (NaN when the window has no outcome);
- ``understudy_calibration_flagged{policy}``: the window flag rule;
- ``understudy_calibration_outcomes{policy}``: matched outcomes in the window.

Every label set exists from construction (coverage NaN, flagged 0, outcomes 0).

It runs as a step of the evaluator loop, not on a thread of its own: the
evaluator already owns a background thread with a start and a stop in the
service's lifecycle, so `CalibrationStep` wraps the evaluator's observer and
runs the monitor after a tick once `interval_s` has passed. It runs on every
replica (reads only; each replica's gauges then describe the same window),
and a failed read leaves the last values and never reaches the loop.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from service.checks.calibration import LEVELS, coverage, flag_window, pit
from service.contract import InvalidInput
from service.contract.errors import Unavailable
from service.evaluator.loop import EvaluatorObserver
from service.metrics import ServiceMetrics
from service.policies.registry import DEFAULT_PREDICTOR, Registry
from service.protocols import Action
from service.protocols.criteria import Evaluation

log = logging.getLogger(__name__)


class WindowRows(Protocol):
    """One policy version's matched rows (``service.storage.reads.calibration.CalibrationRows``)."""

    @property
    def policy(self) -> str:
        """The policy name (the metrics' `policy` label)."""
        ...

    @property
    def taus(self) -> tuple[float, ...]:
        """Quantile levels of `quantiles`' columns."""
        ...

    @property
    def quantiles(self) -> NDArray[np.float64]:
        """``(n, len(taus))`` predicted quantiles."""
        ...

    @property
    def outcome(self) -> NDArray[np.float64]:
        """``(n,)`` outcomes."""
        ...


CalibrationSource = Callable[[float], Sequence[WindowRows]]
"""Matched rows of every predictor policy for outcomes received since a Unix time."""
MAX_WINDOW_ROWS = 50_000
"""Most joined predictions read per policy and check (the newest): bounds the read on a
busy log; 50,000 outcomes measure coverage to about +-0.6 points already."""


def level_label(level: float) -> str:
    """The `level` label: ``"0.5"``, ``"0.8"``, ``"0.9"``."""
    return f"{level:g}"


def predictor_policies(registry: Registry) -> tuple[str, ...]:
    """Policies whose decisions carry a predictor's quantiles, sorted.

    A manifest naming a `predictor`, a planner (its model is a predictor), and
    the throughput-greedy baseline when the default predictor is loaded.
    """
    names = {
        name
        for name, m in registry.manifests.items()
        if name in registry.policies and (m.predictor is not None or m.planning is not None)
    }
    if "throughput-greedy" in registry.policies and DEFAULT_PREDICTOR in registry.predictors:
        names.add("throughput-greedy")
    return tuple(sorted(names))


class PeriodicMonitor:
    """A check run at most every `interval_s` over the last `window_s`, from the evaluator
    loop: `maybe_run` never raises (a failed read is logged and leaves the last values).
    Subclasses implement `run_once`."""

    check = "periodic check"

    def __init__(
        self, *, window_s: float, interval_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        if window_s <= 0 or interval_s <= 0:
            raise InvalidInput("window_s", "and `interval_s` must be > 0")
        self.window_s = window_s
        self.interval_s = interval_s
        self._clock = clock
        self._last_run = -math.inf

    def due(self) -> bool:
        """Whether `interval_s` has passed since the last run."""
        return self._clock() - self._last_run >= self.interval_s

    def run_once(self) -> None:
        """Read the window ending now and publish; `Unavailable` propagates."""
        raise NotImplementedError

    def maybe_run(self) -> None:
        """Run if due; any failure is logged and leaves the last values."""
        if not self.due():
            return
        try:
            self.run_once()
        except Unavailable as err:
            log.warning("%s: database unavailable: %s", self.check, err)
        except Exception:  # the evaluator loop must survive whatever a check throws
            log.exception("%s failed", self.check)


class CalibrationMonitor(PeriodicMonitor):
    """Reads the last window and sets the calibration gauges (module docstring)."""

    check = "calibration check"

    def __init__(
        self,
        policies: Sequence[str],
        source: CalibrationSource,
        metrics: ServiceMetrics,
        *,
        window_s: float,
        interval_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(window_s=window_s, interval_s=interval_s, clock=clock)
        self.policies = tuple(policies)
        self.source = source
        self._m = metrics
        for policy in self.policies:
            for level in LEVELS:
                metrics.calibration_coverage.labels(policy, level_label(level)).set(math.nan)
            metrics.calibration_flagged.labels(policy).set(0)
            metrics.calibration_outcomes.labels(policy).set(0)

    def run_once(self) -> None:
        """Read the window ending now and publish; `Unavailable` propagates."""
        now = self._clock()
        self._last_run = now
        rows = self.source(now - self.window_s)
        for policy in self.policies:
            mine = [r for r in rows if r.policy == policy and len(r.outcome)]
            self._publish(policy, mine)

    def _publish(self, policy: str, rows: Sequence[WindowRows]) -> None:
        m = self._m
        if not rows:
            for level in LEVELS:
                m.calibration_coverage.labels(policy, level_label(level)).set(math.nan)
            m.calibration_flagged.labels(policy).set(0)
            m.calibration_outcomes.labels(policy).set(0)
            return
        taus = rows[0].taus
        same = [r for r in rows if r.taus == taus]  # versions with other levels: left out
        u = np.concatenate([pit(taus, r.quantiles, r.outcome) for r in same])
        for level in LEVELS:
            c = coverage(u, level, taus)
            m.calibration_coverage.labels(policy, level_label(level)).set(c.observed)
        flag = flag_window(u, taus)
        m.calibration_flagged.labels(policy).set(1 if flag.flagged else 0)
        m.calibration_outcomes.labels(policy).set(len(u))
        if flag.flagged:
            log.warning("calibration of %s flagged: %s", policy, flag.reason)


class PeriodicCheck(Protocol):
    """A check the evaluator loop runs after its ticks (calibration, outcome drift)."""

    def maybe_run(self) -> None:
        """Run if due; must never raise."""
        ...


class CalibrationStep:
    """An `EvaluatorObserver` that forwards to `inner` and runs the monitor after each tick.

    The monitor is any `PeriodicCheck`; steps nest for several checks."""

    def __init__(self, inner: EvaluatorObserver, monitor: PeriodicCheck) -> None:
        self.inner = inner
        self.monitor = monitor

    def on_leadership(self, leader: bool, generation: int) -> None:
        """Forwarded."""
        self.inner.on_leadership(leader, generation)

    def on_evaluations(self, experiment: str, judged: Sequence[Evaluation]) -> None:
        """Forwarded."""
        self.inner.on_evaluations(experiment, judged)

    def on_transition(self, experiment: str, action: Action, criterion: str, state: str) -> None:
        """Forwarded."""
        self.inner.on_transition(experiment, action, criterion, state)

    def on_refused(self, experiment: str, reason: str) -> None:
        """Forwarded."""
        self.inner.on_refused(experiment, reason)

    def on_tick(self, seconds: float, result: str) -> None:
        """Forwarded, then the calibration check when due."""
        self.inner.on_tick(seconds, result)
        self.monitor.maybe_run()

    def forget(self, experiment: str) -> None:
        """Forwarded."""
        self.inner.forget(experiment)
