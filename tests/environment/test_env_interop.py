"""Any `Policy` — here the baselines of `service.policies` — can be evaluated by the truths."""

from __future__ import annotations

import numpy as np
import pytest

from service.environment import ContextPool, World, on_policy

baselines = pytest.importorskip("service.policies.baselines")


@pytest.mark.parametrize("make", ["RandomFeasible", "FirstFit", "BestFit", "LeastLoaded"])
def test_service_baselines_get_both_truths(
    small_pool: ContextPool, small_world: World, make: str
) -> None:
    policy = getattr(baselines, make)()
    truth = small_pool.truth(policy)
    assert truth.per_decision.shape == (small_pool.n,)
    assert 0.0 <= truth.value.value <= 1.0 and truth.value.se >= 0.0
    result = on_policy(small_world, policy, seed=11, n_episodes=2)
    assert np.isfinite(result.reward).all()
    assert (result.infeasible_choices == 0).all() and not result.truncated.any()


def test_production_mirror_follows_the_log(small_pool: ContextPool) -> None:
    """Mirroring production's logged action is the truth of the logged actions themselves."""
    truth = small_pool.truth(baselines.ProductionMirror())
    q, _ = small_pool.q()
    expected = q[np.arange(small_pool.n), small_pool.logged_action]
    np.testing.assert_allclose(truth.per_decision, expected)
