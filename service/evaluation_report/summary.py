"""An `OpeReport` as plain data (``results.json``, ``understudy ope --json``) and as table rows.

Every number in the JSON sits next to its ``provenance``; intervals are
``{lower, upper, level, method, n}``; a refusal is ``{"identifiable": false,
"reason": ...}`` with no value. Infinite bounds become None.
"""

from __future__ import annotations

import math
from typing import Any

from service.evaluation_report.ope_run import OpeReport, PolicyReport
from service.ope import Diagnostics, Estimate, Interval, Result

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
        "unusable_pscore": d.unusable_pscore,
        "reward_min": _num(d.reward_min),
        "reward_max": _num(d.reward_max),
    }


def result_json(r: Result, provenance: str) -> dict[str, Any]:
    """An estimate or refusal as JSON."""
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
        }
    return {
        "identifiable": False,
        "estimator": r.estimator.value,
        "reason": r.reason,
        "diagnostics": diagnostics_json(r.diagnostics),
        "provenance": provenance,
    }


def policy_json(p: PolicyReport) -> dict[str, Any]:
    """One policy's report as JSON."""
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
        "estimates": {e.value: result_json(r, tag) for e, r in p.results.items()},
        "vs_production": None
        if p.vs_production is None
        else {**(interval_json(p.vs_production) or {}), "provenance": tag},
        "verdict": p.verdict,
        "slices": {
            dim: {k: result_json(r, tag) for k, r in by_label.items()}
            for dim, by_label in p.slices.items()
        },
    }


def report_json(report: OpeReport) -> dict[str, Any]:
    """The whole report as JSON (``results.json``)."""
    return {
        "format": FORMAT,
        "reward": report.reward.value,
        "level": report.level,
        "rounds": report.rounds,
        "provenance": report.provenance.value,
        "production": {
            "value": _num(report.production_value),
            "interval": interval_json(report.production),
            "basis": "observed on-policy",
            "provenance": report.provenance.value,
        },
        "policies": [policy_json(p) for p in report.policies],
    }


def result_rows(report: OpeReport) -> list[list[str]]:
    """One table row per policy and estimator (a refusal prints its reason, no number)."""
    rows = [
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
        ]
    ]
    for p in report.policies:
        if not p.results:
            rows.append([p.label, "—", "—", "—", "0", "—", "—", p.provenance.value, p.verdict])
        for est, r in p.results.items():
            verdict = p.verdict if est is p.primary else ""
            d = r.diagnostics
            if isinstance(r, Estimate):
                value, interval, n = fmt(r.value), interval_text(r.interval), str(r.n)
            else:
                value, interval, n = "not identifiable", "—", str(d.n)
            rows.append(
                [
                    p.label,
                    est.value,
                    value,
                    interval,
                    n,
                    fmt(d.ess, 3),
                    fmt(d.max_weight, 3),
                    p.provenance.value,
                    verdict,
                ]
            )
    return rows
