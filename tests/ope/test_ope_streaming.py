"""Streaming equals batch to 1e-9: estimators, diagnostics and every confidence sequence."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.ope import (
    AsymptoticCS,
    BanditData,
    BettingCS,
    Estimate,
    Estimator,
    Interval,
    OffPolicyBettingCS,
    ProportionCS,
    StreamingEstimator,
    estimate,
    round_values,
)
from tests.ope.conftest import Sim
from tests.ope.simdata import dataset, draw, linear_model

TOL = 1e-9


def splits(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Uneven batches, including single rounds."""
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(12, n - 1), replace=False))
    return np.split(np.arange(n), cuts)


def assert_same(streamed: Estimate, batch: Estimate) -> None:
    assert streamed.value == pytest.approx(batch.value, abs=TOL)
    assert streamed.interval.lower == pytest.approx(batch.interval.lower, abs=TOL)
    assert streamed.interval.upper == pytest.approx(batch.interval.upper, abs=TOL)
    assert streamed.n == batch.n and streamed.basis is batch.basis
    for f in dataclasses.fields(batch.diagnostics):
        a, b = getattr(streamed.diagnostics, f.name), getattr(batch.diagnostics, f.name)
        assert a == pytest.approx(b, abs=TOL, nan_ok=True), f.name
    assert streamed.caveats == batch.caveats


@pytest.mark.parametrize("estimator", list(Estimator))
def test_streaming_estimates_equal_batch_on_simulator_logs(sim: Sim, estimator: Estimator) -> None:
    rng = np.random.default_rng(41)
    draws = draw(sim.pool, rng, 2, 997)
    data = dataset(
        sim.pool, draws, 0, sim.targets["least-loaded"], linear_model(sim.pool, draws, 1)
    )
    stream = StreamingEstimator(estimator, tau=3.0)
    for rows in splits(data.n, rng):
        stream.update(data.subset(rows))
    streamed, batch = stream.estimate(), estimate(data, estimator, tau=3.0)
    assert isinstance(streamed, Estimate) and isinstance(batch, Estimate)
    assert streamed.contributions is None
    assert_same(streamed, batch)


def same_interval(a: Interval, b: Interval) -> None:
    assert a.lower == pytest.approx(b.lower, abs=TOL) and a.upper == pytest.approx(b.upper, abs=TOL)
    assert a.n == b.n and a.method is b.method


def test_confidence_sequences_do_not_depend_on_batching(sim: Sim) -> None:
    rng = np.random.default_rng(43)
    draws = draw(sim.pool, rng, 2, 800)
    data = dataset(
        sim.pool, draws, 0, sim.targets["random-feasible"], linear_model(sim.pool, draws, 1)
    )
    dr = round_values(data, Estimator.DR)
    pieces = splits(data.n, rng)

    def run(rows: list[np.ndarray]) -> list[Interval]:
        asym, bet = AsymptoticCS(n_star=500), BettingCS(grid_size=300)
        off, prop = OffPolicyBettingCS(grid_size=300), ProportionCS()
        for r in rows:
            asym.update(dr[r])
            bet.update(data.reward[r])
            off.update(weight=data.weight[r], reward=data.reward[r])
            prop.update(data.reward[r] > 0.5)
        return [asym.interval(), bet.interval(), off.interval(), prop.interval()]

    for once, batched in zip(run([np.arange(data.n)]), run(pieces), strict=True):
        same_interval(batched, once)
        assert once.lower < once.upper


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(2, 40),
    actions=st.integers(2, 5),
    estimator=st.sampled_from(list(Estimator)),
)
def test_streaming_equals_batch_on_arbitrary_logs(
    seed: int, n: int, actions: int, estimator: Estimator
) -> None:
    rng = np.random.default_rng(seed)
    logging = rng.dirichlet(np.ones(actions), size=n)
    target = rng.dirichlet(np.ones(actions), size=n)
    action = np.array([rng.choice(actions, p=row) for row in logging])
    data = BanditData(
        reward=rng.normal(size=n),
        action=action,
        pscore=logging[np.arange(n), action],
        action_dist=target,
        estimated_rewards=rng.normal(size=(n, actions)),
        logging_dist=logging,
    )
    stream = StreamingEstimator(estimator, tau=2.0)
    for rows in splits(n, rng):
        stream.update(data.subset(rows))
    streamed, batch = stream.estimate(), estimate(data, estimator, tau=2.0)
    assert type(streamed) is type(batch)
    if isinstance(batch, Estimate):
        assert isinstance(streamed, Estimate)
        assert_same(streamed, batch)
