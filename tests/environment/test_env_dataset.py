"""Logged datasets as arrays: shapes, exact truths, and replications fast enough for statistics."""

from __future__ import annotations

import numpy as np
import pytest

from service.contract import N_FEATURES, SIGNALS
from service.environment import (
    ContextPool,
    LeastLoaded,
    ProductionEmulator,
    RandomFeasible,
    ThroughputAware,
    ThroughputTable,
    World,
)
from service.environment.dataset import target_probabilities
from service.environment.episode import OUTCOME_FIELDS
from service.policies.base import Policy


def test_shapes_are_as_documented(small_pool: ContextPool, small_world: World) -> None:
    p = small_pool
    n, k, m = p.n, small_world.max_options, p.outcomes.shape[2]
    assert p.features.shape == (n, k, N_FEATURES) and p.features.dtype == np.float32
    assert p.mask.shape == (n, k + 1) and p.mask[:, k].all()
    assert p.violations.shape == (n, k + 1, len(SIGNALS))
    assert p.logging_probabilities.shape == (n, k + 1)
    assert p.outcomes.shape == (n, k + 1, m, len(OUTCOME_FIELDS))
    assert p.logged_outcomes.shape == (n, len(OUTCOME_FIELDS))
    for t in range(n):
        assert not p.features[t, p.n_options[t] :].any()  # zero padding
        assert not p.mask[t, p.n_options[t] : k].any()
    np.testing.assert_array_equal(
        p.mask[:, :k], ~p.violations[:, :k].any(axis=2) & (np.arange(k) < p.n_options[:, None])
    )
    q, q_se = p.q()
    assert np.isfinite(q[p.mask]).all() and np.isnan(q[~p.mask]).all()
    assert np.isfinite(q_se[p.mask]).all()


def test_the_logged_dataset_is_what_production_did(small_pool: ContextPool) -> None:
    d = small_pool.logged()
    for t, r in enumerate(d.requests):
        assert r.production is not None
        assert r.production.option == d.action[t] and r.production.propensity == d.propensity[t]
    columns = {f: small_pool.logged_outcomes[:, i] for i, f in enumerate(OUTCOME_FIELDS)}
    np.testing.assert_array_equal(d.reward, small_pool.reward_spec.evaluate(columns))
    assert (d.cost == 0).all()  # production only takes feasible options
    cost = small_pool.cost_table()
    k = small_pool.defer_column
    real = np.zeros_like(small_pool.mask)
    real[:, :k] = np.arange(k) < small_pool.n_options[:, None]
    infeasible = real & ~small_pool.mask
    assert infeasible.any()
    assert (cost[infeasible] > 0).all() and (cost[~infeasible] == 0).all()


def test_thousands_of_replications_are_faithful(small_pool: ContextPool) -> None:
    # How fast is a benchmark's question (make bench), not a pass/fail here.
    p = small_pool
    rep = p.sample(np.random.default_rng(0), 4000)
    assert rep.action.shape == rep.reward.shape == rep.propensity.shape == (4000, p.n)
    rows = np.broadcast_to(np.arange(p.n), rep.action.shape)
    assert p.mask[rows, rep.action].all()
    np.testing.assert_array_equal(rep.propensity, p.logging_probabilities[rows, rep.action])
    freq = np.stack([(rep.action == a).mean(axis=0) for a in range(p.mask.shape[1])], axis=1)
    np.testing.assert_allclose(freq, p.logging_probabilities, atol=0.04)
    table = p.reward_table()
    assert np.isin(rep.reward[0], table[np.arange(p.n), rep.action[0]].reshape(-1)).all()


@pytest.mark.parametrize("name", ["least-loaded", "random-feasible", "throughput-aware"])
def test_ips_over_replications_is_unbiased_for_the_exact_truth(
    small_pool: ContextPool, table: ThroughputTable, name: str
) -> None:
    """The truth of resampled data is exact, so an unbiased estimator must centre on it."""
    targets: dict[str, Policy] = {
        "least-loaded": LeastLoaded(),
        "random-feasible": RandomFeasible(),
        "throughput-aware": ThroughputAware(table),
    }
    target = targets[name]
    p = small_pool
    pi = target_probabilities(p.features, p.n_options, p.mask, p.requests, target)
    rep = p.sample(np.random.default_rng(5), 4000)
    rows = np.broadcast_to(np.arange(p.n), rep.action.shape)
    ips = (pi[rows, rep.action] / rep.propensity * rep.reward).mean(axis=1)
    truth = p.truth(target).value.value
    se = ips.std(ddof=1) / np.sqrt(len(ips))
    assert abs(ips.mean() - truth) < 4 * se


def test_policy_and_array_targets_agree(small_pool: ContextPool, table: ThroughputTable) -> None:
    for policy in (ThroughputAware(table), LeastLoaded(), ProductionEmulator()):
        pi = target_probabilities(
            small_pool.features, small_pool.n_options, small_pool.mask, small_pool.requests, policy
        )
        a, b = small_pool.truth(policy), small_pool.truth(pi)
        np.testing.assert_array_equal(a.per_decision, b.per_decision)
    production = small_pool.truth(small_pool.logging_probabilities)
    emulator = small_pool.truth(ProductionEmulator())
    assert production.value.value == pytest.approx(emulator.value.value)
    assert production.value.se > 0


def _bad(p: ContextPool, kind: str) -> np.ndarray:
    dist = p.logging_probabilities.copy()
    if kind == "shape":
        return dist[:, :-1]
    if kind == "negative":
        dist[0, :] = 0.0
        dist[0, -1], dist[0, int(np.flatnonzero(p.mask[0])[0])] = 1.5, -0.5
        return dist
    if kind == "sum":
        return dist * 0.5
    dist[:] = 0.0  # all mass on an infeasible (or padding) column of some decision
    t = int(np.flatnonzero((~p.mask).any(axis=1))[0])
    dist[:, -1] = 1.0
    dist[t, -1], dist[t, int(np.flatnonzero(~p.mask[t])[0])] = 0.0, 1.0
    return dist


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("shape", "`action_dist` must have shape"),
        ("negative", "must be non-negative and sum to 1"),
        ("sum", "must be non-negative and sum to 1"),
        ("infeasible", "puts probability on an infeasible action"),
    ],
)
def test_invalid_targets_are_refused(small_pool: ContextPool, kind: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        small_pool.truth(_bad(small_pool, kind))


def test_one_replication_is_a_logged_dataset_view(small_pool: ContextPool) -> None:
    d = small_pool.replicate(np.random.default_rng(3))
    assert d.features is small_pool.features  # contexts shared, not copied
    assert d.n == small_pool.n
    t = d.truth(small_pool.logging_probabilities)
    assert t.per_decision.shape == (d.n,)
