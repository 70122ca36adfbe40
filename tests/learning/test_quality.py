"""Pinball loss, coverage, group baselines and seed intervals against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from service.learning.compare import verdict
from service.learning.quality import LEVELS, GroupBaseline, coverage, pinball, quality_figures
from service.learning.stats import dumps, interval_dict, interval_from_dict, over_seeds, rounded
from service.ope import Interval, IntervalMethod


def test_pinball_by_hand() -> None:
    y = np.array([1.0, 2.0])
    q = np.array([[0.0, 1.0, 2.0], [2.0, 2.0, 2.0]])
    # row 0: 0.1*1, 0, 0.1*1 (q90 above y: (0.9-1)*(1-2)); row 1: 0.9*0... all zero
    expect = (0.1 + 0.0 + 0.1 + 0.0 + 0.0 + 0.0) / 6
    assert pinball(y, q) == pytest.approx(expect)
    assert pinball(y, np.repeat(y[:, None], 3, axis=1)) == 0.0


def test_the_true_quantiles_minimise_expected_pinball() -> None:
    rng = np.random.default_rng(0)
    y = rng.normal(size=20_000)
    true = np.tile(sps.norm.ppf(LEVELS), (len(y), 1))
    assert pinball(y, true) < pinball(y, true * 1.3) and pinball(y, true) < pinball(y, true + 0.2)
    assert coverage(y, true[:, 0], true[:, 2]) == pytest.approx(0.8, abs=0.01)


@pytest.mark.parametrize(
    ("q", "message"),
    [(np.zeros((2, 2)), r"`q` must have shape \(2, 3\), got \(2, 2\)"),
     (np.zeros((3, 3)), r"`q` must have shape \(2, 3\), got \(3, 3\)")],
)  # fmt: skip
def test_pinball_refuses_misshapen_quantiles(q: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pinball(np.zeros(2), q)


def test_group_baselines_fall_back_to_job_type_then_everything() -> None:
    types = np.array(["a", "a", "a", "b"])
    hw = np.array(["K80", "K80", "V100", "K80"])
    y = np.array([1.0, 3.0, 10.0, 5.0])
    mean = GroupBaseline.fit(types, hw, y, "mean")
    pred, fell_back = mean.predict(np.array(["a", "a", "c"]), np.array(["K80", "P100", "K80"]))
    np.testing.assert_allclose(pred[:, 1], [2.0, 14.0 / 3.0, 19.0 / 4.0])
    assert fell_back == 2
    quant = GroupBaseline.fit(types, hw, y, "quantiles")
    np.testing.assert_allclose(quant.by_group[("a", "K80")], np.quantile([1.0, 3.0], LEVELS))
    with pytest.raises(ValueError, match="`statistic` must be 'mean' or 'quantiles', got 'mode'"):
        GroupBaseline.fit(types, hw, y, "mode")


def test_quality_figures_report_ratios_against_each_baseline() -> None:
    types, hw = np.array(["a"] * 4), np.array(["K80"] * 4)
    y = np.array([0.0, 1.0, 2.0, 3.0])
    base = [GroupBaseline.fit(types, hw, y, s) for s in ("mean", "quantiles")]
    perfect = np.repeat(y[:, None], 3, axis=1)
    f = quality_figures(y, perfect, base, types, hw)
    assert f["pinball_loss"] == 0.0 and f["interval_coverage"] == 1.0
    assert f["pinball_ratio_vs_group_mean"] == 0.0 and f["pinball_ratio_vs_group_quantiles"] == 0.0


def test_seed_intervals_are_student_t() -> None:
    values = [0.1, 0.3, 0.2, 0.6]
    mean, i = over_seeds(values)
    half = sps.t.ppf(0.975, 3) * np.std(values, ddof=1) / 2
    assert mean == pytest.approx(0.3) and i.n == 4
    assert i.lower == pytest.approx(0.3 - half) and i.upper == pytest.approx(0.3 + half)
    assert i.method is IntervalMethod.STUDENT_T and i.level == 0.95
    assert over_seeds([0.5]) == (0.5, Interval.unbounded(0.95, IntervalMethod.STUDENT_T, 1))
    assert over_seeds([math.nan])[1].n == 0
    t = IntervalMethod.STUDENT_T
    assert Interval(0.5, 1.5, 0.95, t, 3).sign == 1 and Interval(-2.0, -0.1, 0.95, t, 3).sign == -1
    assert Interval(-1.0, 1.0, 0.95, t, 3).sign == 0 and over_seeds([1.0])[1].sign == 0


def test_seed_interval_json_has_null_ends_without_an_interval_and_round_trips() -> None:
    assert interval_dict(*over_seeds([0.5])) == {"mean": 0.5, "lo": None, "hi": None, "n": 1}
    assert interval_dict(*over_seeds([])) == {"mean": None, "lo": None, "hi": None, "n": 0}
    doc = interval_dict(*over_seeds([0.1, 0.3, 0.2, 0.6]))
    assert doc["mean"] == 0.3 and doc["n"] == 4 and doc["lo"] < 0.3 < doc["hi"]
    back = interval_from_dict(doc)
    assert (back.lower, back.upper, back.n) == (doc["lo"], doc["hi"], 4)
    assert interval_from_dict(interval_dict(*over_seeds([0.5]))).sign == 0
    assert verdict(interval_dict(*over_seeds([1.0, 1.1, 1.2]))) == "wins"
    assert verdict(interval_dict(*over_seeds([-1.0, -1.1, -1.2]))) == "loses"
    assert verdict(interval_dict(*over_seeds([-1.0, 1.0, 0.1]))) == "no difference"
    assert verdict(interval_dict(*over_seeds([1.0]))) == "no difference"


def test_json_is_canonical() -> None:
    assert rounded(-1e-9) == 0.0 and rounded(math.nan) is None and rounded(None) is None
    assert dumps({"b": 1, "a": [rounded(1 / 3)]}) == '{\n "a": [\n  0.333333\n ],\n "b": 1\n}\n'
