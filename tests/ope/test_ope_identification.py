"""No overlap, no number: a deterministic logging policy and a differing target.

The simulator's production emulator in `deterministic` mode logs propensity 1
for its best fit. A target that places jobs elsewhere puts probability on
actions never logged, so every importance-weighted estimator must answer
`NotIdentifiable` with the reason, the model-only DM must say it is
model-based, and per-slice overlap (on the per-decision feasible set) must
locate where support fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.environment import ContextPool, LeastLoaded
from service.environment.dataset import target_probabilities
from service.ope import (
    BanditData,
    Basis,
    Estimate,
    Estimator,
    NotIdentifiable,
    StreamingEstimator,
    diagnostics_by_slice,
    estimate,
    estimate_by_slice,
)
from tests.ope.simdata import exact_model


def logged(pool: ContextPool, target: np.ndarray, full_logging: bool) -> BanditData:
    d = pool.logged()
    return BanditData(
        reward=d.reward,
        action=d.action,
        pscore=d.propensity,
        action_dist=target,
        estimated_rewards=exact_model(pool),
        feasible=pool.mask,
        logging_dist=pool.logging_probabilities if full_logging else None,
    )


def least_loaded(pool: ContextPool) -> np.ndarray:
    return target_probabilities(
        pool.features, pool.n_options, pool.mask, pool.requests, LeastLoaded()
    )


@pytest.mark.parametrize("full_logging", [True, False], ids=["logging-dist", "pscore-only"])
@pytest.mark.parametrize("estimator", [e for e in Estimator if e is not Estimator.DM])
def test_deterministic_logging_and_a_differing_target_are_not_identifiable(
    deterministic_pool: ContextPool, estimator: Estimator, full_logging: bool
) -> None:
    data = logged(deterministic_pool, least_loaded(deterministic_pool), full_logging)
    assert (data.pscore == 1).all()
    result = estimate(data, estimator)
    assert isinstance(result, NotIdentifiable) and not result.identifiable
    assert "no overlap" in result.reason and "never takes" in result.reason
    assert "deterministic in 100% of the decisions that had a choice" in result.reason
    d = result.diagnostics
    assert d.unsupported_share > 0.3 and d.deterministic_share == 1.0
    assert d.support_known is full_logging
    stream = StreamingEstimator(estimator)
    for rows in np.array_split(np.arange(data.n), 3):
        stream.update(data.subset(rows))
    streamed = stream.estimate()
    assert isinstance(streamed, NotIdentifiable) and streamed.reason == result.reason


def test_dm_still_answers_but_says_it_is_model_based(deterministic_pool: ContextPool) -> None:
    data = logged(deterministic_pool, least_loaded(deterministic_pool), True)
    result = estimate(data, Estimator.DM)
    assert isinstance(result, Estimate) and result.basis is Basis.MODEL_BASED
    assert result.caveats[0].startswith("model-based")
    assert any("only the model speaks for them" in c for c in result.caveats)
    truth = deterministic_pool.truth(data.action_dist).value.value
    assert result.value == pytest.approx(truth)  # the exact model: DM is the truth here


def test_the_logging_policy_itself_is_identified(deterministic_pool: ContextPool) -> None:
    data = logged(deterministic_pool, deterministic_pool.logging_probabilities, True)
    result = estimate(data, Estimator.IPS)
    assert isinstance(result, Estimate)
    assert result.value == pytest.approx(data.reward.mean())
    assert result.diagnostics.ess == data.n and result.diagnostics.max_weight == 1.0


def test_overlap_per_slice_on_the_feasible_set(deterministic_pool: ContextPool) -> None:
    pool = deterministic_pool
    data = logged(pool, least_loaded(pool), True)
    options = pool.mask[:, :-1].sum(axis=1)  # feasible placement options (DEFER excluded)
    labels = np.where(options == 1, "one option", "several options")
    assert set(labels) == {"one option", "several options"}
    by_slice = {s.label: s for s in diagnostics_by_slice(data, labels)}
    single = by_slice["one option"]
    # the only feasible option: least-loaded agrees with production, so support holds
    assert single.failure is None and single.diagnostics.unsupported_share == 0
    several = by_slice["several options"]
    assert several.failure is not None and "no overlap" in several.failure
    estimates = {s.label: s.result for s in estimate_by_slice(data, labels, Estimator.DR)}
    assert isinstance(estimates["one option"], Estimate)
    assert isinstance(estimates["several options"], NotIdentifiable)
    print(
        f"\n[ope] deterministic logging, {pool.n} decisions: slice 'one option' "
        f"ESS {single.diagnostics.ess:.1f}; slice 'several options': {several.failure}"
    )
