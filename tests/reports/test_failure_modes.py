"""Failure modes against the simulator's ground truth, and the ranking functions' contracts.

The acceptance: in the ``degraded`` scenario every V100 runs at half its
measured throughput and nothing in a request shows it. The learned outcome
predictor (policies/learned-outcome, trained on the ``train`` scenario) does
not know either, so choices placed on V100 fall short of their predicted
throughput. Ranking choices by (predicted 80% interval width) x (shortfall of
the realised throughput below the predicted median) must put V100 among the
top cases more often than V100's share of all choices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from service.contract import InvalidInput, MirrorRequest
from service.environment import OUTCOME_FIELDS, ContextPool, World, build_pool, load_scenario
from service.environment.dataset import target_probabilities
from service.ope.failure_modes import (
    LabelRate,
    Ranked,
    disagreements,
    label_rates,
    losing_slices,
    share_by_label,
    shortfall,
    top_k,
    uncertain_failures,
)
from service.policies.onnx_policy import OnnxPredictor
from service.policies.outcome_features import OUTCOME_FEATURES
from service.policies.registry import Registry, load_registry

POLICIES = Path(__file__).resolve().parents[2] / "policies"
DEGRADED = "V100"
K = 20


@dataclass(frozen=True, eq=False)
class Degraded:
    pool: ContextPool
    quantiles: NDArray[np.float64]  # (total option rows, 3), the learned predictor
    offsets: NDArray[np.int64]
    registry: Registry


@pytest.fixture(scope="module")
def degraded() -> Degraded:
    """Three episodes of the degraded scenario (seed 7), every action forked in two worlds."""
    pool = build_pool(World(load_scenario("degraded")), seed=7, n_episodes=3, n_worlds=2)
    registry = load_registry(POLICIES, include_baselines=False)
    quantiles = _predictor(registry).predict_rows(OUTCOME_FEATURES(pool.requests))
    offsets = np.concatenate([[0], np.cumsum(pool.n_options)]).astype(np.int64)
    return Degraded(pool, quantiles.astype(np.float64), offsets, registry)


def _predictor(registry: Registry) -> OnnxPredictor:
    """The learned outcome predictor (trained on the ``train`` scenario only)."""
    predictor = registry.predictors["learned-outcome"]
    assert isinstance(predictor, OnnxPredictor)
    return predictor


def _hardware(requests: tuple[MirrorRequest, ...], chosen: NDArray[np.int64]) -> NDArray[np.str_]:
    names = []
    for request, c in zip(requests, chosen, strict=True):
        if c >= request.options.n_options:
            names.append("DEFER")
        else:
            names.append(request.state.hardware_of(int(request.options.nodes_of(int(c))[0])).name)
    return np.array(names, dtype=np.str_)


def _rates(
    d: Degraded, chosen: NDArray[np.int64], throughput: NDArray[np.float64]
) -> tuple[LabelRate, str]:
    """Top-K share of V100 and its base rate, as the assertion message."""
    pool = d.pool
    placed = chosen < pool.n_options
    row = d.offsets[:-1] + np.where(placed, chosen, 0)
    q = d.quantiles[row]
    width = np.where(placed, np.log(q[:, 2]) - np.log(q[:, 0]), np.nan)
    bad = shortfall(np.where(placed, q[:, 1], np.nan), throughput)
    ranked = uncertain_failures(width, bad, K)
    labels = _hardware(pool.requests, chosen)
    rate = {r.label: r for r in label_rates(labels, ranked)}[DEGRADED]
    return rate, (
        f"{DEGRADED} in the top {K} high-uncertainty bad-outcome cases: {rate.top_share:.2f} "
        f"({rate.top_count}/{len(ranked.index)}); base rate {rate.base_share:.3f} "
        f"({rate.base_count}/{ranked.n}); {ranked.eligible} cases fell short of the median"
    )


def test_the_degraded_class_is_over_represented_among_production_s_uncertain_failures(
    degraded: Degraded,
) -> None:
    pool = degraded.pool
    realised = pool.logged_outcomes[:, OUTCOME_FIELDS.index("throughput")]
    rate, message = _rates(degraded, pool.logged_action, realised)
    print(f"\n[failure modes] production, degraded scenario: {message}")
    assert rate.top_share > rate.base_share, message


def test_the_degraded_class_is_not_under_represented_among_a_candidate_s_uncertain_failures(
    degraded: Degraded,
) -> None:
    """The lcb-planner's own choices, with the outcome each would have had (world 0 fork).

    The planner crowds the fast class: since issue 23's rebuild 97% of its placed choices
    in these rounds are V100, so the degraded class cannot be
    over-represented among its worst uncertain failures by much; comparing two point
    estimates (the test before) passed or failed on noise. What must hold is that the
    ranking does not steer away from the degraded class: its top-K count is not
    significantly below its base rate (one-sided binomial, 5%). A ranking blind to the
    slowdown, or inverted, fails it."""
    pool = degraded.pool
    planner = degraded.registry.policies["lcb-planner"]
    probs = target_probabilities(pool.features, pool.n_options, pool.mask, pool.requests, planner)
    chosen = probs.argmax(axis=1).astype(np.int64)
    thr = OUTCOME_FIELDS.index("throughput")
    realised = pool.outcomes[np.arange(pool.n), chosen, 0, thr]
    rate, message = _rates(degraded, chosen, realised)
    print(f"\n[failure modes] lcb-planner, degraded scenario: {message}")
    below = stats.binomtest(rate.top_count, K, rate.base_share, alternative="less")
    assert below.pvalue >= 0.05, (message, below.pvalue)


def test_without_degradation_the_same_ranking_does_not_single_out_v100() -> None:
    """Control: the ``train`` scenario (V100 at full speed) on the same seeds."""
    pool = build_pool(World(load_scenario("train")), seed=7, n_episodes=2, n_worlds=2)
    registry = load_registry(POLICIES, include_baselines=False)
    q = _predictor(registry).predict_rows(OUTCOME_FEATURES(pool.requests))
    offsets = np.concatenate([[0], np.cumsum(pool.n_options)]).astype(np.int64)
    d = Degraded(pool, np.asarray(q, dtype=np.float64), offsets, registry)
    realised = pool.logged_outcomes[:, OUTCOME_FIELDS.index("throughput")]
    rate, message = _rates(d, pool.logged_action, realised)
    print(f"\n[failure modes] production, train scenario: {message}")
    assert rate.top_share <= rate.base_share, message


# -- the ranking functions --------------------------------------------------------------------


def test_uncertain_failures_rank_by_width_times_badness() -> None:
    width = np.array([0.1, 2.0, 1.0, 3.0, np.nan])
    bad = np.array([5.0, 0.0, 1.0, 0.5, 9.0])
    r = uncertain_failures(width, bad, 3)
    assert r.index.tolist() == [3, 2, 0]
    assert np.allclose(r.score, [1.5, 1.0, 0.5])
    assert (r.eligible, r.n) == (3, 5)


def test_disagreements_skip_agreement_and_unknown_production() -> None:
    chosen = np.array([0, 1, 2, 3, 1])
    production = np.array([0, 2, 1, -2, 0])
    impact = np.array([9.0, -0.5, 0.2, 7.0, np.nan])
    r = disagreements(chosen, production, impact, 10)
    assert r.index.tolist() == [1, 2]
    assert np.allclose(r.score, [0.5, 0.2])


def test_shortfall_is_zero_when_the_outcome_beats_the_prediction() -> None:
    s = shortfall([2.0, 2.0, 1.0, 0.0], [1.0, 3.0, np.nan, 1.0])
    assert math.isclose(s[0], math.log(2.0))
    assert s[1] == 0.0 and np.isnan(s[2]) and np.isnan(s[3])


def test_label_rates_compare_the_top_with_the_base() -> None:
    labels = np.array(["a", "a", "b", "b", "b", "b", "b", "b"])
    ranked = top_k([0, 5, 0, 0, 4, 0, 0, 0], 2)
    rates = {r.label: r for r in label_rates(labels, ranked)}
    assert (rates["a"].top_share, rates["a"].base_share) == (0.5, 0.25)
    assert rates["a"].lift == 2.0
    assert rates["b"].top_count == 1 and rates["b"].base_count == 6


def test_share_by_label_sorts_the_worst_first() -> None:
    shares = share_by_label([True, False, True, True], ["x", "x", "y", "y"])
    assert [(s.label, s.count, s.n) for s in shares] == [("y", 2, 2), ("x", 1, 2)]


def test_losing_slices_find_the_slice_where_the_candidate_loses() -> None:
    rng = np.random.default_rng(0)
    labels = np.repeat(["good", "bad", "tiny"], [400, 400, 1])
    diff = np.concatenate([rng.normal(0.3, 1, 400), rng.normal(-0.4, 1, 400), [5.0]])
    slices = losing_slices(diff, labels, level=0.95)
    assert [s.label for s in slices] == ["bad", "good"]
    assert slices[0].loses and not slices[0].wins
    assert slices[1].wins and slices[1].n == 400


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: top_k([1.0], 0), "k"),
        (lambda: top_k(np.ones((2, 2)), 1), "score"),
        (lambda: uncertain_failures([1.0, 2.0], [1.0], 1), "badness"),
        (lambda: uncertain_failures([-1.0], [1.0], 1), "width"),
        (lambda: uncertain_failures([1.0], [-1.0], 1), "badness"),
        (lambda: disagreements([0, 1], [0], [1.0, 1.0], 1), "production"),
        (lambda: disagreements([0, 1], [0, 1], [1.0], 1), "impact"),
        (lambda: label_rates(["a"], Ranked(np.zeros(0, np.int64), np.zeros(0), 0, 2)), "labels"),
        (lambda: share_by_label([True], ["a", "b"]), "labels"),
        (lambda: losing_slices([1.0, np.inf], ["a", "a"]), "difference"),
        (lambda: losing_slices([1.0, 2.0], ["a", "a"], level=1.5), "level"),
    ],
)
def test_bad_input_names_the_argument(call: object, field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        call()  # type: ignore[operator]
    assert err.value.field == field
