"""The `ope` results on a terminal: every column when they fit, the verdict's columns otherwise.

The full table (policy × estimator, ten columns) needs about 200 columns; in
an 80-column terminal rich would cut nearly every cell to ``throu…``. So:

* when the full table fits the console, print it;
* otherwise print one row per policy with the primary estimator only —
  value, interval, the paired difference to production, ESS and a short
  flag — which fits in 80 columns; every column goes to ``--json`` / ``--csv``.

Cells never end in an ellipsis: a cell too long for its column wraps (fold).
Marked estimates (``service.reports.ope.marks``: outside the reward's
range, bound clipped, too thin an ESS) print as the package prints them — the
value in parentheses, the interval clipped — with a one-word flag here and the
full note in the full table's ``marks`` column.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from service.ope import Estimate, Interval, IntervalMethod
from service.reports.ope.marks import Marked, MarkKind, mark_result, range_of
from service.reports.ope.ope_run import OpeReport, PolicyReport
from service.reports.ope.summary import RESULT_HEAD, difference_mark, result_table, text

FLAGS = {
    MarkKind.TOO_THIN: "T",
    MarkKind.OUTSIDE_RANGE: "R",
    MarkKind.BOUND_CLIPPED: "C",
}
"""The compact table's one-letter flag per mark kind (the legend is printed under it):
letters, because three words side by side push the row past 80 columns."""

HEAVY_TAIL = "H"
"""The flag of a variance-based interval on a heavy weight tail (`_normal_on_heavy_tail`)."""

_LEGEND = {
    "T": "ESS too small to mean much",
    "R": "value outside the reward's range",
    "C": "interval clipped to the range",
    HEAVY_TAIL: "heavy weight tail (k-hat >= 0.5): the value's interval is not 95%",
}


def full_rows(report: OpeReport) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the full table: one row per policy and estimator, with marks."""
    return [*RESULT_HEAD, "marks"], [[text(c) for c in row] for row in result_table(report)]


def write_csv(path: Path, report: OpeReport) -> None:
    """The full table as CSV at `path` (parent folders created)."""
    head, rows = full_rows(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(head)
        writer.writerows(rows)


def print_results(console: Console, report: OpeReport) -> None:
    """The results table as wide as `console` allows, then one verdict line per policy."""
    head, rows = full_rows(report)
    if not any(r[-1] for r in rows):
        head, rows = head[:-1], [r[:-1] for r in rows]
    if _natural_width(head, rows) <= console.width:
        table = _table(f"OPE on {report.rounds} joined rounds, reward {report.reward.value}")
        for name in head:
            table.add_column(name, overflow="fold", max_width=_TEXT_WIDTH.get(name))
        for row in rows:
            table.add_row(*row)
    else:
        table = compact_table(report)
    console.print(table)
    for p in report.policies:
        console.print(f"[bold]{p.label}[/]: {p.verdict}")


_VARIANCE_BASED = frozenset({IntervalMethod.NORMAL, IntervalMethod.BOOTSTRAP})
"""Intervals whose coverage rests on a finite weight variance (`Diagnostics.heavy_tail`)."""

_TEXT_WIDTH = {"verdict": 40, "marks": 40}
"""Sentence columns of the full table wrap at this width; numbers never wrap."""


def _natural_width(head: list[str], rows: list[list[str]]) -> int:
    """Columns the full table needs: its widest cells (sentences wrapped) plus padding."""
    widths = [
        min(max(len(c) for c in column), _TEXT_WIDTH.get(name, 10**6))
        for name, *column in zip(head, *rows, strict=True)
    ]
    return sum(widths) + 2 * len(widths)


def _table(title: str) -> Table:
    """No outer frame, no column rules: two spaces between columns (one pad, one divider)."""
    return Table(
        title=title,
        box=box.SIMPLE_HEAD,
        title_justify="left",
        show_edge=False,
        padding=(0, 1, 0, 0),
        caption_justify="left",
    )


def compact_table(report: OpeReport) -> Table:
    """One row per policy: the primary estimate, its difference to production, ESS, flag."""
    primary = report.policies[0].primary.value if report.policies else "—"
    table = _table(
        f"OPE ({primary}, {report.level:.0%} intervals), reward {report.reward.value}, "
        f"{report.rounds} joined rounds, {report.provenance.value} traffic"
    )
    reward = range_of(report.reward)
    rows = [_compact_row(p, report) for p in report.policies]
    flagged = [w for w in _LEGEND if any(w in row[-1].split(",") for row in rows)]
    for name in ("policy", "value", "interval", "vs production", "ESS"):
        table.add_column(name, overflow="fold", justify="left" if name == "policy" else "right")
    if flagged:
        table.add_column("flag", overflow="fold")
    production = ["production", _num(report.production_value), _interval(report.production)]
    table.add_row(*production, "", "", *([""] if flagged else []))
    for row in rows:
        table.add_row(*(row if flagged else row[:-1]))
    legend = "\n".join(f"{w}: {_LEGEND[w]}" for w in flagged)
    table.caption = (legend + "\n" if legend else "") + (
        f"reward range {reward.text()}; every estimator and diagnostic: --json / --csv"
    )
    return table


def _compact_row(p: PolicyReport, report: OpeReport) -> list[str]:
    """policy, value, interval, vs production, ESS, flags (comma-joined letters).

    ``vs production`` is the interval the verdict rests on (`PolicyReport.vs_production`,
    a betting interval for bounded rewards); ``tail`` flags a primary estimate whose
    normal interval sits on a heavy weight tail (`Diagnostics.heavy_tail`).
    """
    reward = range_of(report.reward)
    names = [q.policy[0] for q in report.policies]
    shown = p.policy[0] if names.count(p.policy[0]) == 1 else p.label
    result = p.primary_result
    m = mark_result(result, reward)
    diff = difference_mark(p, reward)
    if m is None or not isinstance(result, Estimate):
        value, interval = ("not identifiable" if result is not None else "—"), "—"
    else:
        value, interval = _marked_value(m), _marked_interval(m)
    vs = "—" if diff is None else _marked_interval(diff, signed=True)
    ess = "—" if result is None else _ess(result.diagnostics.ess)
    kinds = (m.kinds if m else frozenset()) | (diff.kinds if diff else frozenset())
    words = [FLAGS[k] for k in FLAGS if k in kinds]
    if _normal_on_heavy_tail(result):
        words.append(HEAVY_TAIL)
    return [shown, value, interval, vs, ess, ",".join(words)]


def _normal_on_heavy_tail(result: object) -> bool:
    """A variance-based interval over weights whose tail has infinite variance (k-hat >= 0.5)."""
    if not isinstance(result, Estimate) or result.interval is None:
        return False
    return result.diagnostics.heavy_tail and result.interval.method in _VARIANCE_BASED


def _marked_value(m: Marked) -> str:
    """The value with three decimals; in parentheses when marked (as the package shows it)."""
    return _num(m.value) if m.plain else f"({_num(m.value)})"


def _marked_interval(m: Marked, *, signed: bool = False) -> str:
    """The interval as shown (clipped to the range), or a note when none of it is possible."""
    if math.isnan(m.lower):
        return "outside the range"
    return f"[{_num(m.lower, signed=signed)}, {_num(m.upper, signed=signed)}]"


def _ess(ess: float) -> str:
    """Whole numbers for ESS >= 10 (a tenth means nothing there), one decimal below."""
    return _num(ess, 0 if math.isnan(ess) or ess >= 10 else 1)


def _num(x: float | None, decimals: int = 3, *, signed: bool = False) -> str:
    """`x` with fixed decimals (aligned in a column), or a dash for None/NaN."""
    if x is None or math.isnan(x):
        return "—"
    return f"{x:+.{decimals}f}" if signed else f"{x:.{decimals}f}"


def _interval(i: Interval | None) -> str:
    """``[lower, upper]`` to three decimals, or a dash."""
    if i is None:
        return "—"
    return f"[{_num(i.lower)}, {_num(i.upper)}]"
