"""The calibration monitor's publishing rules, fed by a source that implements its interface.

The source is a plain function returning rows shaped like
`service.storage.reads.calibration.CalibrationRows` (the `WindowRows`
protocol); the values published are checked against the calibration core
run independently on the same rows. The database path is covered by
``test_calibration_live.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry
from scipy import stats

from service.checks.calibration import LEVELS, coverage, pit
from service.contract.errors import Unavailable
from service.evaluator.calibration_monitor import CalibrationMonitor, WindowRows, level_label
from service.metrics import ServiceMetrics

TAUS = (0.1, 0.5, 0.9)


@dataclass(frozen=True)
class Rows:
    policy: str
    taus: tuple[float, ...]
    quantiles: NDArray[np.float64]
    outcome: NDArray[np.float64]


def rows(policy: str, n: int, seed: int, scale: float = 1.0) -> Rows:
    rng = np.random.default_rng(seed)
    mu = rng.normal(1.0, 0.5, n)
    q = np.exp(mu[:, None] + 0.3 * stats.norm.ppf(np.array(TAUS))[None, :] * scale)
    y = np.exp(mu + 0.3 * rng.standard_normal(n))
    return Rows(policy, TAUS, q, y)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def value(m: ServiceMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_series_exist_before_the_first_window_and_follow_each_window() -> None:
    m = ServiceMetrics(CollectorRegistry())
    clock = Clock()
    feed: list[Sequence[WindowRows]] = [[]]
    asked: list[float] = []

    def source(since: float) -> Sequence[WindowRows]:
        asked.append(since)
        return feed[0]

    monitor = CalibrationMonitor(
        ["a", "b"], source, m, window_s=600.0, interval_s=60.0, clock=clock
    )
    for p in ("a", "b"):
        assert value(m, "understudy_calibration_flagged", policy=p) == 0
        assert value(m, "understudy_calibration_outcomes", policy=p) == 0
        for level in LEVELS:
            got = value(m, "understudy_calibration_coverage", policy=p, level=level_label(level))
            assert got is not None and math.isnan(got)

    good, bad_v1, bad_v2 = rows("a", 400, 1), rows("b", 150, 2, 0.4), rows("b", 150, 3, 0.4)
    feed[0] = [good, bad_v1, bad_v2]
    monitor.maybe_run()
    assert asked == [1000.0 - 600.0]
    u = pit(TAUS, good.quantiles, good.outcome)
    for level in LEVELS:
        got = value(m, "understudy_calibration_coverage", policy="a", level=level_label(level))
        assert got == coverage(u, level, TAUS).observed
    assert value(m, "understudy_calibration_outcomes", policy="b") == 300  # versions pooled
    assert value(m, "understudy_calibration_flagged", policy="a") == 0
    assert value(m, "understudy_calibration_flagged", policy="b") == 1

    clock.now += 30.0
    monitor.maybe_run()  # not due
    assert len(asked) == 1
    clock.now += 30.0
    feed[0] = []
    monitor.maybe_run()
    assert len(asked) == 2
    assert value(m, "understudy_calibration_outcomes", policy="b") == 0
    assert value(m, "understudy_calibration_flagged", policy="b") == 0


@pytest.mark.parametrize("error", [Unavailable("db down"), RuntimeError("bug")])
def test_a_failed_read_keeps_the_last_values_and_never_raises(error: Exception) -> None:
    m = ServiceMetrics(CollectorRegistry())
    clock = Clock()
    state: dict[str, Exception | None] = {"error": None}
    data = rows("a", 200, 4)

    def source(since: float) -> Sequence[WindowRows]:
        if state["error"] is not None:
            raise state["error"]
        return [data]

    monitor = CalibrationMonitor(["a"], source, m, window_s=60.0, interval_s=1.0, clock=clock)
    monitor.maybe_run()
    before = value(m, "understudy_calibration_coverage", policy="a", level="0.8")
    assert before is not None and not math.isnan(before)
    state["error"] = error
    clock.now += 5.0
    monitor.maybe_run()
    assert value(m, "understudy_calibration_coverage", policy="a", level="0.8") == before
    assert value(m, "understudy_calibration_outcomes", policy="a") == 200
