"""The evidence package on an in-memory log: files, figures, tables, limitations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.ope import Estimate
from service.reports.ope import build_ope_package, run_ope
from service.reports.ope.figures import estimates_png
from service.reports.ope.ope_run import (
    HARDWARE_CLASS,
    SliceLabels,
    model_families,
    time_windows,
)
from service.reports.ope.sections import ReportSection
from tests.reports.package_check import check_package, check_sections
from tests.reports.synthetic import bandit_log


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


def _section(key: str = "extra", figure: str = "extra-figure.png") -> ReportSection:
    png = estimates_png(run_ope(bandit_log(50, seed=7)))
    return ReportSection(
        key=key,
        title="An extra section",
        markdown=f"Some text.\n\n![{figure}](figures/{figure})\n",
        html=f'<p>Some text.</p><img alt="x" src="figures/{figure}"/>',
        figures={figure: png},
        results={"value": 0.5, "provenance": "simulated"},
        limitations=("it has a limit.",),
    )


def test_a_section_is_laid_out_with_its_figure_numbers_and_limitations(tmp_path: Path) -> None:
    report = run_ope(bandit_log(300, seed=6))
    package = build_ope_package(report, source="in-memory log", sections=[_section()])
    package.write(tmp_path)
    results = check_package(tmp_path, sections=["An extra section"])
    check_sections(results, ["extra"])
    assert results["sections"]["extra"] == {
        "title": "An extra section",
        "value": 0.5,
        "provenance": "simulated",
    }
    assert "extra-figure.png" in results["figures"]
    assert "An extra section: it has a limit." in results["limitations"]
    assert "## An extra section" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ([_section("a", "one.png"), _section("a", "two.png")], "section keys must be unique"),
        ([_section("a", "one.png"), _section("b", "one.png")], "figure names used twice"),
        ([_section("a", "estimates.png")], "figure names used twice"),
    ],
)
def test_clashing_sections_are_refused(sections: list[ReportSection], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_ope_package(run_ope(bandit_log(100, seed=8)), source="x", sections=sections)


def test_the_package_slices_by_every_dimension_it_is_given() -> None:
    log = bandit_log(400, seed=9)
    hardware = np.where(np.arange(log.n) % 3 == 0, "K80", "V100").astype(np.str_)
    report = run_ope(
        log, slices=SliceLabels(per_policy={("best", "1"): {HARDWARE_CLASS: hardware}})
    )
    by = {p.policy[0]: p for p in report.policies}
    assert set(by["best"].slices[HARDWARE_CLASS]) == {"K80", "V100"}
    assert HARDWARE_CLASS not in by["mixed"].slices
    best = by["best"].slices[HARDWARE_CLASS]["K80"]
    assert isinstance(best, Estimate) and best.interval.contains(0.9)
    package = build_ope_package(report, source="x", created_at=0.0)
    assert "Estimates per hardware class of the chosen option" in package.markdown


def test_time_windows_cut_the_span_into_equal_parts() -> None:
    labels = time_windows(np.array([0.0, 10.0, 24.9, 25.0, 99.0, 100.0]))
    assert [str(x).split(":")[0] for x in labels] == ["1", "1", "1", "2", "4", "4"]
    assert len(set(labels)) == 3


def test_model_families_drop_the_batch_size() -> None:
    got = model_families(np.array(["ResNet-18 (batch size 128)", "A3C", "LM (batch size 5)"]))
    assert got.tolist() == ["ResNet-18", "A3C", "LM"]
