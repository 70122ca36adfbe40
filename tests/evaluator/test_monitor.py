"""The experiment monitor on small synthetic batches: gating, identifiability, rates, quality."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from service.protocols import Action, State, parse_protocol
from service.protocols.criteria import Evaluation, Status
from service.protocols.monitor import ExperimentMonitor
from service.protocols.reward_model import LinearOutcomeModel
from service.protocols.rounds import Decisions, JoinedRounds, QualityCounts
from service.protocols.trackers import BettingTracker, DifferenceTracker
from service.protocols.verdicts import decide
from tests.evaluator.conftest import protocol_doc

RNG = np.random.default_rng(5)


def _rounds(n: int, *, harm: float = 0.0, deterministic: bool = False) -> JoinedRounds:
    """Two actions + DEFER; production uniform over the two (or always action 0)."""
    action = np.zeros(n, dtype=np.int64) if deterministic else RNG.integers(0, 2, n)
    pscore = np.ones(n) if deterministic else np.full(n, 0.5)
    reward = (RNG.random(n) < np.where(action == 1, 0.7 - 2 * harm, 0.7)).astype(float)
    target = np.zeros((n, 3))
    target[:, 1] = 1.0  # the candidate always takes action 1
    return JoinedRounds(
        reward=reward, cost=np.zeros(n), action=action, pscore=pscore, target=target
    )


def _by_name(evs: tuple[Evaluation, ...]) -> dict[str, Evaluation]:
    return {e.name: e for e in evs}


def _monitor(**changes: Any) -> ExperimentMonitor:
    return ExperimentMonitor(parse_protocol(protocol_doc(**changes)))


def test_no_verdict_before_minimum_samples() -> None:
    m = _monitor()
    m.update_joined(_rounds(150, harm=0.3))
    evs = _by_name(m.evaluations(0.0))
    assert evs["reward-harm"].status is Status.INSUFFICIENT
    assert evs["reward-harm"].value is None and "150 of 200" in evs["reward-harm"].note
    assert decide(tuple(evs.values()), State.RUNNING, m.protocol.mode) is None
    m.update_joined(_rounds(400, harm=0.3))
    evs = _by_name(m.evaluations(0.0))
    assert evs["reward-harm"].status is Status.FIRED
    assert evs["reward-harm"].bound is not None and evs["reward-harm"].bound < 0.0


def test_no_overlap_is_not_identifiable_and_ends_inconclusive() -> None:
    m = _monitor()
    m.update_joined(_rounds(300, deterministic=True))
    evs = m.evaluations(0.0)
    harm = _by_name(evs)["reward-harm"]
    assert harm.status is Status.NOT_IDENTIFIABLE and harm.value is None
    assert "no overlap" in harm.note
    verdict = decide(evs, State.RUNNING, m.protocol.mode)
    assert verdict is not None
    assert (verdict.action, verdict.criterion) == (Action.DECLARE_INCONCLUSIVE, "identifiability")


def test_error_rate_against_a_limit_and_a_named_baseline() -> None:
    doc = protocol_doc(
        baseline={"policy": "least-loaded", "version": "builtin-1"},
        stop=[
            {"name": "errors", "metric": "policy_error_rate", "worse_than": 0.05},
            {"name": "errors-vs", "metric": "policy_error_rate", "worse_than_baseline_by": 0.02},
        ],
    )
    m = ExperimentMonitor(parse_protocol(doc))
    n = 2000
    rounds = _rounds(n)
    m.update_joined(
        JoinedRounds(**{**rounds.__dict__, "baseline_target": np.tile([0.5, 0.5, 0.0], (n, 1))})
    )
    no = np.zeros(n, dtype=bool)
    cand = Decisions(RNG.random(n) < 0.2, no, no, np.full(n, 3.0))
    base = Decisions(no, no, no, np.full(n, 1.0))
    m.update_decisions(cand, base)
    evs = _by_name(m.evaluations(0.0))
    assert evs["errors"].status is Status.FIRED and evs["errors"].method == "proportion-cs"
    assert evs["errors-vs"].status is Status.FIRED
    assert evs["errors-vs"].value == pytest.approx(evs["errors"].value)


def test_data_quality_from_counts_and_unavailable_coverage() -> None:
    doc = protocol_doc(
        data_quality=[
            {"metric": "outcome_join_rate", "worse_than": 0.8},
            {"metric": "missing_propensity_rate", "worse_than": 0.1},
            {"metric": "mirror_coverage", "worse_than": 0.9},
        ]
    )
    m = ExperimentMonitor(parse_protocol(doc))
    m.observe_quality(QualityCounts(1000, 500, 1000, 10, 1000, None))
    evs = m.evaluations(0.0)
    q = _by_name(evs)
    assert q["outcome_join_rate"].status is Status.FIRED
    assert q["outcome_join_rate"].value == 0.5
    assert q["missing_propensity_rate"].status is Status.PENDING
    assert q["mirror_coverage"].status is Status.UNAVAILABLE
    verdict = decide(evs, State.RUNNING, m.protocol.mode)
    assert verdict is not None
    assert (verdict.action, verdict.criterion) == (Action.DECLARE_INCONCLUSIVE, "outcome_join_rate")


def test_self_normalised_estimators_use_their_additive_counterpart_and_say_so() -> None:
    m = _monitor(analysis={"estimator": "snips"})
    m.update_joined(_rounds(400))
    note = _by_name(m.evaluations(0.0))["reward-harm"].note
    assert "snips has no per-round terms: the sequence uses ips" in note


def test_betting_sequence_when_the_reward_is_bounded_and_a_fallback_when_not() -> None:
    m = _monitor(analysis={"estimator": "ips", "sequence": "betting"})
    m.update_joined(_rounds(600, harm=0.3))
    harm = _by_name(m.evaluations(0.0))["reward-harm"]
    assert harm.method == "off-policy-betting-cs" and harm.status is Status.FIRED
    unbounded = _monitor(
        reward={"weights": {"slo_met": 1.0, "queue_delay_s": -0.001}},
        analysis={"estimator": "ips", "sequence": "betting"},
    )
    unbounded.update_joined(_rounds(300))
    e = _by_name(unbounded.evaluations(0.0))["reward-harm"]
    assert e.method == "asymptotic-cs" and "betting needs a bounded reward" in e.note


def test_the_outcome_model_predicts_from_earlier_batches_only() -> None:
    model = LinearOutcomeModel(n_features=2)
    features = RNG.random((50, 2, 2)).astype(np.float32)
    action = RNG.integers(0, 3, 50)
    assert not model.predict(features).any()  # nothing learnt yet: DR = IPS
    model.learn(features, action, features[np.arange(50), np.minimum(action, 1), 0] * 2.0)
    q = model.predict(features)
    assert q.shape == (50, 3) and q[:, :2].std() > 0


def test_maximum_duration_and_authority_breaches() -> None:
    m = _monitor()
    evs = _by_name(m.evaluations(15 * 86400.0))
    assert evs["max_duration"].status is Status.FIRED
    online = protocol_doc(
        mode="online-bounded",
        candidate={"policy": "candidate", "version": "1", "sha256": "a" * 64},
        rollback=[{"name": "rollback-harm", "metric": "reward", "worse_than_baseline_by": 0.1}],
        authority={
            "traffic_fraction": 0.1,
            "pools": ["V100"],
            "workload_kinds": ["train"],
            "max_concurrent_placements": 2,
            "max_duration": "1d",
        },
    )
    m = ExperimentMonitor(parse_protocol(online))
    m.observe_breaches(["`pool` 'K80' is not in `authority.pools` ['V100']"])
    verdict = decide(m.evaluations(0.0), State.RUNNING, m.protocol.mode)
    assert verdict is not None
    assert (verdict.action, verdict.criterion) == (Action.SIGNAL_ROLLBACK, "authority")
    assert "K80" in verdict.reason


def test_against_production_the_betting_sequence_is_paired_and_narrower() -> None:
    """Candidate minus production on the same rounds: one paired betting sequence
    (PairedOffPolicyBettingCS) instead of two halves at alpha/2 joined by a union bound.
    Both keep their coverage under any weight tail; the paired one must be narrower, and
    it must still cover the true difference (0.1 - 0.4) on fresh seeds."""
    covered, narrower = 0, 0
    for seed in range(40):
        rng = np.random.default_rng(100 + seed)
        n = 600
        action = rng.integers(0, 2, n)
        reward = (rng.random(n) < np.where(action == 1, 0.1, 0.7)).astype(float)
        target = np.zeros((n, 3))
        target[:, 1] = 1.0
        rounds = JoinedRounds(
            reward=reward, cost=np.zeros(n), action=action, pscore=np.full(n, 0.5), target=target
        )
        m = _monitor(analysis={"estimator": "ips", "sequence": "betting"})
        m.update_joined(rounds)
        harm = _by_name(m.evaluations(0.0))["reward-harm"]
        assert harm.method == "off-policy-betting-cs"
        union = DifferenceTracker(
            BettingTracker("y", 0.025, 0.0, 1.0, weight="w"), BettingTracker("y", 0.025, 0.0, 1.0)
        )
        union.update({"y": reward, "w": (action == 1) / 0.5})
        truth = 0.1 - 0.4  # candidate's value minus production's (uniform over 0.7 and 0.1)
        paired_interval = m.trackers["reward-harm"].interval()
        covered += paired_interval.lower <= truth <= paired_interval.upper
        u = union.interval()
        narrower += (paired_interval.upper - paired_interval.lower) < (u.upper - u.lower)
    assert covered >= 38, covered  # nominal 95%; betting is conservative
    assert narrower == 40, narrower
