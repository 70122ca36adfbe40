"""Registry: the committed artifacts load and conform; bad ones are refused alone."""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.contract import DEFAULT_FEATURES
from service.policies.base import ScoringBatch
from service.policies.check import check_policy, check_predictor
from service.policies.onnx_policy import CPU, OnnxPolicy, OnnxPredictor, resolve_providers
from service.policies.predictor_features import PREDICTOR_FEATURES
from service.policies.registry import Registry, load_registry

from .conftest import POLICIES_DIR

MANIFESTS = sorted(p.parent.name for p in POLICIES_DIR.glob("*/policy.yaml"))
SCORER, PREDICTOR = "gavel-scorer", "gavel-throughput"
BASELINES = {"production-mirror", "random-feasible", "first-fit", "best-fit", "least-loaded"}
LEARNED = {"lcb-planner", "iwr-scorer"}  # `understudy train` (service/learning), docs/learning.md


def test_policies_folder_has_the_shipped_models() -> None:
    assert {SCORER, PREDICTOR} <= set(MANIFESTS)


def test_committed_artifacts_load_without_refusals(registry: Registry) -> None:
    assert dict(registry.refused) == {}
    assert set(registry.policies) == {SCORER, "throughput-greedy"} | BASELINES | LEARNED
    assert set(registry.predictors) == {PREDICTOR, "learned-outcome"}
    assert registry.time_budgets_s[SCORER] == pytest.approx(0.02)


@pytest.mark.parametrize("name", MANIFESTS)
def test_check_policy_over_every_manifest(
    name: str, registry: Registry, decided_batch: ScoringBatch, large_batch: ScoringBatch
) -> None:
    for batch in (decided_batch, large_batch):
        if name in registry.predictors:
            check_predictor(registry.predictors[name], batch)
        else:
            check_policy(registry.policies[name], batch, seed=11)


def test_manifests_record_the_running_feature_definitions(registry: Registry) -> None:
    assert registry.manifests[SCORER].feature_hash == DEFAULT_FEATURES.definition_hash
    assert registry.manifests[PREDICTOR].feature_hash == PREDICTOR_FEATURES.definition_hash
    summary = registry.manifests[SCORER].training_data
    assert set(summary.feature_means) == set(DEFAULT_FEATURES.names)
    # trained on the simulator's `train` scenario (service.learning.build_models)
    assert summary.hardware_classes == ("K80", "V100")


def test_cuda_configured_but_absent_runs_on_cpu_and_says_so(
    registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    assert registry.manifests[SCORER].execution_providers[0] == "CUDAExecutionProvider"
    with caplog.at_level(logging.WARNING, logger="service.policies.onnx_policy"):
        fresh = load_registry(POLICIES_DIR, available_providers=[CPU], include_baselines=False)
    scorer, predictor = fresh.policies[SCORER], fresh.predictors[PREDICTOR]
    assert isinstance(scorer, OnnxPolicy) and isinstance(predictor, OnnxPredictor)
    assert scorer.provider == CPU and predictor.provider == CPU
    assert any(
        "gavel-scorer" in r.message and "CUDAExecutionProvider" in r.message and CPU in r.message
        for r in caplog.records
    )


def test_resolve_providers_keeps_order_and_always_ends_on_cpu() -> None:
    assert resolve_providers(["CUDAExecutionProvider", CPU], [CPU]) == (
        [CPU],
        ["CUDAExecutionProvider"],
    )
    assert resolve_providers(["A", "B"], ["B", CPU]) == (["B", CPU], ["A"])


# --- refusals ---------------------------------------------------------------


def edit_yaml(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = folder / "policy.yaml"
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def rewrite_model(folder: Path, data: bytes) -> None:
    """Replace the model and fix the manifest's sha256, so only the content is wrong."""
    (folder / "model.onnx").write_bytes(data)
    edit_yaml(folder, lambda d: d["model"].__setitem__("sha256", hashlib.sha256(data).hexdigest()))


def corrupt(root: Path) -> None:
    rewrite_model(root / SCORER, b"\x08\x07 not an onnx model")


def sha_mismatch(root: Path) -> None:
    with (root / SCORER / "model.onnx").open("ab") as fh:
        fh.write(b"\x00")


def wrong_input_name(root: Path) -> None:
    edit_yaml(root / SCORER, lambda d: d["inputs"][0].__setitem__("name", "x"))


def wrong_manifest_shape(root: Path) -> None:
    edit_yaml(root / SCORER, lambda d: d["inputs"][0].__setitem__("shape", ["N", 25]))


def model_of_other_shape(root: Path) -> None:
    rewrite_model(root / SCORER, (root / PREDICTOR / "model.onnx").read_bytes())


def wrong_output_dtype(root: Path) -> None:
    edit_yaml(root / SCORER, lambda d: d["outputs"][0].__setitem__("dtype", "float64"))


def other_feature_hash(root: Path) -> None:
    edit_yaml(root / SCORER, lambda d: d["features"].__setitem__("definition_hash", "0" * 64))


def unknown_key(root: Path) -> None:
    edit_yaml(root / SCORER, lambda d: d.__setitem__("temprature", 3))


def baseline_name(root: Path) -> None:
    (root / SCORER).rename(root / "first-fit")
    edit_yaml(root / "first-fit", lambda d: d.__setitem__("name", "first-fit"))


REFUSALS = [
    (corrupt, SCORER, r"cannot load model `model.onnx`: .*INVALID_PROTOBUF"),
    (sha_mismatch, SCORER, r"sha256 mismatch: `model.onnx` hashes to [0-9a-f]{64}, manifest says"),
    (
        wrong_input_name,
        SCORER,
        r"`inputs` names are \['x'\] in the manifest, \['features'\] in the model",
    ),
    (wrong_manifest_shape, SCORER, r"`inputs\[0\].shape` must be \[N, 39\], got \['N', 25\]"),
    (
        model_of_other_shape,
        SCORER,
        r"`inputs\[0\].shape` is \['N', 39\] in the manifest, \[.*18\] in the model",
    ),
    (
        wrong_output_dtype,
        SCORER,
        r"`outputs\[0\].dtype` is float64 in the manifest, float32 in the model",
    ),
    (other_feature_hash, SCORER, r"feature definition mismatch: .* rebuild the model"),
    (unknown_key, SCORER, r"`temprature` is not a manifest key"),
    (baseline_name, "first-fit", r"name is taken by a built-in baseline"),
]


@pytest.fixture
def policies_copy(tmp_path: Path) -> Path:
    root = tmp_path / "policies"
    shutil.copytree(POLICIES_DIR, root)
    return root


@pytest.mark.parametrize(
    ("damage", "name", "problem"), REFUSALS, ids=[r[0].__name__ for r in REFUSALS]
)
def test_bad_artifact_is_refused_and_the_rest_load(
    policies_copy: Path, damage: Callable[[Path], None], name: str, problem: str
) -> None:
    damage(policies_copy)
    reg = load_registry(policies_copy)
    assert set(reg.refused) == {name}
    error = reg.refused[name]
    assert error.policy == name and str(error).startswith(f"policy `{name}`: ")
    assert re.search(problem, error.problem), error.problem
    assert PREDICTOR in reg.predictors and "throughput-greedy" in reg.policies
    assert set(reg.policies) >= BASELINES


def test_policy_whose_predictor_is_refused_is_refused_too(policies_copy: Path) -> None:
    sha_mismatch_predictor = policies_copy / PREDICTOR / "model.onnx"
    sha_mismatch_predictor.write_bytes(sha_mismatch_predictor.read_bytes() + b"\x00")
    reg = load_registry(policies_copy)
    assert set(reg.refused) == {PREDICTOR, SCORER}
    assert "uses predictor `gavel-throughput`, which is not loaded" in reg.refused[SCORER].problem
    assert "throughput-greedy" not in reg.policies and set(reg.policies) >= BASELINES
