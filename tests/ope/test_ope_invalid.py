"""Invalid input raises `InvalidInput` naming the argument, with an exact message (a table)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from service.contract import InvalidInput
from service.ope import (
    AsymptoticCS,
    BanditData,
    BettingCS,
    Bootstrap,
    Estimator,
    OffPolicyBettingCS,
    ProportionCS,
    StreamingEstimator,
    diagnostics_by_slice,
    estimate,
    round_values,
)

REWARD = np.array([1.0, 0.0, 1.0, 0.5])
ACTION = np.array([0, 1, 2, 0])
PSCORE = np.array([0.5, 0.25, 0.5, 0.5])
DIST = np.array([[1, 0, 0], [0.5, 0.5, 0], [0, 0.5, 0.5], [0, 1, 0]], dtype=float)
MODEL = np.full((4, 3), 0.5)
LOGGING = np.array([[0.5, 0.5, 0], [0.5, 0.25, 0.25], [0.25, 0.25, 0.5], [0.5, 0.5, 0]])


def data(**changes: object) -> BanditData:
    arrays: dict[str, object] = {
        "reward": REWARD,
        "action": ACTION,
        "pscore": PSCORE,
        "action_dist": DIST,
    }
    arrays.update(changes)
    return BanditData(**arrays)  # type: ignore[arg-type]


def with_row(array: np.ndarray, row: int, value: object) -> np.ndarray:
    out = array.astype(float).copy()
    out[row] = value
    return out


RANGE = "elements must be integers in the range of [0, `action_dist.shape[1]`)"

CASES: list[tuple[str, Callable[[], object], str, str]] = [
    ("reward 2-d", lambda: data(reward=REWARD[:, None]), "reward",
     "must be a 1-dimensional array, got shape (4, 1)"),
    ("reward NaN", lambda: data(reward=with_row(REWARD, 1, np.nan)), "reward",
     "must be finite, got nan at round 1"),
    ("reward inf", lambda: data(reward=with_row(REWARD, 3, np.inf)), "reward",
     "must be finite, got inf at round 3"),
    ("reward strings", lambda: data(reward=np.array(["a", "b", "c", "d"])), "reward",
     "must be numeric, got dtype <U1"),
    ("reward length", lambda: data(reward=REWARD[:3]), "reward",
     "must have one entry per row of `action_dist` (4), got 3"),
    ("no rounds", lambda: data(reward=REWARD[:0], action=ACTION[:0], pscore=PSCORE[:0],
                               action_dist=DIST[:0]),
     "reward", "must hold at least one round, got 0"),
    ("action floats", lambda: data(action=ACTION.astype(float)), "action",
     f"{RANGE}, got dtype float64"),
    ("action too large", lambda: data(action=np.array([0, 3, 2, 0])), "action",
     f"{RANGE}, got 3 at round 1"),
    ("action negative", lambda: data(action=np.array([0, 1, -1, 0])), "action",
     f"{RANGE}, got -1 at round 2"),
    ("action 2-d", lambda: data(action=ACTION[:, None]), "action",
     "must be a 1-dimensional array, got shape (4, 1)"),
    ("action length", lambda: data(action=ACTION[:2]), "action",
     "must have one entry per row of `action_dist` (4), got 2"),
    ("pscore zero", lambda: data(pscore=with_row(PSCORE, 2, 0.0)), "pscore",
     "must be in (0, 1], got 0.0 at round 2"),
    ("pscore above one", lambda: data(pscore=with_row(PSCORE, 0, 1.5)), "pscore",
     "must be in (0, 1], got 1.5 at round 0"),
    ("pscore negative", lambda: data(pscore=with_row(PSCORE, 3, -0.2)), "pscore",
     "must be in (0, 1], got -0.2 at round 3"),
    ("pscore NaN", lambda: data(pscore=with_row(PSCORE, 0, np.nan)), "pscore",
     "must be finite, got nan at round 0"),
    ("pscore length", lambda: data(pscore=PSCORE[:3]), "pscore",
     "must have one entry per row of `action_dist` (4), got 3"),
    ("dist 1-d", lambda: data(action_dist=DIST[:, 0]), "action_dist",
     "must be a 2-dimensional array, got shape (4,)"),
    ("dist sum", lambda: data(action_dist=with_row(DIST, 1, [0.5, 0.4, 0.0])), "action_dist",
     "rows must sum to 1, got 0.9 at round 1"),
    ("dist negative", lambda: data(action_dist=with_row(DIST, 2, [-0.5, 1.0, 0.5])),
     "action_dist", "must be non-negative, got -0.5 at round 2"),
    ("dist NaN", lambda: data(action_dist=with_row(DIST, 3, [np.nan, 1.0, 0.0])),
     "action_dist", "must be finite, got nan at round 3"),
    ("model shape", lambda: data(estimated_rewards=MODEL[:, :2]), "estimated_rewards",
     "must have the shape of `action_dist` (4, 3), got (4, 2)"),
    ("model NaN", lambda: data(estimated_rewards=with_row(MODEL, 0, np.nan)),
     "estimated_rewards", "must be finite, got nan at round 0"),
    ("feasible dtype", lambda: data(feasible=np.ones((4, 3))), "feasible",
     "must be a bool array of the shape of `action_dist` (4, 3), got float64 (4, 3)"),
    ("target infeasible", lambda: data(feasible=np.array([[1, 1, 1], [1, 1, 1], [1, 0, 1],
                                                          [1, 1, 1]], bool)),
     "action_dist", "puts probability on an infeasible action at round 2"),
    ("logging sum", lambda: data(logging_dist=LOGGING * 0.5), "logging_dist",
     "rows must sum to 1, got 0.5 at round 0"),
    ("logging vs pscore", lambda: data(logging_dist=LOGGING[[0, 1, 3, 2]]), "pscore",
     "must equal `logging_dist` at the logged action, got 0.5 vs 0.0 at round 2"),
    ("unusable negative", lambda: data(unusable_pscore=-1), "unusable_pscore",
     "must be >= 0, got -1"),
    ("dm without model", lambda: estimate(data(), Estimator.DM), "estimated_rewards",
     "is required by dm, got None"),
    ("dr without model", lambda: estimate(data(), "dr"), "estimated_rewards",
     "is required by dr, got None"),
    ("unknown estimator", lambda: estimate(data(), "magic"), "estimator",
     "must be one of dm, ips, snips, dr, sndr, switch-dr, got 'magic'"),
    ("level", lambda: estimate(data(), Estimator.IPS, level=1.5), "level",
     "must be in (0, 1), got 1.5"),
    ("tau", lambda: estimate(data(estimated_rewards=MODEL), "switch-dr", tau=0.0), "tau",
     "must be > 0, got 0.0"),
    ("n_boot", lambda: Bootstrap(n_boot=10), "n_boot", "must be >= 100, got 10"),
    ("round values of snips", lambda: round_values(data(), Estimator.SNIPS), "estimator",
     "must be additive (dm, ips, dr, switch-dr) for round values, got snips"),
    ("slice labels", lambda: diagnostics_by_slice(data(), ["a", "b"]), "labels",
     "must have shape (4,), got (2,)"),
    ("stream before data", lambda: StreamingEstimator("ips").estimate(), "batch",
     "no rounds yet: call update() first"),
    ("alpha", lambda: AsymptoticCS(alpha=0.0), "alpha", "must be in (0, 1), got 0.0"),
    ("n_star", lambda: AsymptoticCS(n_star=-1), "n_star", "must be > 0, got -1"),
    ("cs values NaN", lambda: AsymptoticCS().update(np.array([1.0, np.nan])), "values",
     "must be finite, got nan at round 1"),
    ("betting bounds", lambda: BettingCS(lower=1.0, upper=0.0), "bounds",
     "must be finite with lower < upper, got [1.0, 0.0]"),
    ("betting grid", lambda: BettingCS(grid_size=5), "grid_size",
     "must be an integer >= 10, got 5"),
    ("betting outside", lambda: BettingCS().update(np.array([0.5, 1.5])), "values",
     "must be in [0, 1], got 1.5 at round 1"),
    ("off-policy weight", lambda: OffPolicyBettingCS().update(
        weight=np.array([1.0, -2.0]), reward=np.array([1.0, 0.0])), "weight",
     "must be >= 0, got -2.0 at round 1"),
    ("off-policy reward", lambda: OffPolicyBettingCS().update(
        weight=np.array([1.0, 2.0]), reward=np.array([1.0, 2.0])), "reward",
     "must be in [0, 1], got 2.0 at round 1"),
    ("off-policy lengths", lambda: OffPolicyBettingCS().update(
        weight=np.array([1.0]), reward=np.array([1.0, 0.0])), "weight",
     "must have one entry per reward (2), got 1"),
    ("proportion outcome", lambda: ProportionCS().update(np.array([0.0, 0.5])), "outcomes",
     "must be 0 or 1, got 0.5 at round 1"),
    ("proportion counts", lambda: ProportionCS().update_counts(5, 3), "successes",
     "must be in [0, trials], got 5/3"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("build", "field", "message"),
    [pytest.param(build, field, message, id=name) for name, build, field, message in CASES],
)
def test_invalid_input_names_the_argument(
    build: Callable[[], object], field: str, message: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        build()
    assert caught.value.field == field
    assert str(caught.value) == f"`{field}` {message}"
