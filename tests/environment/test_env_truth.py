"""The two ground truths, their gap, and heterogeneity on the real numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.environment import (
    OUTCOME_FIELDS,
    Estimate,
    World,
    counterfactual_outcomes,
    log_episode,
    on_policy,
)
from service.environment.report import reference_policies, truth_rows
from service.environment.reproduction import heterogeneity


def test_estimate_mean_error_and_interval() -> None:
    e = Estimate.of(np.array([1.0, 2.0, 3.0, 4.0]))
    assert e.value == 2.5 and e.n == 4
    assert e.se == pytest.approx(np.std([1, 2, 3, 4], ddof=1) / 2)
    lo, hi = e.interval()
    assert lo == pytest.approx(2.5 - 1.959963984540054 * e.se) and hi > e.value
    assert math.isinf(Estimate.of(np.array([1.0])).se)


def test_the_logged_action_in_the_logged_world_reproduces_the_log(small_world: World) -> None:
    log = log_episode(small_world, seed=8, episode=1)
    done = log.job_outcomes()
    k = small_world.max_options
    for d in log.decisions[::3]:
        y = counterfactual_outcomes(d, [log.final.randomness], k + 1)
        i = int(np.flatnonzero(done.job == d.job)[0])
        logged = [getattr(done, f)[i] for f in OUTCOME_FIELDS]
        np.testing.assert_allclose(y[d.chosen, 0], logged, rtol=1e-12)  # closed form vs events
        feasible = np.zeros(k + 1, dtype=bool)
        feasible[: len(d.mask)] = d.mask
        feasible[k] = True
        assert np.isnan(y[~feasible]).all()
        assert np.isfinite(y[k, 0]).all()  # deferring has a truth too


def test_on_policy_of_production_is_the_logged_trajectory(small_world: World) -> None:
    result = on_policy(small_world, None, seed=4, n_episodes=2)
    for e in range(2):
        logged = log_episode(small_world, seed=4, episode=e).job_outcomes()
        np.testing.assert_array_equal(
            result.outcomes[e].completion_time_s, logged.completion_time_s
        )
    assert not result.truncated.any() and (result.infeasible_choices == 0).all()


@pytest.mark.slow
def test_production_has_no_gap_between_its_two_truths(small_world: World) -> None:
    """Production's per-decision value *is* its on-policy value in expectation: a check on the
    forks, the worlds and the keyed randomness together."""
    (row,) = truth_rows(small_world, reference_policies(small_world)[:1], 21, 16, 2)
    assert row.gap.se < 0.05
    assert abs(row.gap.value) < 4 * row.gap.se


@pytest.mark.slow
def test_heterogeneity_matters_on_the_real_numbers(worlds: dict[str, World]) -> None:
    """Throughput-aware beats least-loaded on mean completion time, 95% interval above zero."""
    h = heterogeneity(worlds["train"], n_episodes=40, seed=0)
    lo, _ = h.difference_s.interval()
    assert lo > 0, h


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["train", "mix_shift", "new_class", "degraded", "surge", "fragmented"]
)
def test_both_truths_and_their_gap_for_two_policies_in_every_scenario(
    worlds: dict[str, World], name: str
) -> None:
    world = World(worlds[name].scenario.replace(jobs_per_episode=16))
    policies = reference_policies(world)[:3]  # production, throughput-aware, least-loaded
    rows = truth_rows(world, policies, seed=2, n_episodes=3, n_worlds=2)
    assert [r.policy for r in rows] == [p[0] for p in policies]
    for r in rows:
        for e in (r.per_decision, r.on_policy, r.gap):
            assert np.isfinite(e.value) and np.isfinite(e.se) and e.n == 3
        assert 0.0 <= r.per_decision.value <= 1.0 and 0.0 <= r.on_policy.value <= 1.0
        assert r.gap.value == pytest.approx(r.on_policy.value - r.per_decision.value)
        assert r.per_decision_mc_se >= 0.0
