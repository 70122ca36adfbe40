"""The public API is pinned, and the OPE core imports nothing of the project but the contract."""

from __future__ import annotations

import ast
from pathlib import Path

import service.ope

OPE = Path(service.ope.__file__).resolve().parent

EXPORTED = {
    "MIN_ESS", "SWITCH_TAU", "TAIL_THRESHOLD", "AsymptoticCS", "BanditData", "Basis",
    "BettingCS", "Bootstrap", "DiagnosticSums", "Diagnostics", "Estimate", "Estimator",
    "Interval", "IntervalMethod", "NotIdentifiable", "OffPolicyBettingCS",
    "PairedOffPolicyBettingCS", "PropensityScreen",
    "ProportionCS", "Result", "SliceDiagnostics", "SliceEstimate", "StreamingEstimator",
    "asymptotic_rho", "clopper_pearson", "diagnostics", "diagnostics_by_slice", "dm", "dr",
    "estimate", "estimate_by_slice", "identification_failure", "ips", "normal_interval",
    "one_hot", "round_values", "screen_pscore", "sndr", "snips", "switch_dr",
    "unsupported_mass",
}  # fmt: skip

ALLOWED_ROOTS = {
    "numpy",
    "scipy",
    "math",
    "dataclasses",
    "enum",
    "collections",
    "typing",
    "__future__",
}


def test_exported_names_are_pinned() -> None:
    assert set(service.ope.__all__) == EXPORTED
    for name in EXPORTED:
        assert hasattr(service.ope, name), name


def test_the_core_imports_only_numpy_scipy_and_the_contract() -> None:
    for path in sorted(OPE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                ok = name.split(".")[0] in ALLOWED_ROOTS or name.startswith(
                    ("service.contract", "service.ope")
                )
                assert ok, f"{path.name} imports {name}"


def test_modules_stay_small() -> None:
    for path in OPE.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path.name
