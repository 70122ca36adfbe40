"""The core stays free of transport and storage; only onnx_policy touches onnxruntime."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import service.policies

PACKAGE = Path(service.policies.__file__).resolve().parent
MODULES = sorted(PACKAGE.rglob("*.py"))
FORBIDDEN = ("fastapi", "grpc", "sqlalchemy", "prometheus_client", "starlette", "uvicorn")
BUILD_ONLY = ("sklearn", "skl2onnx", "threadpoolctl")


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_import_rules(path: Path) -> None:
    roots = imported_roots(path)
    rel = path.relative_to(PACKAGE).as_posix()
    assert not roots & set(FORBIDDEN), f"{rel} imports {roots & set(FORBIDDEN)}"
    if rel != "onnx_policy.py":
        assert "onnxruntime" not in roots, f"{rel} imports onnxruntime"
    if not rel.startswith("build_models/") or rel == "build_models/gavel.py":
        assert not roots & set(BUILD_ONLY), f"{rel} imports build-time {roots & set(BUILD_ONLY)}"


def test_importing_the_package_loads_neither_onnxruntime_nor_sklearn() -> None:
    code = (
        "import sys, service.policies, service.learning.build_models.gavel;"
        "print(sorted(m for m in ('onnxruntime', 'sklearn', 'skl2onnx') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_public_api_is_pinned() -> None:
    assert sorted(service.policies.__all__) == sorted(
        [
            "PREDICTION_NAMES", "PREDICTOR_FEATURES", "BestFit", "DecisionStatus", "FirstFit",
            "LeastLoaded", "Manifest", "ManifestKind", "OnnxModel", "OnnxPolicy", "OnnxPredictor",
            "Policy", "PolicyConformanceError", "PolicyDecisions", "PolicyError", "PolicyLoadError",
            "PolicyRun", "PolicyScoringError", "Predictor", "ProbabilityRule", "ProductionMirror",
            "RandomFeasible", "Registry", "RuleKind", "ScoringBatch", "ThroughputGreedy",
            "builtin_baselines", "check_policy", "check_predictor", "decide_all",
            "decide_from_scores", "decide_isolated", "load_manifest", "load_registry",
            "make_batch", "parse_job_type",
        ]
    )  # fmt: skip
    for name in service.policies.__all__:
        assert getattr(service.policies, name) is not None
