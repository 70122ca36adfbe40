"""The production emulator: known propensities, identical on both paths, every mode."""

from __future__ import annotations

import numpy as np
import pytest

from service.contract import DEFAULT_FEATURES, DEFER, check_feasibility
from service.environment import (
    ContextPool,
    EmulatorMode,
    LeastLoaded,
    ProductionConfig,
    ProductionEmulator,
    RandomFeasible,
    ThroughputAware,
    ThroughputTable,
    World,
    log_episode,
)
from service.environment.policy_kit import first_best, greedy, sample, softmax
from service.policies.base import Policy, ScoringBatch


def _batch(pool: ContextPool) -> ScoringBatch:
    rows = [pool.features[t, : pool.n_options[t]] for t in range(pool.n)]
    return ScoringBatch(
        features=np.concatenate(rows),
        offsets=np.concatenate([[0], np.cumsum(pool.n_options)]).astype(np.int64),
        mask=np.concatenate([pool.mask[t, : pool.n_options[t]] for t in range(pool.n)]),
        requests=pool.requests,
    )


def test_the_policy_path_gives_the_logged_propensities(small_pool: ContextPool) -> None:
    """The fast path that logged the data and `ProductionEmulator.decide` agree exactly."""
    config = ProductionConfig()
    d = ProductionEmulator(config).decide(_batch(small_pool), np.random.default_rng(0))
    logged = np.concatenate(
        [
            small_pool.logging_probabilities[t, : small_pool.n_options[t]]
            for t in range(small_pool.n)
        ]
    )
    np.testing.assert_allclose(d.probabilities, logged, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(d.defer_probability, small_pool.logging_probabilities[:, -1])
    logged_p = []
    for r in small_pool.requests:
        assert r.production is not None and r.production.propensity is not None
        logged_p.append(r.production.propensity)
    chosen_p = small_pool.logging_probabilities[np.arange(small_pool.n), small_pool.logged_action]
    np.testing.assert_allclose(chosen_p, np.array(logged_p))


@pytest.mark.parametrize("mode", list(EmulatorMode))
def test_every_mode_logs_valid_distributions(small_world: World, mode: EmulatorMode) -> None:
    config = ProductionConfig(mode=mode, temperature=0.2, epsilon=0.25)
    world = World(small_world.scenario.replace(production=config))
    log = log_episode(world, seed=2, episode=0)
    for d in log.decisions:
        p, mask = d.probabilities, d.mask
        assert p.sum() + d.defer_probability == pytest.approx(1.0)
        assert not p[~mask].any() and d.defer_probability == 0.0
        assert p[d.chosen] > 0 and d.propensity == p[d.chosen]
        if mode is EmulatorMode.DETERMINISTIC:
            assert d.propensity == 1.0
        elif mode is EmulatorMode.SOFTMAX:
            assert (p[mask] > 0).all()
        else:
            assert p[mask].min() >= 0.25 / mask.sum() - 1e-12


def test_distributions_follow_their_formulas() -> None:
    scores = np.array([0.1, 0.5, 0.5, -1.0, 2.0])
    mask = np.array([True, True, True, True, False])
    p, defer = softmax(scores, mask, 0.5)
    expected = np.exp(scores[mask] / 0.5) / np.exp(scores[mask] / 0.5).sum()
    np.testing.assert_allclose(p[mask], expected)
    assert p[~mask].sum() == 0 and defer == 0
    p, _ = greedy(scores, mask, 0.2)
    np.testing.assert_allclose(p, [0.05, 0.45, 0.45, 0.05, 0.0])
    p, _ = first_best(scores, mask)
    np.testing.assert_array_equal(p, [0, 1, 0, 0, 0])
    none = np.zeros(5, dtype=bool)
    assert (
        softmax(scores, none, 1.0)[1]
        == greedy(scores, none)[1]
        == first_best(scores, none)[1]
        == 1.0
    )


def test_sampling_draws_in_proportion() -> None:
    dist = (np.array([0.2, 0.0, 0.5]), 0.3)
    rng = np.random.default_rng(0)
    draws = np.array([sample(dist, float(u)) for u in rng.random(20_000)])
    freq = [np.mean(draws == a) for a in (0, 1, 2, DEFER)]
    np.testing.assert_allclose(freq, [0.2, 0.0, 0.5, 0.3], atol=0.015)
    assert sample((np.array([0.4, 0.6]), 0.0), 1.0 - 1e-17) == 1  # never defers without mass


@pytest.mark.parametrize("make", [ThroughputAware, LeastLoaded, RandomFeasible, ProductionEmulator])
def test_simulator_policies_keep_the_policy_contract(
    small_pool: ContextPool, make: type, table: ThroughputTable
) -> None:
    policy: Policy = make(table) if make is ThroughputAware else make()
    batch = _batch(small_pool)
    d = policy.decide(batch, np.random.default_rng(1))
    assert isinstance(policy, Policy)
    sums = np.add.reduceat(d.probabilities, batch.offsets[:-1]) + d.defer_probability
    np.testing.assert_allclose(sums, 1.0)
    assert not d.probabilities[~batch.mask].any()
    for r in range(batch.n_requests):
        lo = int(batch.offsets[r])
        c = int(d.chosen[r])
        assert c == DEFER or (batch.mask[lo + c] and d.probabilities[lo + c] > 0)
    again = policy.decide(batch, np.random.default_rng(1))
    np.testing.assert_array_equal(d.chosen, again.chosen)


def test_throughput_aware_picks_the_measured_fastest_class(
    small_pool: ContextPool, table: ThroughputTable
) -> None:
    """It takes a feasible option of the highest expected measured rate (which is not always
    the newest class: Gavel measured Recommendation faster on K80 than on V100)."""
    policy = ThroughputAware(table)
    checked = 0
    for request in small_pool.requests:
        feas = check_feasibility(request.state, request.workload, request.options)
        batch = ScoringBatch(
            DEFAULT_FEATURES(request.state, request.workload, request.options),
            np.array([0, request.options.n_options]),
            feas.mask,
            (request,),
        )
        rate = policy.expected_rate(request)
        c = int(policy.decide(batch, np.random.default_rng(0)).chosen[0])
        assert rate[c] == pytest.approx(rate[feas.mask].max())
        checked += 1
    assert checked == small_pool.n
