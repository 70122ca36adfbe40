"""Baselines on the sample cluster: each picks what its rule says, and conforms."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from service.contract import DEFER, MirrorRequest, ProductionDecision
from service.policies.base import DecisionStatus, Policy, ScoringBatch
from service.policies.baselines import (
    BestFit,
    FirstFit,
    LeastLoaded,
    ProductionMirror,
    RandomFeasible,
    builtin_baselines,
)
from service.policies.batching import make_batch
from service.policies.check import check_policy

from .conftest import NODES


def chosen_nodes(policy: Policy, batch: ScoringBatch, seed: int = 0) -> list[str | None]:
    """Node id of the first node of each chosen option (None for defer)."""
    d = policy.decide(batch, np.random.default_rng(seed))
    out: list[str | None] = []
    for r, c in zip(batch.requests, d.chosen, strict=True):
        out.append(None if c == DEFER else NODES[int(r.options.nodes_of(int(c))[0])][0])
    return out


@pytest.mark.parametrize("policy", builtin_baselines(), ids=lambda p: p.name)
def test_every_baseline_conforms(policy: Policy, decided_batch: ScoringBatch) -> None:
    check_policy(policy, decided_batch, seed=3)


def test_first_fit_takes_the_first_feasible_option(batch: ScoringBatch) -> None:
    # ResNet-50: k80-0 is first and feasible; LM gang: v100-0 (8 free) comes first.
    assert chosen_nodes(FirstFit(), batch) == ["k80-0", "k80-0", "v100-0", "k80-0", None, "k80-0"]


def test_best_fit_packs_tightest(batch: ScoringBatch) -> None:
    # 1 GPU: p100-3 has exactly 1 free; 4 GPUs: k80-1 is the first to be left with 0 free.
    picks = chosen_nodes(BestFit(), batch)
    assert picks[0] == "p100-3" and picks[1] == "k80-1"
    # The gang: v100-0 (8 of 8) and the P100 pair (4+4 of 4+4) both leave 0; earlier wins.
    assert picks[2] == "v100-0"


def test_least_loaded_prefers_idle_nodes(batch: ScoringBatch) -> None:
    picks = chosen_nodes(LeastLoaded(), batch)
    # k80-3 (util 0) drains and p100-2 (util 0) is unhealthy: v100-3 (util 0) is free to use...
    assert picks[0] == "v100-3"
    # ...except for Recommendation, which may not use the reserved pool: p100-1 (0.05) is next.
    assert picks[3] == "p100-1"


def test_production_mirror_follows_runtime_and_errors_when_unknown(batch: ScoringBatch) -> None:
    d = ProductionMirror().decide(batch, np.random.default_rng(0))
    assert d.chosen.tolist()[:5] == [8, 9, 0, 4, DEFER]
    assert d.status[5] is DecisionStatus.ERROR
    assert d.status[4] is DecisionStatus.ALL_INFEASIBLE and d.defer_probability[4] == 1.0


def test_production_mirror_flags_an_infeasible_production_choice(
    requests: list[MirrorRequest],
) -> None:
    drained = dataclasses.replace(requests[0], production=ProductionDecision(3, 1.0))  # k80-3
    d = ProductionMirror().decide(make_batch([drained]), np.random.default_rng(0))
    assert d.chosen.tolist() == [3] and d.raw_favourite_infeasible.tolist() == [True]


def test_random_feasible_is_uniform_over_feasible_and_seeded(batch: ScoringBatch) -> None:
    policy = RandomFeasible()
    d = policy.decide(batch, np.random.default_rng(5))
    first = d.probabilities[batch.offsets[0] : batch.offsets[1]]
    np.testing.assert_allclose(first[first > 0], 1 / 10)
    assert np.isnan(d.scores).all() and not d.raw_favourite_infeasible.any()
    again = policy.decide(batch, np.random.default_rng(5))
    assert np.array_equal(d.chosen, again.chosen)
