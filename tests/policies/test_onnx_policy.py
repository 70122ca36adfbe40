"""ONNX policies at score time: failures stay inside one policy and one batch."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper

from service.contract import FEATURE_NAMES, MirrorRequest, WorkloadKind
from service.policies.base import DecisionStatus, ScoringBatch
from service.policies.batching import make_batch
from service.policies.errors import PolicyScoringError
from service.policies.manifest import load_manifest
from service.policies.onnx_policy import OnnxModel, OnnxPolicy, distinct_rows
from service.policies.predictor_features import PREDICTOR_FEATURES
from service.policies.probabilities import ProbabilityRule
from service.policies.registry import Registry, load_registry
from service.policies.runner import decide_all, decide_isolated

from .conftest import POLICIES_DIR, replace_workload

KIND_INFER = FEATURE_NAMES.index("kind_infer")


def tiny_model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> bytes:
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [None, len(FEATURE_NAMES)])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, 1])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def nan_on_inference_model() -> bytes:
    """``log(1 - 2 * kind_infer)``: 0 for other kinds, NaN for inference jobs."""
    return tiny_model(
        [
            helper.make_node("Gather", ["features", "col"], ["infer"], axis=1),
            helper.make_node("Mul", ["infer", "minus_two"], ["scaled"]),
            helper.make_node("Add", ["scaled", "one"], ["shifted"]),
            helper.make_node("Log", ["shifted"], ["scores"]),
        ],
        [
            helper.make_tensor("col", TensorProto.INT64, [1], [KIND_INFER]),
            helper.make_tensor("minus_two", TensorProto.FLOAT, [1], [-2.0]),
            helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]),
        ],
    )


def reshaping_model() -> bytes:
    """Reshapes the rows to width 4: fails in ONNX Runtime when rows * 38 is not divisible by 4."""
    return tiny_model(
        [
            helper.make_node("Reshape", ["features", "shape"], ["wide"]),
            helper.make_node("ReduceSum", ["wide", "axes"], ["scores"], keepdims=1),
        ],
        [
            helper.make_tensor("shape", TensorProto.INT64, [2], [-1, 4]),
            helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
        ],
    )


def add_policy(root: Path, name: str, model: bytes) -> None:
    """A policy folder next to the committed ones, manifest derived from the scorer's."""
    folder = root / name
    folder.mkdir()
    (folder / "model.onnx").write_bytes(model)
    data = yaml.safe_load((POLICIES_DIR / "gavel-scorer" / "policy.yaml").read_text())
    data.update(name=name, predictor=None, probabilities={"rule": "argmax"})
    data["model"]["sha256"] = hashlib.sha256(model).hexdigest()
    (folder / "policy.yaml").write_text(yaml.safe_dump(data))


@pytest.fixture
def with_nan_policy(tmp_path: Path) -> Registry:
    root = tmp_path / "policies"
    shutil.copytree(POLICIES_DIR, root)
    add_policy(root, "nan-on-infer", nan_on_inference_model())
    return load_registry(root)


def test_nan_at_score_time_errors_that_policy_for_that_batch_only(
    with_nan_policy: Registry, requests: list[MirrorRequest]
) -> None:
    # It passed check_policy at load (the probe has no inference jobs)...
    assert "nan-on-infer" in with_nan_policy.policies
    decided = [r for r in requests if r.production is not None]
    training = make_batch(decided)
    with_infer = make_batch([*decided[:2], replace_workload(decided[2], kind=WorkloadKind.INFER)])
    policies = list(with_nan_policy.policies.values())
    # ...so a batch without one is fine, a batch with one is an error for it alone.
    ok = decide_all(policies, training, seed=1)
    assert ok["nan-on-infer"].error is None
    runs = decide_all(policies, with_infer, seed=1)
    bad = runs.pop("nan-on-infer")
    assert bad.decisions.status == (DecisionStatus.ERROR,) * 3
    assert bad.error is not None and "is nan" in bad.error
    assert bad.decisions.probabilities.sum() == 0
    for name, run in runs.items():
        assert run.error is None, (name, run.error)
        assert set(run.decisions.status) <= {DecisionStatus.OK, DecisionStatus.ALL_INFEASIBLE}
    # The next batch is scored normally again.
    assert decide_all(policies, training, seed=1)["nan-on-infer"].error is None


def test_onnx_runtime_failure_becomes_a_scoring_error(batch: ScoringBatch) -> None:
    manifest = dataclasses.replace(
        load_manifest(POLICIES_DIR / "gavel-scorer" / "policy.yaml"), name="reshaper"
    )
    policy = OnnxPolicy(OnnxModel(manifest, reshaping_model()), ProbabilityRule())
    # The model reshapes its input to (-1, 4): it runs when rows x features divide by 4
    # (and then returns the wrong count), and ONNX Runtime fails when they do not.
    width = batch.features.shape[1]
    fits = next(n for n in range(48, len(batch.features)) if n * width % 4 == 0)
    bad = fits - 1 if (fits - 1) * width % 4 else fits + 1
    odd = dataclasses.replace(batch, features=batch.features[:bad], mask=batch.mask[:bad])
    odd = dataclasses.replace(odd, offsets=np.array([0, bad], dtype=np.int64), requests=())
    with pytest.raises(PolicyScoringError, match=r"policy `reshaper`: ONNX Runtime failed: "):
        policy.decide(odd, np.random.default_rng(0))
    even = dataclasses.replace(odd, features=batch.features[:fits], mask=batch.mask[:fits])
    even = dataclasses.replace(even, offsets=np.array([0, fits], dtype=np.int64))
    got = fits * width // 4
    with pytest.raises(PolicyScoringError, match=rf"expected {fits} scores, got \({got},\)"):
        policy.decide(even, np.random.default_rng(0))
    run = decide_isolated(policy, odd, np.random.default_rng(0))
    assert run.decisions.status == (DecisionStatus.ERROR,) and "ONNX Runtime failed" in str(
        run.error
    )


def test_scorer_attaches_predictions_and_samples_from_softmax(
    registry: Registry, decided_batch: ScoringBatch
) -> None:
    scorer = registry.policies["gavel-scorer"]
    d = scorer.decide(decided_batch, np.random.default_rng(0))
    assert d.predictions is not None
    q10, q50, q90 = (d.predictions[f"throughput_q{q}"] for q in (10, 50, 90))
    assert (q10 <= q50).all() and (q50 <= q90).all()
    ct = d.predictions["completion_time_q50"]
    np.testing.assert_allclose(ct, 50_000.0 / q50, rtol=1e-5)
    first = d.probabilities[decided_batch.offsets[0] : decided_batch.offsets[1]]
    assert 0 < first.max() < 1  # softmax, not argmax


@pytest.mark.live
@pytest.mark.parametrize("name", ["gavel-scorer", "throughput-greedy"])
def test_latency_of_a_16_by_50_batch_is_within_budget(
    name: str, registry: Registry, large_batch: ScoringBatch
) -> None:
    policy = registry.policies[name]
    rng = np.random.default_rng(0)
    policy.decide(large_batch, rng)
    # CPU seconds of this process (all its threads), not wall time: other work on a busy
    # machine delays a call without making it cost more, and the budget is about the cost.
    times = []
    for _ in range(30):
        start = time.process_time()
        policy.decide(large_batch, rng)
        times.append(time.process_time() - start)
    assert float(np.median(times)) < registry.manifests["gavel-scorer"].time_budget_ms / 1e3


def test_distinct_rows_dedupes_a_real_batch(large_batch: ScoringBatch) -> None:
    x = PREDICTOR_FEATURES(large_batch.requests)
    unique, inverse = distinct_rows(x)
    assert len(unique) == len(np.unique(x, axis=0)) < len(x) / 5  # no fallback, real saving
    np.testing.assert_array_equal(unique[inverse], x)


def test_distinct_rows_round_trips_exactly() -> None:
    rng = np.random.default_rng(3)
    base = rng.normal(size=(7, 14)).astype(np.float32)
    x = base[rng.integers(0, 7, 500)]
    unique, inverse = distinct_rows(x)
    assert len(unique) == len(np.unique(x, axis=0))
    np.testing.assert_array_equal(unique[inverse], x)
    empty_key = np.zeros((3, 14), dtype=np.float32)
    empty_key[1, 0], empty_key[2, 1] = 1.0, 1.0  # distinct rows, checked not merged
    u, inv = distinct_rows(empty_key)
    np.testing.assert_array_equal(u[inv], empty_key)
