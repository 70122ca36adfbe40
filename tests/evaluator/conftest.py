"""Evaluator fixtures: the simulator log the statistical tests sample from, protocol documents.

The statistical tests draw i.i.d. rounds from one simulator log (the loaded
training scenario of tests/ope: 60% of GPUs busy at t=0, co-location on,
production's softmax at temperature 1.0) with `tests.ope.simdata.draw`, so
every candidate's per-decision value is known exactly. Candidates are action
distributions over the log's decisions:

- ``worst``: the feasible option with the lowest true value (DEFER only
  when nothing is feasible);
- ``throughput``: the simulator's throughput-aware policy;
- ``equal``: a mixture of the two whose value equals production's exactly
  (the null: a different policy, equally good);
- ``harm(k)``: a mixture whose value is production's minus ``k`` times the
  declared margin.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from service.environment import (
    ContextPool,
    ProductionConfig,
    ThroughputAware,
    World,
    build_pool,
    load_scenario,
    load_throughputs,
)
from service.environment.dataset import target_probabilities

MARGIN = 0.05
"""The declared margin of the statistical tests' protocol (reward guardrail; SLO-met share)."""

BASE_DOC: dict[str, Any] = {
    "schema": "understudy-protocol/v1",
    "id": "sim-harm",
    "version": 1,
    "title": "Simulated candidate vs production",
    "hypothesis": "The candidate is no worse than production.",
    "owners": ["alice"],
    "mode": "shadow",
    "candidate": {"policy": "candidate", "version": "1"},
    "baseline": "production",
    "reward": {"weights": {"slo_met": 1.0}},
    "primary": {"metric": "reward", "minimum_detectable_effect": MARGIN},
    "guardrails": [{"metric": "reward", "margin": MARGIN}],
    "stop": [{"name": "reward-harm", "metric": "reward", "worse_than_baseline_by": 0.0}],
    "minimum_samples": 200,
    "max_duration": "14d",
    "alpha": 0.05,
    "analysis": {"estimator": "dr", "sequence": "asymptotic"},
}


def protocol_doc(**changes: Any) -> dict[str, Any]:
    """The statistical tests' protocol with top-level keys replaced."""
    doc = copy.deepcopy(BASE_DOC)
    doc.update(changes)
    return doc


@dataclass(frozen=True, eq=False)
class Sim:
    """The session's simulator log and candidates (module docstring)."""

    pool: ContextPool
    q: NDArray[np.float64]
    production: NDArray[np.float64]
    worst: NDArray[np.float64]
    throughput: NDArray[np.float64]

    def value(self, target: NDArray[np.float64]) -> float:
        """The exact per-decision value of `target` on the log."""
        return float((target * self.q).sum(axis=1).mean())

    def mixture(self, value: float) -> NDArray[np.float64]:
        """throughput x lam + worst x (1 - lam) with exactly `value`."""
        lo, hi = self.value(self.worst), self.value(self.throughput)
        lam = (value - lo) / (hi - lo)
        assert 0 <= lam <= 1, f"{value} is outside [{lo}, {hi}]"
        mix: NDArray[np.float64] = lam * self.throughput + (1 - lam) * self.worst
        return mix

    @property
    def equal(self) -> NDArray[np.float64]:
        """A candidate unlike production with production's exact value."""
        return self.mixture(self.value(self.production))

    def harm(self, k: float) -> NDArray[np.float64]:
        """A candidate ``k`` margins worse than production."""
        return self.mixture(self.value(self.production) - k * MARGIN)


@pytest.fixture(scope="session")
def sim() -> Sim:
    train = load_scenario("train")
    world = World(
        train.replace(
            jobs_per_episode=30,
            background_fraction=0.6,
            production=ProductionConfig(temperature=1.0),
        )
    )
    pool = build_pool(world, seed=11, n_episodes=4, n_worlds=3)
    q = np.nan_to_num(pool.q()[0])
    k = pool.defer_column
    worst = np.zeros_like(q)
    options = np.where(pool.mask[:, :k], q[:, :k], np.inf)
    feasible = pool.mask[:, :k].any(axis=1)
    worst[np.arange(pool.n), np.where(feasible, options.argmin(axis=1), k)] = 1.0
    throughput = target_probabilities(
        pool.features, pool.n_options, pool.mask, pool.requests, ThroughputAware(load_throughputs())
    )
    return Sim(pool, q, pool.logging_probabilities, worst, throughput)
