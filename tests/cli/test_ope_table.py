"""`understudy ope` at 80 columns: no cell cut to an ellipsis; the full table goes to --csv.

The log is made the way `make demo` makes it (a short run: two episodes over
about two seconds, its embedded server stopped afterwards), then read the way
a newcomer reads it: ``UNDERSTUDY_DATA_DIR=<dir> understudy ope`` in an
80-column terminal, and again in a wide one.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli.main import app
from service.cli.ope_table import FLAGS
from service.reports.ope.marks import MarkKind
from tests.demo_log import short_demo_log

pytestmark = pytest.mark.slow  # the demo run takes ~20 s on 2 cores


@pytest.fixture(scope="module")
def demo_dir() -> Iterator[Path]:
    """The data directory a short `make demo` leaves (server stopped, as the demo leaves it)."""
    with short_demo_log() as root:
        yield root


def _ope(root: Path, columns: int, *extra: str) -> str:
    env = {"UNDERSTUDY_DATA_DIR": str(root), "UNDERSTUDY_DATABASE_URL": "", "COLUMNS": str(columns)}
    out = CliRunner().invoke(app, ["ope", "--traffic", "simulated", *extra], env=env)
    assert out.exit_code == 0, out.output
    return out.output


def test_at_80_columns_every_policy_has_a_whole_row_and_the_csv_has_every_estimate(
    demo_dir: Path, tmp_path: Path
) -> None:
    out = _ope(demo_dir, 80, "--json", str(tmp_path / "ope.json"), "--csv", str(tmp_path / "t.csv"))
    assert "…" not in out, out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    report = json.loads((tmp_path / "ope.json").read_text())
    assert report["policies"], report
    lines = [line.strip() for line in out.splitlines()]
    for p in report["policies"]:
        row = [line for line in lines if line.split(" ")[0] == p["policy"]]
        assert len(row) == 1, (p["policy"], out)
        assert "[" in row[0] and "]" in row[0], row  # its interval, whole on one line
        marks = {m["kind"] for m in p["estimates"][p["primary"]].get("marks", [])}
        flags = {FLAGS[MarkKind(kind)] for kind in marks}
        assert flags <= set(row[0].split()[-1].split(",")), (marks, row)  # marked, and said
    with (tmp_path / "t.csv").open() as f:
        head, *rows = list(csv.reader(f))
    assert head[:4] == ["policy", "estimator", "value", "interval"] and "marks" in head
    policies = report["policies"]
    expected = {(f"{p['policy']}@{p['version']}", e) for p in policies for e in p["estimates"]}
    assert {(r[0], r[1]) for r in rows if r[0] != "production (observed)"} == expected


def test_a_wide_terminal_gets_every_estimator(demo_dir: Path) -> None:
    out = _ope(demo_dir, 250)
    assert "…" not in out, out
    rows = [line.split() for line in out.splitlines()]
    # table rows start with `name@version` (verdict lines with `name@version:`)
    estimators = {r[1] for r in rows if len(r) > 2 and "@" in r[0] and not r[0].endswith(":")}
    assert {"ips", "snips", "dr"} <= estimators, out
