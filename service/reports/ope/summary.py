"""An `OpeReport` as plain data (``results.json``, ``understudy ope --json``) and as table rows.

Every number in the JSON sits next to its ``provenance``; intervals are
``{lower, upper, level, method, n}``; a refusal is ``{"identifiable": false,
"reason": ...}`` with no value. Infinite bounds become None. An estimate outside
the reward's range or too thin to mean anything (``marks``) carries ``marks``
(kind and text) and ``shown_interval`` (clipped to the range); tables show its
value in parentheses and its interval clipped (``marks`` module docstring).
"""

from __future__ import annotations

import math
from typing import Any

from service.ope import Diagnostics, Estimate, Interval, IntervalMethod, Result
from service.reports.ope.marks import (
    UNKNOWN_RANGE,
    Marked,
    RewardRange,
    mark_interval,
    mark_result,
    range_of,
)
from service.reports.ope.ope_run import OpeReport, PolicyReport
from service.reports.protocol.tables import Cell, TableCell

FORMAT = "understudy-ope/v1"

RESULT_HEAD = [
    "policy",
    "estimator",
    "value",
    "interval",
    "n",
    "ESS",
    "max weight",
    "provenance",
    "verdict",
]


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def fmt(x: float | None, digits: int = 4) -> str:
    """A number for a table; an em dash for None or NaN."""
    return "—" if x is None or math.isnan(x) else f"{x:.{digits}g}"


def interval_text(i: Interval | None) -> str:
    """``[lower, upper]`` or an em dash."""
    return "—" if i is None else f"[{fmt(i.lower)}, {fmt(i.upper)}]"


def interval_json(i: Interval | None) -> dict[str, Any] | None:
    """An interval as JSON."""
    if i is None:
        return None
    return {
        "lower": _num(i.lower),
        "upper": _num(i.upper),
        "level": i.level,
        "method": i.method.value,
        "n": i.n,
    }


def diagnostics_json(d: Diagnostics) -> dict[str, Any]:
    """Every diagnostic as JSON numbers."""
    return {
        "n": d.n,
        "ess": _num(d.ess),
        "ess_share": _num(d.ess_share),
        "mean_weight": _num(d.mean_weight),
        "max_weight": _num(d.max_weight),
        "tail_weight_share": _num(d.tail_weight_share),
        "zero_target_share": _num(d.zero_target_share),
        "unsupported_share": _num(d.unsupported_share),
        "unsupported_rounds": d.unsupported_rounds,
        "deterministic_share": _num(d.deterministic_share),
        "support_known": d.support_known,
        "support_rounds": d.support_rounds,
        "expected_mean_weight": _num(d.expected_mean_weight),
        "unusable_pscore": d.unusable_pscore,
        "reward_min": _num(d.reward_min),
        "reward_max": _num(d.reward_max),
        "khat": _num(d.khat),
        "khat_limit": _num(d.khat_limit),
        "heavy_tail": d.heavy_tail,
        "unreliable_tail": d.unreliable_tail,
        "weight_mean_z": _num(d.weight_mean_z),
        "top_share": _num(d.top_share),
        "expected_w2": _num(d.expected_w2),
        "max_possible_weight": _num(d.max_possible_weight),
    }


def marks_json(m: Marked | None) -> dict[str, Any]:
    """``marks`` and ``shown_interval`` of a marked estimate; nothing when plain."""
    if m is None or m.plain:
        return {}
    return {
        "marks": [{"kind": k.kind.value, "text": k.text} for k in m.marks],
        "shown_interval": {"lower": _num(m.lower), "upper": _num(m.upper)},
    }


def result_json(r: Result, provenance: str, reward: RewardRange = UNKNOWN_RANGE) -> dict[str, Any]:
    """An estimate or refusal as JSON; `reward` is the range its marks are judged by."""
    if isinstance(r, Estimate):
        return {
            "identifiable": True,
            "estimator": r.estimator.value,
            "basis": r.basis.value,
            "value": _num(r.value),
            "interval": interval_json(r.interval),
            "n": r.n,
            "caveats": list(r.caveats),
            "diagnostics": diagnostics_json(r.diagnostics),
            "provenance": provenance,
            **marks_json(mark_result(r, reward)),
        }
    return {
        "identifiable": False,
        "estimator": r.estimator.value,
        "reason": r.reason,
        "diagnostics": diagnostics_json(r.diagnostics),
        "provenance": provenance,
    }


def difference_mark(p: PolicyReport, reward: RewardRange) -> Marked | None:
    """The marks of the verdict's interval of (policy − production): bounds beyond the
    difference's range (``RewardRange.difference``) clipped; too thin by the primary's
    ESS when the interval is a normal one."""
    primary = p.primary_result
    if p.vs_production is None or not isinstance(primary, Estimate):
        return None
    # The interval is the verdict's (normal or betting, not always centred on a value):
    # its bounds are clipped to the difference's range; a point is not judged.
    # Thinness is judged only for a normal interval: a betting interval's coverage is
    # finite-sample (``service.ope.sequences``), whatever the ESS.
    span = reward.difference()
    inside = min(max((p.vs_production.lower + p.vs_production.upper) / 2, span.lower), span.upper)
    normal = p.vs_production.method is IntervalMethod.NORMAL
    ess = primary.diagnostics.ess if normal else math.nan
    return mark_interval(inside, p.vs_production, ess=ess, reward=span)


def policy_json(p: PolicyReport, reward: RewardRange = UNKNOWN_RANGE) -> dict[str, Any]:
    """One policy's report as JSON; `reward` is the range its marks are judged by."""
    tag = p.provenance.value
    return {
        "policy": p.policy[0],
        "version": p.policy[1],
        "n": p.n,
        "dropped": {
            "no_reward": p.dropped.no_reward,
            "no_production_decision": p.dropped.no_production,
            "no_usable_target": p.dropped.no_target,
        },
        "infeasible_favourite_share": _num(p.infeasible_favourites),
        "timeout_share": _num(p.timeout_share),
        "primary": p.primary.value,
        "estimates": {e.value: result_json(r, tag, reward) for e, r in p.results.items()},
        "vs_production": None
        if p.vs_production is None
        else {
            **(interval_json(p.vs_production) or {}),
            "provenance": tag,
            **marks_json(difference_mark(p, reward)),
        },
        "verdict": p.verdict,
        "slices": {
            dim: {k: result_json(r, tag, reward) for k, r in by_label.items()}
            for dim, by_label in p.slices.items()
        },
    }


def report_json(report: OpeReport) -> dict[str, Any]:
    """The whole report as JSON (``results.json``)."""
    reward = range_of(report.reward)
    return {
        "format": FORMAT,
        "reward": report.reward.value,
        "reward_range": {"lower": _num(reward.lower), "upper": _num(reward.upper)},
        "level": report.level,
        "rounds": report.rounds,
        "provenance": report.provenance.value,
        "production": {
            "value": _num(report.production_value),
            "interval": interval_json(report.production),
            "basis": "observed on-policy",
            "provenance": report.provenance.value,
        },
        "policies": [policy_json(p, reward) for p in report.policies],
    }


def estimate_cells(r: Result | None, reward: RewardRange) -> tuple[TableCell, TableCell, str]:
    """Value cell, interval cell and marks text of one result, as every table shows it:
    a plain number, a greyed `Cell` (value in parentheses, interval clipped) with its
    marks, or "not identifiable" with no number."""
    m = mark_result(r, reward)
    if m is None:
        return ("—" if r is None else "not identifiable"), "—", ""
    if m.plain:
        return m.value_text(), m.interval_text(), ""
    return Cell(m.value_text(), m.note), Cell(m.interval_text(), m.note), m.note


def text(cell: TableCell) -> str:
    """A cell's text (a terminal has no grey)."""
    return cell.text if isinstance(cell, Cell) else cell


def result_table(report: OpeReport) -> list[list[TableCell]]:
    """One row per policy and estimator, columns `RESULT_HEAD` plus ``marks``
    (a refusal prints "not identifiable", no number)."""
    reward = range_of(report.reward)
    rows: list[list[TableCell]] = [
        [
            "production (observed)",
            "on-policy mean",
            fmt(report.production_value),
            interval_text(report.production),
            str(report.production.n if report.production else 0),
            "—",
            "—",
            report.provenance.value,
            "",
            "",
        ]
    ]
    for p in report.policies:
        if not p.results:
            rows.append([p.label, "—", "—", "—", "0", "—", "—", p.provenance.value, p.verdict, ""])
        for est, r in p.results.items():
            d = r.diagnostics
            value, interval, note = estimate_cells(r, reward)
            rows.append(
                [
                    p.label,
                    est.value,
                    value,
                    interval,
                    str(r.n if isinstance(r, Estimate) else d.n),
                    fmt(d.ess, 3),
                    fmt(d.max_weight, 3),
                    p.provenance.value,
                    p.verdict if est is p.primary else "",
                    note,
                ]
            )
    return rows


def result_rows(report: OpeReport) -> list[list[str]]:
    """`result_table` as text, without the marks column (the terminal table): a marked
    value is in parentheses and its interval clipped to the reward's range."""
    return [[text(c) for c in row[:-1]] for row in result_table(report)]
