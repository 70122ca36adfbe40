"""A planner whose model is the outcome predictor's file shares that predictor's object.

``lcb-planner`` and ``learned-outcome`` ship the same ONNX file (one sha256):
the registry hands the planner the loaded predictor, so a micro-batch scored
by the planner and by a policy attaching that predictor's predictions
(``iwr-scorer``) runs the model once. The decisions must be exactly those of
a planner that runs the model on its own rows.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.contract import DEFAULT_FEATURES
from service.environment import simulated_episodes
from service.pipeline.scoring import score_requests
from service.policies.onnx_policy import OnnxPredictor
from service.policies.planner import LcbPlanner
from service.policies.registry import load_registry

POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"


class RowsOnly:
    """The predictor seen through `predict_rows` alone: the planner's own path."""

    def __init__(self, inner: OnnxPredictor) -> None:
        self.inner = inner

    def predict_rows(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        return self.inner.predict_rows(x)

    def predict_rows_flagged(
        self, x: NDArray[np.float32]
    ) -> tuple[NDArray[np.float32], NDArray[np.float32] | None]:
        return self.inner.predict_rows_flagged(x)


def _fields(decisions: list[Any]) -> list[tuple[Any, ...]]:
    """Every field but the wall-clock latency, arrays as bytes."""
    out = []
    for d in decisions:
        values: list[Any] = []
        for f in fields(d):
            v = getattr(d, f.name)
            if f.name == "latency_us":
                continue
            if isinstance(v, dict):
                v = {k: a.tobytes() for k, a in v.items()}
            values.append(v.tobytes() if isinstance(v, np.ndarray) else repr(v))
        out.append(tuple(values))
    return out


def test_planner_shares_the_outcome_predictor_and_decides_exactly_the_same() -> None:
    registry = load_registry(POLICIES_DIR)
    shared = registry.predictors["learned-outcome"]
    planner = registry.policies["lcb-planner"]
    assert isinstance(planner, LcbPlanner) and isinstance(shared, OnnxPredictor)
    assert planner.predictor is shared  # one object, one session
    own = LcbPlanner(
        planner.name, planner.version, RowsOnly(shared), planner.planning, planner._rule
    )
    iwr = registry.policies["iwr-scorer"]
    requests = [r for reqs, _ in simulated_episodes("train", 31, range(3)) for r in reqs]

    runs = 0
    run = shared.model.run

    def counted(x: Any) -> Any:
        nonlocal runs
        runs += 1
        return run(x)

    shared.model.run = counted  # type: ignore[method-assign]
    try:
        batches = [requests[i : i + 64] for i in range(0, len(requests), 64)]
        with_shared = [score_requests(b, [iwr, planner], DEFAULT_FEATURES)[1] for b in batches]
        shared_runs = runs
        with_own = [score_requests(b, [iwr, own], DEFAULT_FEATURES)[1] for b in batches]
    finally:
        del shared.model.run
    assert shared_runs == len(batches)  # once per batch for iwr-scorer and the planner
    assert runs - shared_runs == 2 * len(batches)  # the planner's own path runs it again
    for a, b in zip(with_shared, with_own, strict=True):
        assert _fields(a) == _fields(b)
