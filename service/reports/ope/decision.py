"""The decision summary: what the evidence page opens with.

A reviewer decides per policy; the page therefore opens with one row per
policy (its verdict, the primary estimate, the paired difference to
production on the verdict's interval, ESS and the marks of ``marks``), then
the estimates plot, then
the limitations that bind each verdict. The full tables follow it.

"Binds a verdict" means: the findings the limitations module
(``limitations.limitations``, whose rules are not this module's) reports for
that policy, plus the marks on the estimate the verdict rests on. The
findings that hold for every policy (where the numbers come from) are stated
once above the table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime

import numpy as np
from numpy.typing import NDArray

from service.reports.ope.limitations import limitations
from service.reports.ope.marks import mark_result, range_of
from service.reports.ope.ope_run import OpeReport, PolicyReport
from service.reports.ope.summary import (
    difference_mark,
    estimate_cells,
    fmt,
    interval_text,
)
from service.reports.protocol.tables import Cell, TableCell

TITLE = "Decision summary"


def head(report: OpeReport) -> list[str]:
    """The summary's columns; the primary estimator (one per report) names the estimate's."""
    primary = report.policies[0].primary.value if report.policies else "primary"
    return [
        "policy",
        "verdict",
        "verdict rests on",
        f"{primary} value",
        f"{primary} interval",
        "policy − production",
        "n",
        "ESS",
        "marks",
    ]


@dataclass(frozen=True, slots=True)
class TimeRange:
    """When the data was received: the oldest and newest request of the rounds read
    (Unix seconds, Understudy's ``received_at`` clock)."""

    first: float
    last: float

    def text(self) -> str:
        """``2026-12-03 07:20:01 UTC to 2026-12-03 09:11:40 UTC (1 h 51 min)``."""

        def at(ts: float) -> str:
            return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

        return f"{at(self.first)} to {at(self.last)} ({_duration(self.last - self.first)})"


def time_range(received_at: NDArray[np.float64]) -> TimeRange | None:
    """The span of `received_at` (e.g. ``OpeLog.received_at``); None when empty."""
    if not len(received_at):
        return None
    return TimeRange(float(np.min(received_at)), float(np.max(received_at)))


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86_400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s / 86_400:.1f} days"


def general_findings(report: OpeReport) -> list[str]:
    """The findings about no single policy (provenance, an empty log)."""
    labels = tuple(f"`{p.label}`" for p in report.policies)
    return [f for f in limitations(report) if not f.startswith(labels)]


def binding(report: OpeReport, policy: PolicyReport) -> list[str]:
    """What limits `policy`'s verdict: the marks on its primary estimate, then the
    limitations' findings about it (each once, without the policy's name)."""
    out = []
    marked = mark_result(policy.primary_result, range_of(report.reward))
    if marked is not None and not marked.plain:
        out.append(f"its {policy.primary.value} estimate is marked: {marked.note}.")
    prefix = f"`{policy.label}`: "
    own = limitations(replace(report, policies=[policy]), online_bounded=False)
    out += [f.removeprefix(prefix) for f in own if f.startswith(prefix)]
    return out


_VERDICTS = ("better than production", "worse than production", "no detectable difference")


def split_verdict(verdict: str) -> tuple[str, str]:
    """``("worse than production", "dr, 95% normal interval")`` from the verdict line
    ``worse than production (dr, 95% normal interval)``: the decision in one column,
    what it rests on in the next; any other line whole, with nothing beside it."""
    head, sep, rest = verdict.partition(" (")
    if not (verdict.startswith(_VERDICTS) and sep and rest.endswith(")")):
        return verdict, ""
    return head, rest[:-1]


def decision_rows(report: OpeReport) -> list[list[TableCell]]:
    """One row per policy (columns: `head`)."""
    reward = range_of(report.reward)
    rows: list[list[TableCell]] = []
    for p in report.policies:
        r = p.primary_result
        value, interval, note = estimate_cells(r, reward)
        diff = difference_mark(p, reward)
        diff_cell: TableCell = interval_text(p.vs_production)
        if diff is not None and not diff.plain:
            diff_cell = Cell(diff.interval_text(), diff.note)
        ess = fmt(r.diagnostics.ess, 3) if r is not None else "—"
        said, basis = split_verdict(p.verdict)
        rows.append([p.label, said, basis, value, interval, diff_cell, str(p.n), ess, note])
    return rows
