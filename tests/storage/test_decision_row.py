"""`decision_row` logs what the straightforward conversion logged, field for field.

The checks below state, field by field, what the conversion logged before it
was tuned for the scorer thread (each prediction converted twice, status read
through the enum); the tuned one must log the same on real decisions of every
registered policy and on hand-made edge cases (defer, non-finite values,
errors). The storage tests build their rows with it too (`storage_helpers`).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from service.contract import DEFAULT_FEATURES, DEFER
from service.pipeline.scoring import ScoredDecision, score_requests
from service.policies.base import DecisionStatus
from service.policies.registry import load_registry
from service.policies.synthetic import random_requests
from service.server.decision_log import decision_row
from service.storage.log.rows import DecisionRow

POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"


def _optional(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def assert_same_row(got: DecisionRow, d: ScoredDecision, scored_at: float) -> None:
    """`got` logs `d` as the straightforward conversion did, field by field.

    Each field is checked against the rule it follows (copied, renamed, NULL
    when non-finite, packed little-endian, predictions of the chosen option
    only), with its exact type and, for the predictions, its key order (the
    order of the logged JSON); every field of `DecisionRow` must be checked.
    """
    checked: set[str] = set()

    def check(name: str, expected: object) -> None:
        value = getattr(got, name)
        assert type(value) is type(expected), name
        assert value == expected, name
        if isinstance(expected, dict):
            assert list(value) == list(expected), name  # same order in the logged JSON
        checked.add(name)

    for name in ("request_id", "request_time", "policy_version", "error"):
        check(name, getattr(d, name))
    for name in ("raw_favourite_infeasible", "agrees_with_production"):
        check(name, getattr(d, name))
    for name in ("chosen_probability", "production_probability", "defer_probability"):
        check(name, _optional(getattr(d, name)))
    check("policy_name", d.policy)
    check("status", d.status.value)
    check("chosen_option", d.chosen)
    check("scores_f32", np.asarray(d.scores, dtype="<f4").tobytes())
    check("probabilities_f64", np.asarray(d.probabilities, dtype="<f8").tobytes())
    predicted = None
    if d.predictions and d.chosen != DEFER:
        predicted = {
            name: float(values[d.chosen])
            for name, values in d.predictions.items()
            if math.isfinite(float(values[d.chosen]))
        }
    check("predicted", predicted)
    check("latency_us", round(d.latency_us))
    check("scored_at", scored_at)
    assert checked == {field.name for field in dataclasses.fields(DecisionRow)}


@pytest.fixture(scope="module")
def decisions() -> list[ScoredDecision]:
    policies = list(load_registry(POLICIES_DIR).policies.values())
    _, scored, _ = score_requests(random_requests(11, 40), policies, DEFAULT_FEATURES)
    return scored


def test_rows_of_real_decisions_match_the_reference(decisions: list[ScoredDecision]) -> None:
    assert any(d.predictions for d in decisions)
    for d in decisions:
        assert_same_row(decision_row(d, 1.7e9), d, 1.7e9)


def test_edge_cases_match_the_reference(decisions: list[ScoredDecision]) -> None:
    base = next(d for d in decisions if d.predictions and d.chosen != DEFER)
    assert base.predictions is not None
    names = list(base.predictions)
    holes = {
        name: np.where(np.arange(len(v)) % 2 == k % 2, np.nan, v).astype(np.float32)
        for k, (name, v) in enumerate(base.predictions.items())
    }
    holes[names[0]] = np.full_like(holes[names[0]], np.inf)
    cases = [
        dataclasses.replace(base, predictions=holes),
        dataclasses.replace(
            base, predictions={n: np.full(1, np.nan, np.float32) for n in names}, chosen=0
        ),
        dataclasses.replace(base, predictions={}),
        dataclasses.replace(base, chosen=DEFER),
        dataclasses.replace(
            base,
            status=DecisionStatus.ERROR,
            chosen_probability=math.nan,
            production_probability=math.inf,
            defer_probability=-math.inf,
            error="boom",
            latency_us=2.5,
        ),
        dataclasses.replace(base, status=DecisionStatus.TIMEOUT, production_probability=None),
        dataclasses.replace(
            base,
            scores=base.scores.astype(np.float64),
            probabilities=base.probabilities.astype(np.float32),
        ),
    ]
    for d in cases:
        assert_same_row(decision_row(d, 0.0), d, 0.0)
