"""`understudy ope` and `understudy evidence` on a log made the way `make demo` makes it.

`service.cli.demo.run_demo` (a short run: two episodes over about two seconds)
starts the whole service on an embedded PostgreSQL in a data directory,
mirrors the simulated Runtime's traffic, reports outcomes and stops; the
commands then open that data directory the way an operator would
(``UNDERSTUDY_DATA_DIR``). The package must parse as HTML with every image
present and every table non-empty, and carry the failure-mode section, the
slices by hardware class, model family and time window, and provenance tags.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from service.cli.evaluation import evaluation_app, read_log
from service.storage.reads.ope import OpeFilter
from tests.demo_log import short_demo_log
from tests.reports.package_check import check_package, check_sections

pytestmark = pytest.mark.slow  # the demo run and the two commands take ~40 s on 2 cores

INTERVAL = re.compile(r"\[(-?\d+(?:\.\d+)?(?:e-?\d+)?), (-?\d+(?:\.\d+)?(?:e-?\d+)?)\]")


@pytest.fixture(scope="module")
def demo_dir() -> Iterator[Path]:
    """The data directory a short `make demo` leaves (server stopped, as the demo leaves it)."""
    with short_demo_log() as root:
        yield root


def _env(root: Path) -> dict[str, str]:
    return {"UNDERSTUDY_DATA_DIR": str(root), "UNDERSTUDY_DATABASE_URL": "", "COLUMNS": "250"}


def test_ope_prints_a_numeric_interval_for_a_candidate(demo_dir: Path, tmp_path: Path) -> None:
    out = CliRunner().invoke(
        evaluation_app,
        ["ope", "--traffic", "simulated", "--json", str(tmp_path / "ope.json")],
        env=_env(demo_dir),
    )
    assert out.exit_code == 0, out.output
    data = json.loads((tmp_path / "ope.json").read_text())
    assert data["rounds"] > 0
    rows = [
        line
        for line in out.output.splitlines()
        if INTERVAL.search(line) and "production" not in line
    ]
    assert rows, out.output
    lower, upper = (float(x) for x in INTERVAL.search(rows[0]).groups())  # type: ignore[union-attr]
    assert lower < upper


def test_evidence_writes_a_complete_package_with_failure_modes_and_slices(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "evidence"
    out = CliRunner().invoke(
        evaluation_app,
        ["evidence", "--out", str(folder), "--traffic", "simulated"],
        env=_env(demo_dir),
    )
    assert out.exit_code == 0, out.output
    results = check_package(folder, sections=["Failure modes", "Estimates per time window"])
    check_sections(results, ["failure_modes"])
    check_sections(results, list(results["sections"]))  # calibration, drift: tagged too
    assert results["provenance"] == "simulated"
    failure = results["sections"]["failure_modes"]
    assert failure["predictor"].startswith("learned-outcome@")
    assert failure["disagreements"] and failure["uncertain_failures"]
    assert {"failure-losing-slices.png", "failure-uncertainty.png"} <= set(results["figures"])
    dims = {dim for p in results["policies"] for dim in p["slices"]}
    assert dims == {"workload_kind", "model_family", "time_window", "hardware_class"}
    classes = {
        label for p in results["policies"] for label in p["slices"].get("hardware_class", {})
    }
    assert classes & {"K80", "V100"}, classes
    assert "online_bounded" not in results["sections"]
    assert any("no online-bounded evidence" in f for f in results["limitations"])
    _assert_header_spans_the_log(demo_dir, results, monkeypatch)


def _assert_header_spans_the_log(
    root: Path, results: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The package's time range is the log's own first and last `received_at`."""
    for name, value in _env(root).items():
        monkeypatch.setenv(name, value)
    log = read_log(OpeFilter())
    assert len(log.received_at) > 0
    span = results["time_range"]
    assert span is not None, "the CLI built the package without the data's time range"
    assert span["first"] == pytest.approx(float(log.received_at.min()))
    assert span["last"] == pytest.approx(float(log.received_at.max()))
