"""Build-time libraries stay in the build-time modules; the runtime side stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import service.learning

PACKAGE = Path(service.learning.__file__).resolve().parent
MODULES = sorted(PACKAGE.glob("*.py"))
BUILD_TIME = {"fit.py", "train.py"}
BUILD_ONLY = {"sklearn", "skl2onnx", "onnx", "threadpoolctl"}
FORBIDDEN = {
    "fastapi",
    "starlette",
    "grpc",
    "sqlalchemy",
    "prometheus_client",
    "psycopg",
    "uvicorn",
}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_build_time_imports_only_in_build_time_modules(path: Path) -> None:
    roots = imported_roots(path)
    assert not roots & FORBIDDEN, f"{path.name} imports {roots & FORBIDDEN}"
    assert "onnxruntime" not in roots, f"{path.name}: only service.policies.onnx_policy may"
    if path.name not in BUILD_TIME:
        assert not roots & BUILD_ONLY, f"{path.name} imports build-time {roots & BUILD_ONLY}"


def test_runtime_modules_load_no_build_time_library() -> None:
    code = (
        "import sys, service.learning.compare, service.learning.sweep, service.learning.assess,"
        " service.learning.plots, service.cli.learning;"
        "print(sorted(m for m in ('sklearn', 'skl2onnx', 'onnx') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_modules_stay_small(path: Path) -> None:
    assert len(path.read_text().splitlines()) < 400
