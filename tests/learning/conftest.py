"""Shared fixtures: the committed artifacts, a loaded registry, a small forked pool."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.environment import ContextPool, World, build_pool, load_scenario
from service.policies.registry import Registry, load_registry

REPO_ROOT = Path(__file__).resolve().parents[2]
POLICIES_DIR = REPO_ROOT / "policies"
LEARNED = ("learned-outcome", "lcb-planner", "iwr-scorer")
SMALL_JOBS = 16
"""Jobs per episode where a test needs whole episodes but not realistic load."""


@pytest.fixture(scope="session")
def registry() -> Registry:
    return load_registry(POLICIES_DIR)


@pytest.fixture(scope="session")
def small_world() -> World:
    return World(load_scenario("train").replace(jobs_per_episode=SMALL_JOBS))


@pytest.fixture(scope="session")
def small_pool(small_world: World) -> ContextPool:
    """One training-scenario episode of 16 jobs, every action forked into two worlds."""
    return build_pool(small_world, seed=5, n_episodes=1, n_worlds=2)
