"""Marks on estimates: outside the reward's range, clipped bounds, too thin (``marks``)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from service.contract.reward import REWARD_FIELDS, RewardSpec
from service.ope import MIN_ESS, BanditData, Estimator, NotIdentifiable, estimate
from service.reports.ope.arrays import Reward, policy_rounds
from service.reports.ope.marks import (
    FIELD_RANGES,
    THIN_ESS,
    UNKNOWN_RANGE,
    MarkKind,
    RewardRange,
    mark,
    mark_result,
    range_of,
    reward_range,
)
from service.storage.reads.ope import OpeLog
from tests.reports.synthetic import bandit_log

INF = math.inf
UNIT = RewardRange(0.0, 1.0)
OUT, CLIP, THIN = MarkKind.OUTSIDE_RANGE, MarkKind.BOUND_CLIPPED, MarkKind.TOO_THIN
NAN = math.nan

# (value, lower, upper, ess, range) -> (kinds, shown lower, shown upper)
MARK_CASES = [
    ((0.5, 0.4, 0.6, 100.0, UNIT), (set(), 0.4, 0.6)),
    ((0.5, 0.4, 0.6, THIN_ESS, UNIT), (set(), 0.4, 0.6)),  # at the threshold: not thin
    ((0.5, 0.4, 0.6, 29.9, UNIT), ({THIN}, 0.4, 0.6)),
    ((0.5, 0.4, 0.6, 0.0, UNIT), ({THIN}, 0.4, 0.6)),  # every weight 0
    ((0.5, 0.4, 0.6, NAN, UNIT), (set(), 0.4, 0.6)),  # ESS unknown: no thinness mark
    ((0.95, 0.85, 1.05, 100.0, UNIT), ({CLIP}, 0.85, 1.0)),
    ((1.0, 0.9, 1.0, 100.0, UNIT), (set(), 0.9, 1.0)),  # on the bound: inside
    ((-0.38, -1.75, 0.99, 2.7, UNIT), ({OUT, CLIP, THIN}, 0.0, 0.99)),  # issue 27's row
    ((1.118, 0.887, 1.348, 1.8, UNIT), ({OUT, CLIP, THIN}, 0.887, 1.0)),
    ((1.2, 1.1, 1.3, 100.0, UNIT), ({OUT, CLIP}, NAN, NAN)),  # nothing of it possible
    ((0.3, -INF, INF, 1.0, UNIT), ({THIN}, 0.0, 1.0)),  # unbounded (n < 2): no clip mark
    ((0.2, -0.1, 0.5, 100.0, RewardRange(-INF, 0.0)), ({OUT, CLIP}, -0.1, 0.0)),
    ((-3.0, -5.0, -1.0, 100.0, RewardRange(-INF, 0.0)), (set(), -5.0, -1.0)),
    ((-7.0, -9.0, 5.0, 1.0, UNKNOWN_RANGE), ({THIN}, -9.0, 5.0)),  # range unknown
    ((-1.2, -1.9, -0.5, 100.0, UNIT.difference()), ({OUT, CLIP}, -1.0, -0.5)),
]


@pytest.mark.parametrize(("given", "expected"), MARK_CASES)
def test_marks(
    given: tuple[float, float, float, float, RewardRange],
    expected: tuple[set[MarkKind], float, float],
) -> None:
    value, lower, upper, ess, reward = given
    kinds, shown_lower, shown_upper = expected
    got = mark(value, lower, upper, ess=ess, reward=reward)
    assert got.kinds == kinds, got.note
    assert got.plain is (not kinds)
    np.testing.assert_equal([got.lower, got.upper], [shown_lower, shown_upper])
    assert got.value == value and (got.raw_lower, got.raw_upper) == (lower, upper)


@pytest.mark.parametrize(
    ("given", "value_text", "interval_text", "note"),
    [
        ((0.5, 0.4, 0.6, 100.0), "0.5", "[0.4, 0.6]", ""),
        (
            (-0.38, -1.75, 0.99, 2.7),
            "(-0.38)",
            "[0, 0.99]",
            "too thin: ESS 2.7 < 30; outside reward range [0, 1]; bound clipped: lower -1.75 → 0",
        ),
        (
            (1.2, 1.1, 1.3, 100.0),
            "(1.2)",
            "outside the range",
            "outside reward range [0, 1]; bound clipped: [1.1, 1.3] lies outside [0, 1]",
        ),
    ],
)
def test_what_a_marked_estimate_prints(
    given: tuple[float, float, float, float], value_text: str, interval_text: str, note: str
) -> None:
    value, lower, upper, ess = given
    got = mark(value, lower, upper, ess=ess, reward=UNIT)
    assert (got.value_text(), got.interval_text(), got.note) == (value_text, interval_text, note)


@pytest.mark.parametrize(
    ("weights", "lower", "upper", "text"),
    [
        ({"slo_met": 1.0}, 0.0, 1.0, "[0, 1]"),
        ({"slo_met": -2.0}, -2.0, 0.0, "[-2, 0]"),
        ({"slo_met": 1.0, "queue_delay_s": -0.001}, -INF, 1.0, "(-inf, 1]"),
        ({"throughput": 0.5}, 0.0, INF, "[0, inf)"),
        ({"throughput": 1.0, "completion_time_s": -1.0}, -INF, INF, "unknown"),
        ({"slo_met": 1.0, "throughput": 0.0}, 0.0, 1.0, "[0, 1]"),  # weight 0 adds nothing
    ],
)
def test_a_declared_rewards_range_follows_from_its_weights(
    weights: dict[str, float], lower: float, upper: float, text: str
) -> None:
    got = reward_range(RewardSpec(weights))
    assert (got.lower, got.upper, got.text()) == (lower, upper, text)
    assert got.known is (text != "unknown")


def test_every_outcome_field_has_a_range() -> None:
    assert set(FIELD_RANGES) == set(REWARD_FIELDS)


@pytest.mark.parametrize("reward", list(Reward))
def test_the_cli_rewards_stay_inside_their_declared_range(reward: Reward) -> None:
    """Ground truth: `Reward.of` on extreme outcomes never leaves `range_of(reward)`."""
    log = bandit_log(64, seed=1)
    rng = np.random.default_rng(2)
    extreme = replace(
        log,
        slo_met=rng.integers(0, 2, log.n).astype(np.float64),
        queue_delay_s=rng.choice([0.0, 1e-9, 3600.0, 1e9], log.n),
        completion_time_s=rng.choice([0.0, 1e-9, 3600.0, 1e9], log.n),
    )
    values = reward.of(extreme)
    bounds = range_of(reward)
    assert all(bounds.contains(float(v)) for v in values), (bounds, values.min(), values.max())
    assert bounds.known


def test_the_thinness_threshold_is_the_cores() -> None:
    """One threshold: a "too thin" cell and the estimator's small-ESS caveat agree."""
    assert THIN_ESS == MIN_ESS


def _best(log: OpeLog) -> BanditData:
    data = policy_rounds(log, Reward.SLO_MET, ("best", "1")).data
    assert data is not None
    return data


def test_a_refusal_gets_no_marks_and_an_estimate_its_own() -> None:
    refused = estimate(_best(bandit_log(200, seed=3, deterministic_production=True)), Estimator.IPS)
    assert isinstance(refused, NotIdentifiable)
    assert mark_result(refused, UNIT) is None and mark_result(None, UNIT) is None
    wide = mark_result(estimate(_best(bandit_log(400, seed=4)), Estimator.IPS), UNIT)
    assert wide is not None and not wide.kinds & {THIN, OUT}, wide  # ESS ~ 100, truth 0.9
    thin = mark_result(estimate(_best(bandit_log(12, seed=4)), Estimator.IPS), UNIT)
    assert thin is not None and MarkKind.TOO_THIN in thin.kinds, thin
