"""Hand-computed small cases: every estimator, interval, diagnostic and sequence, exactly.

The four-round log (A = 3 actions), with w_t = pi(a_t|x_t) / pscore_t:

    t  a_t  pscore  r_t   pi(.|x_t)        q_hat(x_t, .)     w_t  q_pi   r - q_hat(a_t)
    0   0    0.5    1.0   (1, 0, 0)        (.8, .2, .5)      2    .8     .2
    1   1    0.25   0.0   (.5, .5, 0)      (.4, .6, 0)       2    .5    -.6
    2   2    0.5    1.0   (0, .5, .5)      (0, .4, .6)       1    .5     .4
    3   0    0.5    0.5   (0, 1, 0)        (.5, .5, .5)      0    .5     0

    IPS   = (2 + 0 + 1 + 0) / 4                 = 0.75
    SNIPS = 3 / (2 + 2 + 1 + 0)                 = 0.6
    DM    = (.8 + .5 + .5 + .5) / 4             = 0.575
    DR    = 0.575 + (.4 - 1.2 + .4 + 0) / 4     = 0.475
    SNDR  = 0.575 + (-.4) / 5                   = 0.495
    switch-DR (tau 1.5: rounds 2, 3 only) = 0.575 + (.4 + 0) / 4 = 0.675
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from service.contract import InvalidInput
from service.ope import (
    AsymptoticCS,
    BanditData,
    Basis,
    BettingCS,
    Bootstrap,
    Estimate,
    Estimator,
    IntervalMethod,
    NotIdentifiable,
    OffPolicyBettingCS,
    ProportionCS,
    asymptotic_rho,
    clopper_pearson,
    diagnostics,
    diagnostics_by_slice,
    estimate,
    estimate_by_slice,
    normal_interval,
    one_hot,
    round_values,
    screen_pscore,
)
from service.ope.intervals import resampled_values
from service.ope.kernels import parts

Z95 = stats.norm.ppf(0.975)


def small(**changes: object) -> BanditData:
    arrays: dict[str, object] = {
        "reward": np.array([1.0, 0.0, 1.0, 0.5]),
        "action": np.array([0, 1, 2, 0]),
        "pscore": np.array([0.5, 0.25, 0.5, 0.5]),
        "action_dist": np.array([[1, 0, 0], [0.5, 0.5, 0], [0, 0.5, 0.5], [0, 1, 0]], float),
        "estimated_rewards": np.array(
            [[0.8, 0.2, 0.5], [0.4, 0.6, 0.0], [0.0, 0.4, 0.6], [0.5, 0.5, 0.5]]
        ),
    }
    arrays.update(changes)
    return BanditData(**arrays)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("estimator", "tau", "value", "contributions"),
    [
        (Estimator.DM, 10.0, 0.575, [0.8, 0.5, 0.5, 0.5]),
        (Estimator.IPS, 10.0, 0.75, [2.0, 0.0, 1.0, 0.0]),
        # psi = V + w (r - V) / mean(w), V = 0.6, mean(w) = 1.25
        (Estimator.SNIPS, 10.0, 0.6, [1.24, -0.36, 0.92, 0.6]),
        (Estimator.DR, 10.0, 0.475, [1.2, -0.7, 0.9, 0.5]),
        # psi = q_pi + V_c + (c - V_c w) / 1.25, V_c = -0.08
        (Estimator.SNDR, 10.0, 0.495, [1.168, -0.412, 0.804, 0.42]),
        (Estimator.SWITCH_DR, 1.5, 0.675, [0.8, 0.5, 0.9, 0.5]),
    ],
)
def test_estimators_on_the_hand_computed_log(
    estimator: Estimator, tau: float, value: float, contributions: list[float]
) -> None:
    result = estimate(small(), estimator, tau=tau)
    assert isinstance(result, Estimate)
    assert result.value == pytest.approx(value, abs=1e-12)
    assert result.contributions is not None
    np.testing.assert_allclose(result.contributions, contributions, atol=1e-12)
    assert result.contributions.mean() == pytest.approx(value, abs=1e-12)
    sd = np.std(contributions, ddof=1)
    assert result.interval.lower == pytest.approx(value - Z95 * sd / 2, abs=1e-12)
    assert result.interval.upper == pytest.approx(value + Z95 * sd / 2, abs=1e-12)
    assert result.interval.method is IntervalMethod.NORMAL and result.n == 4
    expected_basis = {
        Estimator.DM: Basis.MODEL_BASED,
        Estimator.IPS: Basis.IMPORTANCE_WEIGHTED,
        Estimator.SNIPS: Basis.IMPORTANCE_WEIGHTED,
    }.get(estimator, Basis.DOUBLY_ROBUST)
    assert result.basis is expected_basis


def test_the_ips_normal_interval_by_hand() -> None:
    # psi = (2, 0, 1, 0): mean 3/4, sample variance 11/12, so 0.75 +- z sqrt(11/48)
    iv = normal_interval(np.array([2.0, 0.0, 1.0, 0.0]))
    half = Z95 * math.sqrt(11 / 48)
    assert (iv.lower, iv.upper) == pytest.approx((0.75 - half, 0.75 + half), abs=1e-12)


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("n", 4),
        ("ess", 25 / 9),  # (2 + 2 + 1 + 0)^2 / (4 + 4 + 1 + 0)
        ("ess_share", 25 / 36),
        ("mean_weight", 1.25),
        ("max_weight", 2.0),
        ("tail_weight_share", 0.8),  # threshold 1.5: rounds 0, 1 carry 4 of 5
        ("zero_target_share", 0.25),  # round 3: pi(a_3 = 0) = 0
        ("unsupported_share", 0.0),  # no propensity is 1 and no logging_dist
        ("deterministic_share", 0.0),
        ("support_known", False),
        ("unusable_pscore", 0),
    ],
)
def test_diagnostics_by_hand(field: str, expected: float) -> None:
    d = diagnostics(small(), tail_threshold=1.5)
    assert getattr(d, field) == pytest.approx(expected, abs=1e-12)


def test_support_with_the_full_logging_distribution_by_hand() -> None:
    # round 2: pi puts 0.5 on action 1, which logging never takes -> u = (0, 0, .5, 0)
    logging = np.array([[0.5, 0.5, 0], [0.5, 0.25, 0.25], [0.5, 0, 0.5], [0.5, 0.5, 0]])
    data = small(logging_dist=logging)
    d = diagnostics(data)
    assert d.unsupported_share == pytest.approx(0.125)
    assert d.unsupported_rounds == 1 and d.support_known
    for est in (Estimator.IPS, Estimator.SNIPS, Estimator.DR, Estimator.SNDR, Estimator.SWITCH_DR):
        result = estimate(data, est)
        assert isinstance(result, NotIdentifiable) and not result.identifiable
        assert "12.5% of its probability" in result.reason and "(1 of 4 decisions)" in result.reason
    model_based = estimate(data, Estimator.DM)
    assert isinstance(model_based, Estimate) and model_based.basis is Basis.MODEL_BASED
    assert any("only the model speaks" in c for c in model_based.caveats)
    # tolerating that much unsupported mass gives a number again
    assert isinstance(estimate(data, Estimator.IPS, support_tolerance=0.2), Estimate)


def test_deterministic_logging_without_the_distribution_by_hand() -> None:
    # propensity 1 everywhere: logging takes only a_t; the target's other mass is unsupported
    data = small(pscore=np.ones(4), feasible=np.ones((4, 3), bool))
    d = diagnostics(data)
    # 1 - pi(a_t|x_t) = (0, .5, .5, 1)
    assert d.unsupported_share == pytest.approx(0.5) and d.unsupported_rounds == 3
    assert d.deterministic_share == 1.0
    result = estimate(data, Estimator.DR)
    assert isinstance(result, NotIdentifiable)
    assert "deterministic in 100% of the decisions that had a choice" in result.reason


def test_a_single_feasible_action_is_supported_even_when_logging_is_deterministic() -> None:
    feasible = np.array([[True, False], [False, True]])
    data = BanditData(
        reward=np.array([1.0, 0.0]),
        action=np.array([0, 1]),
        pscore=np.ones(2),
        action_dist=one_hot(np.array([0, 1]), 2),
        feasible=feasible,
    )
    d = diagnostics(data)
    assert d.unsupported_share == 0 and d.deterministic_share == 0
    result = estimate(data, Estimator.IPS)
    assert isinstance(result, Estimate) and result.value == 0.5


def test_zero_effective_sample_size_is_not_a_number() -> None:
    data = small(action_dist=one_hot(np.array([1, 0, 0, 1]), 3))  # never the logged action
    for est in (Estimator.IPS, Estimator.SNIPS):
        result = estimate(data, est)
        assert isinstance(result, NotIdentifiable) and "effective sample size 0" in result.reason


def test_a_cost_is_estimated_with_the_same_call() -> None:
    cost = np.array([0.0, 2.0, 1.0, 3.0])
    result = estimate(small().with_outcome(cost), Estimator.IPS)
    assert isinstance(result, Estimate)
    assert result.value == pytest.approx((2 * 0 + 2 * 2 + 1 * 1 + 0 * 3) / 4)


def test_slices_recompute_each_estimator_on_their_rounds() -> None:
    labels = np.array(["a", "a", "b", "b"])
    by_slice = estimate_by_slice(small(), labels, Estimator.SNIPS)
    assert [s.label for s in by_slice] == ["a", "b"]
    a, b = (s.result for s in by_slice)
    assert isinstance(a, Estimate) and a.value == pytest.approx(2 / 4)  # (2*1 + 2*0) / (2 + 2)
    assert isinstance(b, Estimate) and b.value == pytest.approx(1.0)  # (1*1 + 0) / (1 + 0)
    overlap = diagnostics_by_slice(small(), labels)
    assert overlap[0].diagnostics.ess == pytest.approx(2.0) and overlap[0].failure is None
    ips_a = estimate_by_slice(small(), labels, Estimator.IPS)[0].result
    full = estimate(small(), Estimator.IPS)
    assert isinstance(ips_a, Estimate) and isinstance(full, Estimate)
    assert full.contributions is not None
    assert ips_a.value == pytest.approx(full.contributions[:2].mean())  # additive: slice mean


def test_round_values_are_the_additive_terms() -> None:
    np.testing.assert_allclose(round_values(small(), Estimator.DR), [1.2, -0.7, 0.9, 0.5])


def test_screening_propensities() -> None:
    screen = screen_pscore(np.array([0.5, np.nan, 0.0, 1.2, 1.0, np.inf]))
    np.testing.assert_array_equal(screen.usable, [True, False, False, False, True, False])
    assert (screen.missing, screen.invalid, screen.unusable) == (1, 3, 4)
    result = estimate(small(unusable_pscore=4), Estimator.IPS)
    assert isinstance(result, Estimate)
    assert result.diagnostics.unusable_share == pytest.approx(0.5)
    assert any("4 rounds (50.0%) dropped" in c for c in result.caveats)


def test_bootstrap_is_seeded_and_brackets_the_estimate() -> None:
    data = small()
    a = estimate(data, Estimator.IPS, bootstrap=Bootstrap(n_boot=500, seed=7))
    b = estimate(data, Estimator.IPS, bootstrap=Bootstrap(n_boot=500, seed=7))
    assert isinstance(a, Estimate) and isinstance(b, Estimate)
    assert a.interval == b.interval
    p = parts(data, Estimator.IPS, 10.0)
    same = resampled_values(p, Bootstrap(n_boot=500, seed=7))
    np.testing.assert_array_equal(same, resampled_values(p, Bootstrap(n_boot=500, seed=7)))
    assert not np.array_equal(same, resampled_values(p, Bootstrap(n_boot=500, seed=8)))
    assert a.interval.method is IntervalMethod.BOOTSTRAP
    # resampled IPS values are means of 4 draws from (2, 0, 1, 0): within [0, 2], on a 1/4 grid
    assert 0 <= a.interval.lower <= 0.75 <= a.interval.upper <= 2
    assert (a.interval.lower * 4) % 1 == 0 and (a.interval.upper * 4) % 1 == 0


def test_the_asymptotic_sequence_by_hand() -> None:
    alpha, n_star = 0.05, 100
    rho2 = (-2 * math.log(alpha) + math.log(-2 * math.log(alpha) + 1)) / n_star
    assert asymptotic_rho(alpha, n_star) ** 2 == pytest.approx(rho2)
    cs = AsymptoticCS(alpha=alpha, n_star=n_star)
    cs.update(np.array([2.0, 0.0]))
    cs.update(np.array([1.0, 0.0]))
    t = 4
    half = math.sqrt(11 / 12) * math.sqrt(
        2 * (t * rho2 + 1) / (t * t * rho2) * math.log(math.sqrt(t * rho2 + 1) / alpha)
    )
    iv = cs.interval()
    assert (iv.lower, iv.upper) == pytest.approx((0.75 - half, 0.75 + half), abs=1e-12)
    assert iv.method.anytime_valid and iv.level == 0.95


def test_the_proportion_sequence_by_hand() -> None:
    # no successes in n trials: lower 0; upper solves
    #   betaln(1/2, 1/2 + n) - betaln(1/2, 1/2) - n ln(1 - p) = ln(1/alpha)
    n, alpha = 50, 0.05
    cs = ProportionCS(alpha=alpha)
    cs.update(np.zeros(n, dtype=bool))
    upper = 1 - math.exp(
        (special.betaln(0.5, 0.5 + n) - special.betaln(0.5, 0.5) - math.log(1 / alpha)) / n
    )
    iv = cs.interval()
    assert iv.lower == 0.0 and iv.upper == pytest.approx(upper, abs=1e-12)
    # symmetric data give a symmetric sequence around 1/2
    cs = ProportionCS(alpha=alpha)
    cs.update_counts(25, 50)
    iv = cs.interval()
    assert iv.lower + iv.upper == pytest.approx(1.0, abs=1e-10) and iv.lower < 0.5


def test_clopper_pearson_by_hand() -> None:
    iv = clopper_pearson(0, 10, level=0.95)
    assert iv.lower == 0 and iv.upper == pytest.approx(1 - 0.025 ** (1 / 10), abs=1e-12)
    iv = clopper_pearson(10, 10, level=0.95)
    assert iv.upper == 1 and iv.lower == pytest.approx(0.025 ** (1 / 10), abs=1e-12)


@pytest.mark.parametrize("trials", [1, 2, 7, 50, 1000])
@pytest.mark.parametrize("level", [0.5, 0.95, 0.999])
def test_clopper_pearson_is_scipys_exact_interval_and_the_beta_form(
    trials: int, level: float
) -> None:
    """The one exact interval equals scipy's and the beta-quantile closed form, ends included."""
    a = 1 - level
    for k in sorted({0, 1, trials // 3, trials // 2, trials - 1, trials}):
        iv = clopper_pearson(k, trials, level=level)
        ci = stats.binomtest(k, trials).proportion_ci(confidence_level=level, method="exact")
        assert (iv.lower, iv.upper) == (ci.low, ci.high)
        lo = 0.0 if k == 0 else stats.beta.ppf(a / 2, k, trials - k + 1)
        hi = 1.0 if k == trials else stats.beta.ppf(1 - a / 2, k + 1, trials - k)
        assert iv.lower == pytest.approx(lo, abs=1e-10) and iv.upper == pytest.approx(hi, abs=1e-10)
        assert iv.method is IntervalMethod.CLOPPER_PEARSON and iv.n == trials
    assert clopper_pearson(0, trials, level=level).lower == 0.0
    assert clopper_pearson(trials, trials, level=level).upper == 1.0


def test_clopper_pearson_refuses_no_trials() -> None:
    with pytest.raises(InvalidInput):
        clopper_pearson(0, 0)
    with pytest.raises(InvalidInput):
        clopper_pearson(3, 2)


def _reference_capital(phi: list[float], alpha: float, grid: np.ndarray, c: float) -> np.ndarray:
    """Waudby-Smith & Ramdas' predictable plug-in capital, one round and one m at a time."""
    log_k = np.zeros(len(grid))
    total, dev2 = 0.0, 0.0
    for i, x in enumerate(phi, start=1):
        var_before = (0.25 + dev2) / i
        lam = math.sqrt(2 * math.log(1 / alpha) / (var_before * i * math.log(1 + i)))
        for j, m in enumerate(grid):
            bet = lam if m == 0 else min(lam, c / m)
            log_k[j] += math.log(1 + bet * (x - m))
        total += x
        mu = (0.5 + total) / (i + 1)
        dev2 += (x - mu) ** 2
    return log_k


def test_betting_sequences_match_a_scalar_reference() -> None:
    x = [0.9, 1.0, 0.8, 1.0, 0.95, 1.0, 0.7, 1.0, 1.0, 0.9] * 3
    alpha, c, size = 0.05, 0.5, 50
    grid = np.linspace(0, 1, size + 1)
    lo_cap = _reference_capital(x, alpha / 2, grid, c)
    hi_cap = _reference_capital([1 - v for v in x], alpha / 2, grid, c)
    k_lo = int(np.flatnonzero(lo_cap < math.log(2 / alpha))[0])
    k_hi = int(np.flatnonzero(hi_cap < math.log(2 / alpha))[0])
    lower, upper = grid[max(k_lo - 1, 0)], 1 - grid[max(k_hi - 1, 0)]
    cs = BettingCS(alpha=alpha, grid_size=size, c=c)
    cs.update(np.array(x[:7]))
    cs.update(np.array(x[7:]))
    iv = cs.interval()
    assert (iv.lower, iv.upper) == pytest.approx((lower, upper), abs=1e-12)
    assert 0 < iv.lower < np.mean(x) < iv.upper <= 1
    # with weights 1, the off-policy sequence is the bounded-mean sequence
    op = OffPolicyBettingCS(alpha=alpha, grid_size=size, c=c)
    op.update(weight=np.ones(len(x)), reward=np.array(x))
    assert (op.interval().lower, op.interval().upper) == (iv.lower, iv.upper)


def test_bounds_rescale_the_betting_sequence() -> None:
    x = np.array([0.2, 0.4, 0.3, 0.5, 0.1] * 20)
    unit = BettingCS(grid_size=100)
    unit.update(x)
    scaled = BettingCS(lower=-1.0, upper=3.0, grid_size=100)
    scaled.update(4 * x - 1)
    a, b = unit.interval(), scaled.interval()
    assert (b.lower, b.upper) == pytest.approx((4 * a.lower - 1, 4 * a.upper - 1))


def test_batches_concatenate_back_to_the_log() -> None:
    data = small(unusable_pscore=2)
    parts_ = [data.subset(np.array([0, 1])), data.subset(np.array([2, 3]))]
    back = BanditData.concatenate(parts_)
    np.testing.assert_array_equal(back.reward, data.reward)
    np.testing.assert_array_equal(back.action_dist, data.action_dist)
    assert back.estimated_rewards is not None and back.feasible is None
    a, b = estimate(back, Estimator.DR), estimate(data.with_target(data.action_dist), "dr")
    assert isinstance(a, Estimate) and isinstance(b, Estimate) and a.value == b.value


def test_a_running_intersection_keeps_the_tighter_bounds() -> None:
    first = ProportionCS()
    first.update_counts(30, 40)
    later = ProportionCS()
    later.update_counts(60, 90)
    iv = first.interval().intersect(later.interval())
    assert iv.lower == max(first.interval().lower, later.interval().lower)
    assert iv.upper == min(first.interval().upper, later.interval().upper) and iv.n == 90


def test_constant_outcomes_are_flagged() -> None:
    result = estimate(small(reward=np.zeros(4)), Estimator.IPS)
    assert isinstance(result, Estimate) and result.interval.width == 0
    assert any("every logged outcome equals 0" in c for c in result.caveats)
