"""The evidence package on an in-memory log: files, figures, tables, limitations."""

from __future__ import annotations

from pathlib import Path

from service.evaluation_report import build_ope_package, run_ope
from tests.evaluation.package_check import check_package
from tests.evaluation.synthetic import bandit_log


def test_a_package_has_every_figure_it_shows_and_no_empty_table(tmp_path: Path) -> None:
    report = run_ope(bandit_log(400, seed=4))
    package = build_ope_package(report, source="in-memory log", created_at=0.0)
    package.write(tmp_path / "pkg")
    results = check_package(tmp_path / "pkg")
    assert {"estimates.png", "weights.png", "slices-best_1.png"} <= set(results["figures"])


def test_a_package_of_a_refused_log_still_renders(tmp_path: Path) -> None:
    report = run_ope(bandit_log(100, seed=5, deterministic_production=True))
    build_ope_package(report, source="in-memory log", created_at=0.0).write(tmp_path)
    results = check_package(tmp_path)
    assert any("not identifiable" in str(x) for x in results["limitations"])
