"""Criteria as pure functions: signs, thresholds, the judged bound, error budget, verdicts."""

from __future__ import annotations

import math

import pytest

from service.contract import InvalidInput
from service.ope import Interval, IntervalMethod
from service.protocols import Action, Against, Mode, State, parse_protocol
from service.protocols.criteria import (
    Evaluation,
    Role,
    Spec,
    Status,
    alpha_allocation,
    criteria_of,
    judge,
    without_number,
)
from service.protocols.planner import half_width, plan_protocol, samples_to_detect
from service.protocols.verdicts import decide, limit_evaluation
from tests.evaluator.conftest import protocol_doc


def _iv(lo: float, hi: float) -> Interval:
    return Interval(lo, hi, 0.95, IntervalMethod.ASYMPTOTIC_CS, 500)


# (metric, role, threshold, interval, status, bound)
JUDGEMENTS = [
    # reward is higher-is-better: harm when the upper bound is below T
    ("reward", Role.STOP, -0.05, (-0.2, -0.06), Status.FIRED, -0.06),
    ("reward", Role.STOP, -0.05, (-0.2, -0.04), Status.PENDING, -0.04),
    # cost is lower-is-better: harm when the lower bound is above T
    ("cost", Role.STOP, 0.1, (0.11, 0.3), Status.FIRED, 0.11),
    ("cost", Role.STOP, 0.1, (0.09, 0.3), Status.PENDING, 0.09),
    # success: the improvement's lower bound beyond the MDE
    ("reward", Role.PRIMARY, 0.02, (0.021, 0.2), Status.PASSED, 0.021),
    ("reward", Role.PRIMARY, 0.02, (0.0, 0.2), Status.PENDING, 0.0),
    ("reward", Role.PRIMARY, 0.02, (-0.1, 0.01), Status.FAILED, -0.1),
    # non-inferiority of a lower-is-better metric: the upper bound below the margin
    ("cost", Role.GUARDRAIL, 0.05, (-0.1, 0.04), Status.PASSED, 0.04),
    ("cost", Role.GUARDRAIL, 0.05, (-0.1, 0.06), Status.PENDING, 0.06),
    ("cost", Role.GUARDRAIL, 0.05, (0.06, 0.2), Status.FAILED, 0.2),
    # a data-quality rate (higher is better) below its limit
    ("outcome_join_rate", Role.DATA_QUALITY, 0.8, (0.5, 0.79), Status.FIRED, 0.79),
    ("policy_error_rate", Role.STOP, 0.05, (0.051, 0.09), Status.FIRED, 0.051),
]


@pytest.mark.parametrize(("metric", "role", "threshold", "iv", "status", "bound"), JUDGEMENTS)
def test_judge_table(
    metric: str,
    role: Role,
    threshold: float,
    iv: tuple[float, float],
    status: Status,
    bound: float,
) -> None:
    spec = Spec("c", role, metric, Against.BASELINE, threshold, 0.05)
    e = judge(spec, sum(iv) / 2, _iv(*iv))
    assert (e.status, e.bound, e.threshold) == (status, bound, threshold)
    assert (e.lower, e.upper, e.n) == (iv[0], iv[1], 500)


def test_thresholds_are_signed_by_the_metric_direction() -> None:
    doc = protocol_doc(
        guardrails=[
            {"metric": "reward", "margin": 0.05},
            {"metric": "cost", "margin": 0.1},
            {"metric": "scoring_latency_ms", "margin": 20.0, "reference": 5.0},
        ],
        stop=[
            {"name": "reward-harm", "metric": "reward", "worse_than_baseline_by": 0.03},
            {"name": "cost-harm", "metric": "cost", "worse_than_baseline_by": 0.2},
            {"name": "errors", "metric": "policy_error_rate", "worse_than": 0.05},
        ],
        data_quality=[{"metric": "outcome_join_rate", "worse_than": 0.8}],
    )
    specs = {s.name: s for s in criteria_of(parse_protocol(doc))}
    assert specs["primary:reward"].threshold == 0.05
    assert specs["guardrail:reward"].threshold == -0.05
    assert specs["guardrail:cost"].threshold == 0.1
    assert specs["guardrail:scoring_latency_ms"].threshold == 25.0
    assert specs["guardrail:scoring_latency_ms"].against is Against.LIMIT
    assert specs["reward-harm"].threshold == -0.03
    assert specs["cost-harm"].threshold == 0.2
    assert specs["errors"].threshold == 0.05
    assert specs["outcome_join_rate"].threshold == 0.8


def test_error_budget_split() -> None:
    doc = protocol_doc(
        alpha=0.06,
        stop=[
            {"name": "a", "metric": "reward", "worse_than_baseline_by": 0.0},
            {"name": "b", "metric": "policy_error_rate", "worse_than": 0.05},
            {"name": "c", "metric": "cost", "worse_than_baseline_by": 0.1},
        ],
        data_quality=[
            {"metric": "outcome_join_rate", "worse_than": 0.8},
            {"metric": "missing_propensity_rate", "worse_than": 0.1},
        ],
    )
    alpha = alpha_allocation(parse_protocol(doc))
    assert alpha["a"] == alpha["b"] == alpha["c"] == pytest.approx(0.02)
    assert alpha["outcome_join_rate"] == pytest.approx(0.03)
    assert alpha["primary:reward"] == alpha["guardrail:reward"] == 0.06


def _e(name: str, role: Role, status: Status) -> Evaluation:
    spec = Spec(name, role, "reward", Against.BASELINE, 0.0, 0.05)
    if status in (Status.INSUFFICIENT, Status.PENDING):
        return without_number(spec, status, 10, "")
    return Evaluation(name, role, "reward", status, -0.1, -0.05, 0.0, -0.2, -0.05, 900, 0.05, "x")


RUNNING, SIGNALLED = State.RUNNING, State.ROLLBACK_SIGNALLED
ONLINE, SHADOW = Mode.ONLINE_BOUNDED, Mode.SHADOW
PASS, FIRE, WAIT = Status.PASSED, Status.FIRED, Status.PENDING

# (evaluations, state, mode, expected action, expected criterion)
DECISIONS = [
    ([_e("p", Role.PRIMARY, PASS), _e("g", Role.GUARDRAIL, PASS)], RUNNING, SHADOW,
     Action.COMPLETE, "p"),
    ([_e("p", Role.PRIMARY, PASS), _e("g", Role.GUARDRAIL, WAIT)], RUNNING, SHADOW, None, None),
    ([_e("p", Role.PRIMARY, PASS), _e("s", Role.STOP, FIRE)], RUNNING, SHADOW, Action.STOP, "s"),
    ([_e("s", Role.STOP, FIRE), _e("r", Role.ROLLBACK, FIRE)], RUNNING, ONLINE,
     Action.SIGNAL_ROLLBACK, "r"),
    ([_e("s", Role.STOP, FIRE), _e("r", Role.ROLLBACK, FIRE)], SIGNALLED, ONLINE,
     Action.STOP, "s"),
    ([_e("r", Role.ROLLBACK, FIRE)], SIGNALLED, ONLINE, None, None),
    ([_e("q", Role.DATA_QUALITY, FIRE), _e("p", Role.PRIMARY, PASS)], RUNNING, SHADOW,
     Action.DECLARE_INCONCLUSIVE, "q"),
    ([_e("p", Role.PRIMARY, PASS)], SIGNALLED, ONLINE, None, None),
    ([limit_evaluation("max_duration", "elapsed_s", True, 10.0, 5.0, 0)], RUNNING, SHADOW,
     Action.DECLARE_INCONCLUSIVE, "max_duration"),
]  # fmt: skip


@pytest.mark.parametrize(("evs", "state", "mode", "action", "criterion"), DECISIONS)
def test_decide_table(
    evs: list[Evaluation], state: State, mode: Mode, action: Action | None, criterion: str | None
) -> None:
    verdict = decide(evs, state, mode)
    assert (verdict.action if verdict else None, verdict.criterion if verdict else None) == (
        action,
        criterion,
    )


def test_the_reason_names_value_bound_and_threshold() -> None:
    verdict = decide([_e("reward-harm", Role.STOP, FIRE)], RUNNING, SHADOW)
    assert verdict is not None
    assert "`reward-harm`" in verdict.reason
    assert "estimate -0.1, bound -0.05 vs threshold 0 at n=900" in verdict.reason


# -- the planner -------------------------------------------------------------------------------


def test_planner_sample_size_meets_its_condition_and_is_the_smallest() -> None:
    n = samples_to_detect(0.05, 0.5, 0.05, 200.0, power=0.9)
    z = 1.2815515655446004
    assert half_width(n, 0.5, 0.05, 200.0) + z * 0.5 / math.sqrt(n) <= 0.05
    assert half_width(n - 1, 0.5, 0.05, 200.0) + z * 0.5 / math.sqrt(n - 1) > 0.05
    fixed = ((1.6448536 + z) * 0.5 / 0.05) ** 2
    assert 1.5 * fixed < n < 4 * fixed  # the price of looking after every batch


def test_planner_scales_with_the_effect_and_the_sd() -> None:
    base = samples_to_detect(0.05, 0.5, 0.05, 200.0)
    assert samples_to_detect(0.1, 0.5, 0.05, 200.0) < base / 3
    assert samples_to_detect(0.05, 1.0, 0.05, 200.0) > 3 * base


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((0.0, 0.5), "effect"),
        ((-0.1, 0.5), "effect"),
        ((0.05, 0.0), "sd"),
        ((0.05, math.nan), "sd"),
    ],
)
def test_planner_refuses_what_it_cannot_plan(args: tuple[float, float], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        samples_to_detect(args[0], args[1], 0.05, 200.0)
    assert err.value.field == field


def test_protocol_plan_per_criterion() -> None:
    doc = protocol_doc(data_quality=[{"metric": "outcome_join_rate", "worse_than": 0.8}])
    plan = plan_protocol(parse_protocol(doc), {"reward": 0.5})
    harm = plan.of("reward-harm")
    assert harm.effect == 0.05 and harm.planned_value == pytest.approx(-0.05)
    assert harm.samples == samples_to_detect(0.05, 0.5, 0.05, 200.0)
    assert plan.of("primary:reward").planned_value == pytest.approx(0.1)
    assert plan.of("guardrail:reward").planned_value == pytest.approx(0.0)
    assert plan.of("outcome_join_rate").samples is None
    assert plan.samples == harm.samples
