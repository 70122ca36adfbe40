"""The core stays pure: no transport, storage or metrics imports (ARCHITECTURE.md).

Walks the AST of every module in the core packages, so the check sees imports
inside functions too, and fails naming the module and the forbidden import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "service"
CORE = ("contract", "policies", "ope", "checks", "protocols", "environment", "learning")
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
BUILD_ONLY_PREFIX = ("learning/build_models", "learning/fit.py", "learning/train.py")


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
            "server",
            "cli",
            "evaluator",
            "reports",
            "metrics",
            "settings",
            "wire",
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


# The direction inside the core: what each package may import of the project
# (besides itself). Two edges go beyond the wording, each for a reason:
# checks use ope's interval primitives (the one Clopper-Pearson and the one
# `Interval` live there), and a policy's training summary is the reference its
# drift checks compare against, so policies read the checks' summary types.
MAY_IMPORT: dict[str, set[str]] = {
    "contract": set(),
    "ope": {"service.contract"},
    "checks": {"service.contract", "service.ope.intervals", "service.ope.results"},
    "policies": {"service.contract", "service.checks.drift", "service.checks.outcome_drift"},
    "environment": {"service.contract", "service.policies.base"},
    "protocols": {"service.contract", "service.ope"},
    "wire": {"service.contract"},
}


def _project_imports(path: Path) -> set[str]:
    return {n for n in imported_roots(path) if n == "service" or n.startswith("service.")}


def _allowed(name: str, package: str) -> bool:
    own = f"service.{package}"
    if name == own or name.startswith(own + "."):
        return True
    return any(name == a or name.startswith(a + ".") for a in MAY_IMPORT[package])


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_core_packages_import_only_what_lies_below_them(package: str) -> None:
    offences = {
        path.relative_to(PACKAGE).as_posix(): sorted(bad)
        for path in sorted((PACKAGE / package).rglob("*.py"))
        if (bad := {n for n in _project_imports(path) if not _allowed(n, package)})
    }
    assert offences == {}, f"{package} imports above itself: {offences}"


def test_the_direction_check_catches_an_upward_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from service.environment import sim\n")
    assert not all(_allowed(n, "policies") for n in _project_imports(probe))
    probe.write_text("from service.contract import MirrorRequest\n")
    assert all(_allowed(n, "policies") for n in _project_imports(probe))


def test_the_top_level_holds_only_the_shared_modules() -> None:
    top = {p.name for p in PACKAGE.glob("*.py")} - {"__init__.py"}
    assert top <= {"auth.py", "settings.py", "metrics.py", "readiness.py", "capacity.py"}, top


def test_no_folder_holds_more_than_twenty_modules() -> None:
    crowded = {
        d.relative_to(PACKAGE).as_posix(): n
        for d in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir())]
        if "understudy" not in d.parts and "__pycache__" not in d.parts
        if (n := len([m for m in d.glob("*.py") if m.name != "__init__.py"])) > 20
    }
    assert crowded == {}
