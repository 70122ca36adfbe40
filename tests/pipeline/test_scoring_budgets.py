"""Time budgets are declared per reference micro-batch and scale with batch size."""

from __future__ import annotations

import time

import numpy as np
import pytest

from service.contract import MirrorRequest
from service.pipeline.scoring import REFERENCE_BATCH, score_batch
from service.policies.base import DecisionStatus, PolicyDecisions, ScoringBatch
from service.policies.baselines import FirstFit
from service.policies.batching import make_batch


class PerRequestCost:
    """First-fit that sleeps a fixed time per request in the batch."""

    version = "test"

    def __init__(self, name: str, seconds_per_request: float) -> None:
        self.name = name
        self.cost = seconds_per_request

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        time.sleep(self.cost * batch.n_requests)  # its cost, not a synchronisation
        return FirstFit().decide(batch, rng)


@pytest.mark.live
def test_budget_scales_with_the_batch_and_still_catches_a_slow_policy(
    requests_sample: list[MirrorRequest],
) -> None:
    """The scaled budget is read from the timeout's message, so no margin races the clock.

    The slow policy is eight times over its scaled budget (a loaded machine only
    makes it slower); the steady one is far under a generous budget.
    """
    batch = make_batch(requests_sample)  # 30 requests: scale 30/16 = 1.875
    assert batch.n_requests > REFERENCE_BATCH
    steady = PerRequestCost("steady", 0.0)
    slow = PerRequestCost("slow", 0.01)  # 300 ms: eight times the scaled 37.5 ms
    decisions, runs = score_batch(batch, [steady, slow], {"steady": 60.0, "slow": 0.020})
    status = {
        name: {d.status for d in decisions if d.policy == name} for name in ("steady", "slow")
    }
    assert DecisionStatus.TIMEOUT not in status["steady"]
    assert status["slow"] == {DecisionStatus.TIMEOUT}
    errors = {r.policy: r.error for r in runs}
    assert errors["steady"] is None
    assert errors["slow"] is not None and "budget 37.50 ms" in errors["slow"], errors
