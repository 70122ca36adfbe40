"""One simulator log at >= 70% cluster utilisation with co-location on, built once per session.

At decision time the shipped training scenario averages 63% utilisation
(60-job episodes, an empty cluster at t=0). Here it is loaded: long
background jobs hold 60% of the GPUs at t=0, 30 jobs per episode (for build
speed); sharing (packing) stays on. Production's softmax is tempered
(temperature 1.0) so every feasible option has a real propensity (weights
below ~7). Building costs ~55 ms a decision, so it happens once; the tests
replicate with `tests.ope.simdata.draw`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from numpy.typing import NDArray

from service.environment import (
    ContextPool,
    EmulatorMode,
    LeastLoaded,
    ProductionConfig,
    RandomFeasible,
    ThroughputAware,
    World,
    build_pool,
    load_scenario,
    load_throughputs,
)
from service.environment.dataset import target_probabilities
from tests.ope.simdata import cluster_utilisation

LOADED = {"jobs_per_episode": 30, "background_fraction": 0.6}
"""The training scenario, loaded: 30 jobs per episode, 60% of GPUs busy with long jobs at t=0."""


@dataclass(frozen=True, eq=False)
class Sim:
    """The session's log: the pool and the targets as ``(n, A)`` action distributions."""

    pool: ContextPool
    targets: dict[str, NDArray[np.float64]]
    utilisation: float

    def truth(self, target: str) -> float:
        return self.pool.truth(self.targets[target]).value.value


@pytest.fixture(scope="session")
def sim() -> Sim:
    train = load_scenario("train")
    world = World(train.replace(**LOADED, production=ProductionConfig(temperature=1.0)))
    assert world.scenario.packing, "co-location must be on"
    pool = build_pool(world, seed=11, n_episodes=4, n_worlds=3)
    utilisation = cluster_utilisation(pool)
    print(
        f"\n[ope] simulator log: scenario train (jobs 30, background 0.6, packing on, "
        f"softmax T=1.0), {pool.n} decisions, mean cluster utilisation at decision "
        f"{utilisation:.1%}"
    )
    assert utilisation >= 0.70
    policies = (ThroughputAware(load_throughputs()), LeastLoaded(), RandomFeasible())
    targets = {
        p.name: target_probabilities(pool.features, pool.n_options, pool.mask, pool.requests, p)
        for p in policies
    }
    targets["production"] = pool.logging_probabilities
    return Sim(pool, targets, utilisation)


@pytest.fixture(scope="session")
def deterministic_pool() -> ContextPool:
    """A small log from a deterministic production (propensity 1: no overlap)."""
    train = load_scenario("train")
    world = World(
        train.replace(
            **LOADED, production=ProductionConfig(mode=EmulatorMode.DETERMINISTIC)
        ).replace(jobs_per_episode=12)
    )
    return build_pool(world, seed=3, n_episodes=2, n_worlds=2)
