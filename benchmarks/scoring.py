"""Scoring rows/s: Understudy's scoring step vs raw `InferenceSession.run` on the same inputs.

Understudy's figure is the scorer's whole per-batch work for the 3 ONNX
policies — contract features, feasibility mask, every policy's ``decide``
(ONNX call, predictor, probability rule) and the per-request decisions — as
option rows per second. The raw limit replays exactly the tensors those
policies handed to ONNX Runtime (recorded on a first pass), straight into
each model's ``InferenceSession.run``: same batches, same models, nothing
else. Runs are interleaved so a noisy neighbour hits both. Batches of 16
requests (the reference micro-batch) and 128 (what the scorer takes under load).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from benchmarks import workload
from benchmarks.harness import BenchResult, Row, Target
from benchmarks.policyset import policy_set
from service.contract import DEFAULT_FEATURES
from service.pipeline.scoring import score_requests
from service.policies.onnx_policy import OnnxModel

Call = tuple[Any, list[str], dict[str, np.ndarray]]


@contextmanager
def recording_ort() -> Iterator[list[Call]]:
    """Record every (session, outputs, feeds) ONNX Runtime is given while active."""
    calls: list[Call] = []
    original = OnnxModel.run

    def run(self: OnnxModel, x: np.ndarray) -> list[np.ndarray]:
        feeds = {self._input: np.ascontiguousarray(x)}
        calls.append((self._session, list(self._outputs), feeds))
        return original(self, x)

    OnnxModel.run = run  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        OnnxModel.run = original  # type: ignore[method-assign]


def run(quick: bool = False) -> BenchResult:
    """Measure both batch sizes; return the rows."""
    registry = policy_set(n_onnx=3, n_baselines=0)
    policies = list(registry.policies.values())
    n_requests = 256 if quick else 1024
    reqs = workload.requests(n_requests, seed=3)
    runs = 2 if quick else 5
    rows: list[Row] = []
    details: dict[str, Any] = {"policies": [str(p.name) for p in policies], "batches": {}}
    for size in (16, 128):
        batches = [reqs[i : i + size] for i in range(0, n_requests, size)]
        n_rows = sum(r.options.n_options for r in reqs)
        with recording_ort() as calls:
            for b in batches:
                score_requests(b, policies, DEFAULT_FEATURES)
        ours, raw = [], []
        for _ in range(runs):
            start = time.perf_counter()
            for b in batches:
                score_requests(b, policies, DEFAULT_FEATURES)
            ours.append(n_rows / (time.perf_counter() - start))
            start = time.perf_counter()
            for session, outputs, feeds in calls:
                session.run(outputs, feeds)
            raw.append(n_rows / (time.perf_counter() - start))
        details["batches"][str(size)] = {
            "requests": n_requests,
            "option_rows": n_rows,
            "ort_calls_per_batch": len(calls) / len(batches),
        }
        rows.append(
            Row.paired(
                f"scoring, 3 ONNX policies, {size}-request batches",
                "option rows/s",
                ours,
                raw,
                "InferenceSession.run on the same tensors",
                Target("scoring >= 80% of raw ONNX Runtime rows/s", 0.80),
            )
        )
    return BenchResult("scoring", rows, details)
