"""The `ope` results on a terminal: every column when they fit, the verdict's columns otherwise.

The full table (policy × estimator, nine columns) needs about 130 columns; in
an 80-column terminal rich would cut nearly every cell to ``throu…``. So:

* when the full table fits the console, print it (as before);
* otherwise print one row per policy with the primary estimator only —
  value, interval, the paired difference to production, ESS, and a flag —
  which fits in 80 columns; every column goes to ``--json`` / ``--csv``.

Cells never end in an ellipsis: a cell too long for its column wraps (fold).
The flag column shows what `Flagger` returns per estimate (the lead wires
``service.evaluation_report.marks`` in); it is left out while every flag is empty.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from service.evaluation_report.ope_run import OpeReport
from service.evaluation_report.summary import RESULT_HEAD, result_rows
from service.ope import Estimate, Interval, Result

Flagger = Callable[[Result], str]
"""A short marker for one estimate (e.g. "ESS<10", "out of range"), or "" for none."""

_PRODUCTION = "production (observed)"


def full_rows(report: OpeReport, flag: Flagger | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the full table: one row per policy and estimator, plus a flag."""
    head = [*RESULT_HEAD, "flag"]
    flags = [""]  # production's observed mean carries no estimate to mark
    for p in report.policies:
        if not p.results:
            flags.append("")
        flags.extend(flag(r) if flag else "" for r in p.results.values())
    return head, [[*row, f] for row, f in zip(result_rows(report), flags, strict=True)]


def write_csv(path: Path, report: OpeReport, flag: Flagger | None = None) -> None:
    """The full table as CSV at `path` (parent folders created)."""
    head, rows = full_rows(report, flag)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(head)
        writer.writerows(rows)


def print_results(console: Console, report: OpeReport, flag: Flagger | None = None) -> None:
    """The results table as wide as `console` allows, then one verdict line per policy."""
    head, rows = full_rows(report, flag)
    if not any(r[-1] for r in rows):
        head, rows = head[:-1], [r[:-1] for r in rows]
    if _natural_width(head, rows) <= console.width:
        table = _table(f"OPE on {report.rounds} joined rounds, reward {report.reward.value}")
        for name in head:
            table.add_column(name, overflow="fold")
        for row in rows:
            table.add_row(*row)
    else:
        table = _compact(report, flag)
    console.print(table)
    for p in report.policies:
        console.print(f"[bold]{p.label}[/]: {p.verdict}")


def _natural_width(head: list[str], rows: list[list[str]]) -> int:
    """Columns the full table needs with rich's heavy-head box: cells, padding and rules."""
    widths = [max(len(c) for c in column) for column in zip(head, *rows, strict=True)]
    return sum(widths) + 3 * len(widths) + 1


def _table(title: str) -> Table:
    return Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)


def _compact(report: OpeReport, flag: Flagger | None) -> Table:
    """One row per policy: the primary estimate and its difference to production."""
    primary = report.policies[0].primary.value if report.policies else "—"
    table = _table(
        f"OPE ({primary}, {report.level:.0%} intervals), reward {report.reward.value}, "
        f"{report.rounds} joined rounds, {report.provenance.value} traffic"
    )
    table.caption = "every estimator and diagnostic: --json / --csv"
    flags = {p.label: flag(p.results[p.primary]) if flag and p.primary in p.results else ""
             for p in report.policies}  # fmt: skip
    with_flags = any(flags.values())
    for name in ("policy", "value", "interval", "vs production", "ESS"):
        table.add_column(name, overflow="fold", justify="left" if name == "policy" else "right")
    if with_flags:
        table.add_column("flag", overflow="fold")
    production = ["production", _num(report.production_value), _interval(report.production)]
    table.add_row(*production, "", "", *([""] if with_flags else []))
    names = [p.policy[0] for p in report.policies]
    for p in report.policies:
        shown = p.policy[0] if names.count(p.policy[0]) == 1 else p.label
        result = p.results.get(p.primary)
        if isinstance(result, Estimate):
            value, interval = _num(result.value), _interval(result.interval)
        else:
            value, interval = ("not identifiable" if result else "—"), "—"
        ess = "—" if result is None else _num(result.diagnostics.ess, _ess_decimals(result))
        cells = [shown, value, interval, _interval(p.vs_production, signed=True), ess]
        table.add_row(*cells, *([flags[p.label]] if with_flags else []))
    return table


def _num(x: float | None, decimals: int = 3, *, signed: bool = False) -> str:
    """`x` with fixed decimals (aligned in a column), or a dash for None/NaN."""
    if x is None or math.isnan(x):
        return "—"
    return f"{x:+.{decimals}f}" if signed else f"{x:.{decimals}f}"


def _ess_decimals(result: Result) -> int:
    """Whole numbers for ESS >= 10 (a tenth means nothing there), one decimal below."""
    ess = result.diagnostics.ess
    return 0 if math.isnan(ess) or ess >= 10 else 1


def _interval(i: Interval | None, *, signed: bool = False) -> str:
    """``[lower, upper]`` to three decimals (signed for differences), or a dash."""
    if i is None:
        return "—"
    return f"[{_num(i.lower, signed=signed)}, {_num(i.upper, signed=signed)}]"
