"""`decision_row` logs what the straightforward conversion logged, field for field.

The reference below is the conversion as it was before it was tuned for the
scorer thread (each prediction converted twice, status read through the enum);
the tuned one must give equal rows on real decisions of every registered
policy and on hand-made edge cases (defer, non-finite values, errors).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from service.contract import DEFAULT_FEATURES, DEFER
from service.decision_log import decision_row
from service.pipeline.scoring import ScoredDecision, score_requests
from service.policies.base import DecisionStatus
from service.policies.registry import load_registry
from service.policies.synthetic import random_requests
from service.storage.rows import DecisionRow

POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"


def _optional(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def reference_row(d: ScoredDecision, scored_at: float) -> DecisionRow:
    predicted = None
    if d.predictions and d.chosen != DEFER:
        predicted = {
            name: float(values[d.chosen])
            for name, values in d.predictions.items()
            if math.isfinite(float(values[d.chosen]))
        }
    return DecisionRow(
        request_id=d.request_id,
        request_time=d.request_time,
        policy_name=d.policy,
        policy_version=d.policy_version,
        status=d.status.value,
        chosen_option=d.chosen,
        chosen_probability=_optional(d.chosen_probability),
        production_probability=_optional(d.production_probability),
        defer_probability=_optional(d.defer_probability),
        scores_f32=np.asarray(d.scores, dtype="<f4").tobytes(),
        probabilities_f64=np.asarray(d.probabilities, dtype="<f8").tobytes(),
        predicted=predicted,
        raw_favourite_infeasible=d.raw_favourite_infeasible,
        agrees_with_production=d.agrees_with_production,
        latency_us=round(d.latency_us),
        error=d.error,
        scored_at=scored_at,
    )


def assert_same_row(got: DecisionRow, expected: DecisionRow) -> None:
    for field in dataclasses.fields(DecisionRow):
        a, b = getattr(got, field.name), getattr(expected, field.name)
        assert type(a) is type(b), field.name
        assert a == b, field.name
        if isinstance(b, dict):
            assert list(a) == list(b), field.name  # same order in the logged JSON


@pytest.fixture(scope="module")
def decisions() -> list[ScoredDecision]:
    policies = list(load_registry(POLICIES_DIR).policies.values())
    _, scored, _ = score_requests(random_requests(11, 40), policies, DEFAULT_FEATURES)
    return scored


def test_rows_of_real_decisions_match_the_reference(decisions: list[ScoredDecision]) -> None:
    assert any(d.predictions for d in decisions)
    for d in decisions:
        assert_same_row(decision_row(d, 1.7e9), reference_row(d, 1.7e9))


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
        assert_same_row(decision_row(d, 0.0), reference_row(d, 0.0))
