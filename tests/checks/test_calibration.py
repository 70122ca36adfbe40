"""Calibration core on known distributions: PIT, coverage, histogram, Holm, the flag rule.

Outcomes are drawn from a known log-normal per row and the predictor's
quantiles are that distribution's exact quantiles (calibrated) or a distortion
of them, so every expected figure follows from scipy, not from the code under test.
"""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from service.checks import calibration as cal
from service.contract import InvalidInput

TAUS = (0.1, 0.5, 0.9)


def lognormal(
    n: int, seed: int, sigma: float = 0.4
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Per-row log-normal outcomes, their exact 10/50/90% quantiles, and each row's mu."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(2.0, 1.0, n)
    y = np.exp(mu + sigma * rng.standard_normal(n))
    q = np.exp(mu[:, None] + sigma * stats.norm.ppf(np.array(TAUS))[None, :])
    return q, y, mu


def test_pit_of_a_split_lognormal_is_its_cdf() -> None:
    q, y, mu = lognormal(2000, seed=1)
    u = cal.pit(TAUS, q, y)
    expected = stats.norm.cdf((np.log(y) - mu) / 0.4)
    np.testing.assert_allclose(u, expected, atol=1e-6)


def test_pit_on_the_linear_scale_with_five_quantiles_matches_a_normal() -> None:
    rng = np.random.default_rng(2)
    taus = (0.05, 0.25, 0.5, 0.75, 0.95)
    mu = rng.normal(0, 3, 500)
    y = mu + rng.standard_normal(500)
    q = mu[:, None] + stats.norm.ppf(np.array(taus))[None, :]
    u = cal.pit(taus, q, y, log_scale=False)
    np.testing.assert_allclose(u, stats.norm.cdf(y - mu), atol=1e-6)


def test_coverage_of_a_calibrated_predictor_is_within_its_exact_interval() -> None:
    q, y, _ = lognormal(5000, seed=3)
    u = cal.pit(TAUS, q, y)
    for level in cal.LEVELS:
        c = cal.coverage(u, level, TAUS, confidence=0.999)
        assert c.interval is not None and c.interval.contains(level), c
        assert c.exact == (level == 0.8)
        ref = stats.binomtest(c.covered, c.n, level)
        assert c.p_value == pytest.approx(ref.pvalue)


def test_coverage_of_a_shrunk_interval_matches_the_true_probability() -> None:
    q, y, _ = lognormal(20000, seed=4)
    half = np.exp(np.log(q[:, [1]]) + 0.5 * (np.log(q) - np.log(q[:, [1]])))
    c = cal.coverage(cal.pit(TAUS, half, y), 0.8, TAUS)
    truth = 2 * stats.norm.cdf(0.5 * stats.norm.ppf(0.9)) - 1  # P(|Z| <= z90 / 2)
    assert c.observed == pytest.approx(truth, abs=0.01)
    assert c.interval is not None and c.interval.contains(truth)


def test_pit_histogram_is_uniform_when_calibrated_and_not_when_shifted() -> None:
    q, y, _ = lognormal(3000, seed=5)
    calibrated = cal.pit_histogram(cal.pit(TAUS, q, y), bins=10)
    assert calibrated.counts.sum() == 3000 and calibrated.p_value > 0.001
    shifted = cal.pit_histogram(cal.pit(TAUS, q * 1.3, y), bins=10)
    assert shifted.p_value < 1e-6
    assert shifted.statistic == pytest.approx(stats.chisquare(shifted.counts).statistic)


def test_holm_matches_the_step_down_rule() -> None:
    p = [0.01, 0.04, 0.03, 0.5]
    # sorted 0.01 <= 0.05/4, 0.03 > 0.05/3: only the first is rejected
    assert cal.holm(p, 0.05).tolist() == [True, False, False, False]
    assert cal.holm([0.001, 0.012, 0.02], 0.05).tolist() == [True, True, True]


def test_flag_rule_false_flag_rate_is_controlled_on_independent_rows() -> None:
    """Independent rows: with no design effect, Holm keeps false flags near or below alpha."""
    flags = []
    for seed in range(400):
        q, y, _ = lognormal(150, seed=1000 + seed)
        u = cal.pit(TAUS, q, y)
        flags.append(cal.flag_window(u, TAUS, alpha=0.05, design_effect=1.0).flagged)
    rate = float(np.mean(flags))
    assert rate <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 400), rate


def test_flag_rule_has_power_against_shrinking_and_shifting() -> None:
    shrunk, shifted = [], []
    for seed in range(100):
        q, y, _ = lognormal(300, seed=5000 + seed)
        med = q[:, [1]]
        shrunk.append(cal.flag_window(cal.pit(TAUS, med * (q / med) ** 0.5, y), TAUS).flagged)
        shifted.append(cal.flag_window(cal.pit(TAUS, q * 1.35, y), TAUS).flagged)
    assert np.mean(shrunk) >= 0.95 and np.mean(shifted) >= 0.95


def test_a_small_window_is_not_flagged_and_says_why() -> None:
    q, y, _ = lognormal(10, seed=6)
    flag = cal.flag_window(cal.pit(TAUS, q * 10, y), TAUS, min_outcomes=20)
    assert not flag.flagged and "too few outcomes" in flag.reason


def test_reliability_bins_follow_the_predicted_median() -> None:
    q, y, _ = lognormal(4000, seed=7)
    r = cal.reliability(TAUS, q, y, bins=8)
    assert r.n.sum() == 4000 and len(r.n) == 8
    assert np.all(np.diff(r.predicted) > 0)
    np.testing.assert_allclose(r.below, 0.5, atol=0.06)
    np.testing.assert_allclose(r.coverage, 0.8, atol=0.06)
    biased = cal.reliability(TAUS, q * 1.5, y, bins=8)
    np.testing.assert_allclose(biased.log_error, -np.log(1.5), atol=0.06)


def test_by_slice_reports_each_key_and_finds_the_bad_one() -> None:
    q, y, _ = lognormal(1200, seed=8)
    keys = np.array(["a", "b", "c"] * 400)
    q = q.copy()
    q[keys == "c"] *= 1.6
    reports = cal.by_slice(keys, TAUS, q, y)
    assert sorted(reports) == ["a", "b", "c"]
    assert [reports[k].n for k in "abc"] == [400, 400, 400]
    assert reports["c"].flag.flagged and not reports["a"].flag.flagged


@pytest.mark.parametrize(
    ("taus", "q", "y", "field"),
    [
        ((0.5,), np.ones((3, 1)), np.ones(3), "taus"),
        ((0.9, 0.1), np.ones((3, 2)), np.ones(3), "taus"),
        (TAUS, np.ones((3, 2)), np.ones(3), "quantiles"),
        (TAUS, np.ones((3, 3)), np.ones(4), "outcome"),
        (TAUS, np.full((3, 3), np.nan), np.ones(3), "quantiles"),
        (TAUS, np.ones((3, 3)), -np.ones(3), "outcome"),
    ],
)
def test_bad_input_names_the_field(
    taus: tuple[float, ...], q: NDArray[np.float64], y: NDArray[np.float64], field: str
) -> None:
    with pytest.raises(InvalidInput) as err:
        cal.pit(taus, q, y)
    assert err.value.field == field


def test_flag_rule_refuses_bad_parameters() -> None:
    u = np.full(50, 0.5)
    with pytest.raises(InvalidInput, match="alpha"):
        cal.flag_window(u, TAUS, alpha=1.5)
    with pytest.raises(InvalidInput, match="design_effect"):
        cal.flag_window(u, TAUS, design_effect=0.5)
