"""Scores -> probabilities: formulas against hand computation, invariants, sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.contract import DEFER, N_FEATURES
from service.policies.base import DecisionStatus, PolicyDecisions, ScoringBatch
from service.policies.errors import PolicyScoringError
from service.policies.probabilities import (
    ProbabilityRule,
    RuleKind,
    decide_from_scores,
    error_decisions,
    first_argmax,
)


def csr_batch(sizes: list[int], mask: list[bool]) -> ScoringBatch:
    """A batch with only the arrays `decide_from_scores` reads."""
    n = sum(sizes)
    return ScoringBatch(
        features=np.zeros((n, N_FEATURES), dtype=np.float32),
        offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        mask=np.array(mask, dtype=bool),
        requests=(),
    )


def decide(
    scores: list[float], sizes: list[int], mask: list[bool], rule: ProbabilityRule, seed: int = 0
) -> PolicyDecisions:
    return decide_from_scores(
        "t",
        np.array(scores, dtype=np.float32),
        csr_batch(sizes, mask),
        rule,
        np.random.default_rng(seed),
    )


def test_softmax_matches_hand_computation_and_masks() -> None:
    d = decide(
        [1.0, 2.0, 3.0, 0.5],
        [3, 1],
        [True, False, True, True],
        ProbabilityRule(RuleKind.SOFTMAX, 0.5),
    )
    e1, e3 = math.exp(1.0 / 0.5), math.exp(3.0 / 0.5)
    np.testing.assert_allclose(d.probabilities, [e1 / (e1 + e3), 0.0, e3 / (e1 + e3), 1.0])
    np.testing.assert_allclose(d.defer_probability, [0.0, 0.0])
    assert d.raw_favourite_infeasible.tolist() == [False, False]


def test_softmax_with_defer_score_gives_defer_its_share() -> None:
    d = decide(
        [0.0, 1.0], [2], [True, True], ProbabilityRule(RuleKind.SOFTMAX, 1.0, defer_score=1.0)
    )
    z = 1.0 + 2 * math.e
    np.testing.assert_allclose(d.probabilities, [1 / z, math.e / z])
    np.testing.assert_allclose(d.defer_probability, [math.e / z])


def test_argmax_breaks_ties_to_the_earliest_option_and_skips_masked() -> None:
    d = decide([5.0, 2.0, 2.0, 1.0], [4], [False, True, True, True], ProbabilityRule())
    assert d.chosen.tolist() == [1]
    assert d.probabilities.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert d.raw_favourite_infeasible.tolist() == [True]


def test_argmax_defers_when_defer_score_beats_every_option() -> None:
    d = decide([0.1, 0.2], [2], [True, True], ProbabilityRule(defer_score=0.5))
    assert d.chosen.tolist() == [DEFER]
    assert d.defer_probability.tolist() == [1.0]


def test_epsilon_greedy_spreads_epsilon_over_candidates() -> None:
    d = decide(
        [3.0, 1.0, 2.0],
        [3],
        [True, True, False],
        ProbabilityRule(RuleKind.EPSILON_GREEDY, epsilon=0.3),
    )
    np.testing.assert_allclose(d.probabilities, [0.7 + 0.15, 0.15, 0.0])


def test_no_feasible_option_defers_with_status_all_infeasible() -> None:
    d = decide([1.0, 2.0, 0.0], [2, 0, 1], [False, False, True], ProbabilityRule(RuleKind.SOFTMAX))
    assert d.status == (
        DecisionStatus.ALL_INFEASIBLE,
        DecisionStatus.ALL_INFEASIBLE,
        DecisionStatus.OK,
    )
    assert d.defer_probability.tolist() == [1.0, 1.0, 0.0]
    assert d.chosen.tolist() == [DEFER, DEFER, 0]


def test_non_finite_score_on_a_feasible_option_is_a_scoring_error() -> None:
    with pytest.raises(PolicyScoringError, match=r"policy `t`: `scores\[1\]` is nan on a feasible"):
        decide([1.0, float("nan")], [2], [True, True], ProbabilityRule())


def test_wrong_score_shape_is_a_scoring_error() -> None:
    with pytest.raises(PolicyScoringError, match=r"must have shape \(2,\)"):
        decide_from_scores(
            "t",
            np.zeros(3, np.float32),
            csr_batch([2], [True, True]),
            ProbabilityRule(),
            np.random.default_rng(),
        )


def test_sampling_frequencies_match_probabilities() -> None:
    n = 20_000
    scores = np.tile(np.array([0.0, 1.0, 2.0], dtype=np.float32), n)
    batch = csr_batch([3] * n, [True, True, True] * n)
    rule = ProbabilityRule(RuleKind.SOFTMAX, 1.0, defer_score=1.0)
    d = decide_from_scores("t", scores, batch, rule, np.random.default_rng(42))
    p = np.append(d.probabilities[:3], d.defer_probability[0])
    counts = np.array([(d.chosen == k).sum() for k in (0, 1, 2, DEFER)])
    sigma = np.sqrt(n * p * (1 - p))
    assert (np.abs(counts - n * p) < 5 * sigma).all(), (counts, n * p)


def test_same_seed_same_choices_other_seed_other_choices() -> None:
    rule = ProbabilityRule(RuleKind.SOFTMAX, 1.0)
    args = ([0.0, 0.1, 0.2, 0.3] * 50, [4] * 50, [True] * 200, rule)
    a, b, c = decide(*args, seed=1), decide(*args, seed=1), decide(*args, seed=2)
    assert np.array_equal(a.chosen, b.chosen)
    assert not np.array_equal(a.chosen, c.chosen)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 0.0}, "`temperature` must be finite and > 0, got 0.0"),
        ({"temperature": float("inf")}, "`temperature` must be finite and > 0, got inf"),
        ({"epsilon": 1.5}, r"`epsilon` must be in \[0, 1\], got 1.5"),
        ({"epsilon": -0.1}, r"`epsilon` must be in \[0, 1\], got -0.1"),
        ({"defer_score": float("nan")}, "`defer_score` must be finite or null, got nan"),
    ],
)
def test_invalid_rule_parameters(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ProbabilityRule(RuleKind.SOFTMAX, **kwargs)


def test_first_argmax_handles_empty_segments_and_nan() -> None:
    values = np.array([np.nan, 1.0, 3.0, 3.0], dtype=np.float64)
    offsets = np.array([0, 2, 2, 4], dtype=np.int64)
    assert first_argmax(values, offsets, np.ones(4, dtype=bool)).tolist() == [1, -1, 2]


def test_error_decisions_carry_no_mass() -> None:
    d = error_decisions(csr_batch([2, 1], [True] * 3), DecisionStatus.ERROR)
    assert d.probabilities.sum() == 0 and d.defer_probability.sum() == 0
    assert d.status == (DecisionStatus.ERROR, DecisionStatus.ERROR)


@st.composite
def random_case(draw: st.DrawFn) -> tuple[list[float], list[int], list[bool], ProbabilityRule]:
    sizes = draw(st.lists(st.integers(0, 6), min_size=1, max_size=6))
    n = sum(sizes)
    scores = draw(st.lists(st.floats(-50, 50), min_size=n, max_size=n))
    mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    kind = draw(st.sampled_from(list(RuleKind)))
    defer = draw(st.one_of(st.none(), st.floats(-50, 50)))
    rule = ProbabilityRule(kind, draw(st.floats(0.05, 10)), draw(st.floats(0, 1)), defer)
    return scores, sizes, mask, rule


@settings(max_examples=150, deadline=None)
@given(random_case(), st.integers(0, 2**32 - 1))
def test_invariants_hold_for_any_scores_mask_and_rule(
    case: tuple[list[float], list[int], list[bool], ProbabilityRule], seed: int
) -> None:
    scores, sizes, mask, rule = case
    d = decide(scores, sizes, mask, rule, seed)
    m = np.array(mask, dtype=bool)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    assert (d.probabilities[~m] == 0).all() and (d.probabilities >= 0).all()
    for r in range(len(sizes)):
        p = d.probabilities[offsets[r] : offsets[r + 1]]
        assert abs(p.sum() + d.defer_probability[r] - 1) < 1e-9
        c = d.chosen[r]
        if c == DEFER:
            assert d.defer_probability[r] > 0
        else:
            assert m[offsets[r] + c] and p[c] > 0
