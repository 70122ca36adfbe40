"""`python -m benchmarks --quick` runs and writes results of the agreed shape.

No figure is asserted (speed belongs to the benchmarks, not the tests): only
that a quick run of two cheap benchmarks finishes, writes one JSON document
each with every row's figure, raw limit, ratio and runs, and a summary table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a real quick run: ~20-30 s on the 2-core machine

ROOT = Path(__file__).resolve().parents[2]
SPREAD_KEYS = {"median", "min", "max", "runs"}


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "UNDERSTUDY_BENCH_OUT": str(out)}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "scoring", "ope", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.mark.parametrize("name", ["scoring", "ope"])
def test_each_row_has_figure_raw_limit_ratio_and_runs(quick_results: Path, name: str) -> None:
    doc = json.loads((quick_results / f"{name}.json").read_text())
    assert doc["benchmark"] == name
    assert doc["quick"] is True
    assert {"cpu_model", "cores", "python", "libraries"} <= set(doc["machine"])
    assert doc["rows"], "a benchmark must report at least one row"
    for row in doc["rows"]:
        for key in ("figure", "raw_limit", "ratio"):
            assert set(row[key]) >= SPREAD_KEYS, (key, row[key])
            assert len(row[key]["runs"]) == row["runs"] >= 1
        assert row["raw_name"]
        pairs = zip(row["figure"]["runs"], row["raw_limit"]["runs"], strict=True)
        assert row["ratio"]["runs"] == pytest.approx([o / r for o, r in pairs])


def test_scoring_rows_carry_the_issue_target(quick_results: Path) -> None:
    doc = json.loads((quick_results / "scoring.json").read_text())
    for row in doc["rows"]:
        target = row["target"]
        assert target["threshold"] == 0.80
        assert target["pass"] == (row["ratio"]["median"] >= 0.80)
        assert target["margin_pct"] == pytest.approx((row["ratio"]["median"] / 0.80 - 1) * 100)


def test_summary_table_lists_every_row(quick_results: Path) -> None:
    summary = (quick_results / "summary.md").read_text()
    for name in ("scoring", "ope"):
        for row in json.loads((quick_results / f"{name}.json").read_text())["rows"]:
            assert row["metric"] in summary
