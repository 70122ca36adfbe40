"""Shared fixtures: the real data, worlds per scenario, and one small context pool.

The data files are read from the shared data folder (``$UNDERSTUDY_SHARED_DATA``
or ``../shared/data``); a missing file fails the test with the path to fix.
"""

from __future__ import annotations

import pytest

from service.environment import (
    ContextPool,
    Scenario,
    ThroughputTable,
    World,
    build_pool,
    load_scenario,
    load_throughputs,
    scenario_names,
)

SMALL_JOBS = 24
"""Jobs per episode in the small pool: enough for queues to form, cheap to fork."""


@pytest.fixture(scope="session")
def table() -> ThroughputTable:
    return load_throughputs()


@pytest.fixture(scope="session")
def scenarios() -> dict[str, Scenario]:
    return {name: load_scenario(name) for name in scenario_names()}


@pytest.fixture(scope="session")
def worlds(scenarios: dict[str, Scenario]) -> dict[str, World]:
    return {name: World(s) for name, s in scenarios.items()}


@pytest.fixture(scope="session")
def small_world(scenarios: dict[str, Scenario]) -> World:
    return World(scenarios["train"].replace(jobs_per_episode=SMALL_JOBS))


@pytest.fixture(scope="session")
def small_pool(small_world: World) -> ContextPool:
    """Four logged training episodes, every action forked into three worlds."""
    return build_pool(small_world, seed=11, n_episodes=4, n_worlds=3)
