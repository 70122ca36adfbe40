"""One status vocabulary for every policy (issue 22 item 7), held by `check_policy`.

Every shipped policy and baseline conforms on all-infeasible and mixed requests,
production-mirror included where production chose an option the mask refuses:
that is ``infeasible_choice``, never ``all_infeasible`` (which promises a certain
defer). The checker can fail: the old mirror's labelling and a proposing policy
that claims the mirror's exception are both refused.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from service.contract import DEFER, MirrorRequest, ProductionDecision
from service.policies.base import (
    DecisionStatus,
    Policy,
    PolicyDecisions,
    ScoringBatch,
    decision_status,
)
from service.policies.baselines import ProductionMirror, builtin_baselines
from service.policies.batching import make_batch
from service.policies.check import check_policy
from service.policies.errors import PolicyConformanceError
from service.policies.registry import Registry

from .conftest import NODE_INDEX

OK, NONE, OUTSIDE = (
    DecisionStatus.OK,
    DecisionStatus.ALL_INFEASIBLE,
    DecisionStatus.INFEASIBLE_CHOICE,
)


def _with_production(r: MirrorRequest, rid: str, option: int) -> MirrorRequest:
    return dataclasses.replace(r, request_id=rid, production=ProductionDecision(option, 1.0))


@pytest.fixture(scope="module")
def status_batch(requests: list[MirrorRequest]) -> ScoringBatch:
    """Mixed and all-infeasible requests, production choosing feasible, masked or defer."""
    resnet, too_big = requests[0], requests[4]  # 1 GPU on every node; 40 GB: nothing fits
    drained = NODE_INDEX["k80-3"]  # a single-node option per node, in node order
    batch = make_batch(
        [
            _with_production(resnet, "mixed-feasible", 8),
            _with_production(resnet, "mixed-masked", drained),
            _with_production(too_big, "none-defer", DEFER),
            _with_production(too_big, "none-masked", 2),
        ]
    )
    offsets = batch.offsets
    assert batch.mask[offsets[0] + 8] and not batch.mask[offsets[1] + drained]
    assert batch.mask[offsets[0] : offsets[2]].any()
    assert not batch.mask[offsets[2] : offsets[4]].any()
    return batch


def test_production_mirror_reports_what_production_did(status_batch: ScoringBatch) -> None:
    d = check_policy(ProductionMirror(), status_batch)
    assert d.status == (OK, OUTSIDE, NONE, OUTSIDE)
    assert d.chosen.tolist() == [8, NODE_INDEX["k80-3"], DEFER, 2]
    assert d.defer_probability.tolist() == [0.0, 0.0, 1.0, 0.0]
    # all_infeasible always means "defer with probability 1"
    for r, status in enumerate(d.status):
        if status is NONE:
            assert d.chosen[r] == DEFER and d.defer_probability[r] == 1.0
    assert d.raw_favourite_infeasible.tolist() == [False, True, False, False]


@pytest.mark.parametrize("policy", builtin_baselines(), ids=lambda p: p.name)
def test_every_baseline_obeys_the_vocabulary(policy: Policy, status_batch: ScoringBatch) -> None:
    d = check_policy(policy, status_batch, seed=5)
    if policy.name != "production-mirror":
        assert d.status[2:] == (NONE, NONE)  # nothing feasible: a certain defer
        assert OUTSIDE not in d.status


def test_every_shipped_policy_obeys_the_vocabulary(
    registry: Registry, status_batch: ScoringBatch
) -> None:
    assert "production-mirror" in registry.policies
    for name, policy in registry.policies.items():
        d = check_policy(policy, status_batch, seed=5)
        for r in range(status_batch.n_requests):
            rows = slice(int(status_batch.offsets[r]), int(status_batch.offsets[r + 1]))
            assert d.status[r] is decision_status(status_batch.mask[rows], d.probabilities[rows])
        if name != "production-mirror":
            assert OUTSIDE not in d.status, name


class _OldMirror(ProductionMirror):
    """The mirror before the fix: all_infeasible beside a chosen option with probability 1."""

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        d = super().decide(batch, rng)
        status = tuple(
            NONE if not batch.mask[batch.offsets[r] : batch.offsets[r + 1]].any() else OK
            for r in range(batch.n_requests)
        )
        return dataclasses.replace(d, status=status)


class _ProposerClaimingTheException(ProductionMirror):
    """A proposing policy may not put mass on masked options, whatever status it reports."""

    records_outside_decisions = False


@pytest.mark.parametrize("policy", [_OldMirror(), _ProposerClaimingTheException()])
def test_the_checker_refuses_a_broken_vocabulary(
    policy: Policy, status_batch: ScoringBatch
) -> None:
    with pytest.raises(PolicyConformanceError) as caught:
        check_policy(policy, status_batch)
    text = str(caught.value)
    if isinstance(policy, _OldMirror):
        assert "request 3: status all_infeasible, but the rule gives infeasible_choice" in text
    else:
        assert "is infeasible but has probability" in text
