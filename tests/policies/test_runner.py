"""decide_all: isolation, independent generators, time budgets."""

from __future__ import annotations

import time

import numpy as np
import pytest

from service.policies.base import DecisionStatus, PolicyDecisions, ScoringBatch
from service.policies.baselines import FirstFit, RandomFeasible
from service.policies.runner import decide_all, policy_rng


class Boom:
    """A policy that implements the interface and always fails."""

    name = "boom"
    version = "0"

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        raise RuntimeError("model server fell over")


class Slow(FirstFit):
    """First-fit that takes 30 ms."""

    name = "slow"

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        time.sleep(0.03)  # its cost: six times the 5 ms budget, and load only adds
        return super().decide(batch, rng)


class NanProbabilities(FirstFit):
    """Returns decisions whose probabilities are NaN."""

    name = "nan-probabilities"

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        d = super().decide(batch, rng)
        d.probabilities[:] = np.nan
        return d


def test_a_raising_policy_errors_alone(decided_batch: ScoringBatch) -> None:
    runs = decide_all([Boom(), FirstFit(), NanProbabilities()], decided_batch, seed=0)
    assert runs["boom"].decisions.status == (DecisionStatus.ERROR,) * decided_batch.n_requests
    assert runs["boom"].error == "RuntimeError: model server fell over"
    assert runs["nan-probabilities"].error == "probabilities are not finite"
    assert runs["first-fit"].error is None
    assert DecisionStatus.ERROR not in runs["first-fit"].decisions.status


def test_adding_a_policy_does_not_change_another_policys_draws(
    large_batch: ScoringBatch,
) -> None:
    alone = decide_all([RandomFeasible()], large_batch, seed=9)["random-feasible"]
    crowded = decide_all([Boom(), FirstFit(), RandomFeasible()], large_batch, seed=9)
    assert np.array_equal(alone.decisions.chosen, crowded["random-feasible"].decisions.chosen)
    assert policy_rng(9, "a").random() != policy_rng(9, "b").random()


@pytest.mark.live
def test_over_budget_decisions_are_kept_but_flagged_timeout(decided_batch: ScoringBatch) -> None:
    runs = decide_all([Slow(), FirstFit()], decided_batch, 0, {"slow": 0.005, "first-fit": 60.0})
    slow = runs["slow"]
    assert slow.decisions.status == (DecisionStatus.TIMEOUT,) * decided_batch.n_requests
    assert slow.error is not None and "budget 5.00 ms" in slow.error
    assert np.array_equal(slow.decisions.chosen, runs["first-fit"].decisions.chosen)
    assert runs["first-fit"].error is None
