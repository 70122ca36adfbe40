"""Live outcome drift: placed jobs' throughput against each policy's training episodes.

The feature and arrival checks (`service.evaluator.drift_monitor`) run on the
scorer thread over the inputs; this one needs the *outcomes*, which Runtime
reports long after the request, joined with their requests in the decision
log. So it runs like the calibration check: every `interval_s`, as a step of
the evaluator loop (`service.evaluator.calibration_monitor.CalibrationStep`
takes any periodic check), it reads the outcomes received in the last
`window_s` (newest `MAX_WINDOW_OUTCOMES`), and publishes per policy with an
outcome reference (`service.checks.outcome_drift`):

- ``understudy_drift_outcome_flagged{policy}``: the calibrated window rule;
- ``understudy_drift_outcome_shift{policy,hardware}``: ``m_h``, log units;
- ``understudy_drift_outcome_residuals{policy}``: outcomes compared.

Policies trained on the same episodes share one reference; the read is done
once per run for all of them. A failed read leaves the last values.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping

from service.checks.outcome_drift import OutcomeWindow, check_window, outcome_rows
from service.contract import MirrorRequest, Outcome
from service.evaluator.calibration_monitor import PeriodicMonitor
from service.metrics import ServiceMetrics
from service.policies.outcome_summary import OutcomeSummary

log = logging.getLogger(__name__)

OutcomeSource = Callable[[float], tuple[list[MirrorRequest], dict[str, Outcome]]]
"""Requests and their outcomes, for outcomes received since a Unix time."""
MAX_WINDOW_OUTCOMES = 20_000
"""Most outcomes read per check (the newest); the largest calibrated window is 2,000."""


class OutcomeDriftMonitor(PeriodicMonitor):
    """Reads the last window and sets the outcome-drift gauges (module docstring)."""

    check = "outcome drift check"

    def __init__(
        self,
        summaries: Mapping[str, OutcomeSummary],
        source: OutcomeSource,
        metrics: ServiceMetrics,
        *,
        window_s: float,
        interval_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(window_s=window_s, interval_s=interval_s, clock=clock)
        self.summaries = dict(summaries)
        self.source = source
        self._m = metrics
        self.last: dict[str, OutcomeWindow] = {}
        for policy, summary in self.summaries.items():
            metrics.drift_outcome_flagged.labels(policy).set(0)
            metrics.drift_outcome_residuals.labels(policy).set(0)
            for hardware in summary.reference.hardware_classes:
                metrics.drift_outcome_shift.labels(policy, hardware).set(math.nan)

    @property
    def policies(self) -> tuple[str, ...]:
        """Policies checked."""
        return tuple(self.summaries)

    def run_once(self) -> None:
        """Read the window ending now and publish; `Unavailable` propagates."""
        now = self._clock()
        self._last_run = now
        requests, outcomes = self.source(now - self.window_s)
        rows = outcome_rows(requests, outcomes)
        for policy, summary in self.summaries.items():
            window = check_window(summary.reference, summary.rules, rows)
            self._publish(policy, window)

    def _publish(self, policy: str, w: OutcomeWindow) -> None:
        m = self._m
        m.drift_outcome_flagged.labels(policy).set(1 if w.flagged else 0)
        m.drift_outcome_residuals.labels(policy).set(w.n_residuals)
        for hardware, median in zip(w.classes, w.medians.tolist(), strict=True):
            m.drift_outcome_shift.labels(policy, hardware).set(median)
        self.last[policy] = w
        if w.flagged:
            shifts = ", ".join(
                f"{h} {v:+.2f}" for h, v in zip(w.classes, w.medians.tolist(), strict=True)
            )
            log.warning(
                "outcome drift flagged for %s: T=%.2f vs %.2f over %d outcomes; log-throughput"
                " shift per hardware class: %s",
                policy,
                w.statistic,
                w.threshold,
                w.n_residuals,
                shifts,
            )
