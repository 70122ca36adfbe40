"""The core stays pure: no transport, storage or metrics imports (ARCHITECTURE.md).

Walks the AST of every module in the core packages, so the check sees imports
inside functions too, and fails naming the module and the forbidden import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "service"
CORE = ("contract", "policies", "ope", "protocols", "environment", "learning")
FORBIDDEN = (
    "fastapi",
    "starlette",
    "grpc",
    "sqlalchemy",
    "prometheus_client",
    "psycopg",
    "uvicorn",
)
ONNX_MODULES = {"policies/onnx_policy.py"}
BUILD_ONLY_PREFIX = ("policies/build_models", "learning/fit.py", "learning/train.py")


def imported_roots(path: Path) -> set[str]:
    """Top-level names of every module `path` imports."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module)
    return roots


def core_modules() -> list[Path]:
    return sorted(p for pkg in CORE for p in (PACKAGE / pkg).rglob("*.py"))


def _offences(path: Path) -> list[str]:
    rel = path.relative_to(PACKAGE).as_posix()
    bad = []
    for name in imported_roots(path):
        root = name.split(".")[0]
        if root in FORBIDDEN:
            bad.append(name)
        if root == "onnxruntime" and rel not in ONNX_MODULES:
            bad.append(name)
        if root in ("skl2onnx", "sklearn", "onnx") and not rel.startswith(BUILD_ONLY_PREFIX):
            bad.append(name)
        if name.startswith("service.") and name.split(".")[1] in (
            "transport",
            "storage",
            "pipeline",
            "app",
            "metrics",
            "settings",
            "wire",
            "evidence",
        ):
            bad.append(name)
    return bad


@pytest.mark.parametrize("path", core_modules(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_core_module_imports_nothing_from_the_edges(path: Path) -> None:
    assert _offences(path) == []


def test_the_check_catches_a_forbidden_import(tmp_path: Path) -> None:
    fake = PACKAGE / "contract" / "probe_should_not_exist.py"
    assert not fake.exists()
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    import grpc\n    from sqlalchemy import orm\n")
    assert imported_roots(probe) >= {"grpc", "sqlalchemy"}


def test_contract_has_no_io_imports() -> None:
    for path in (PACKAGE / "contract").rglob("*.py"):
        roots = {n.split(".")[0] for n in imported_roots(path)}
        assert not roots & {"os", "socket", "subprocess", "pathlib", "io", "sqlite3"}, path
