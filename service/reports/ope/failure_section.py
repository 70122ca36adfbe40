"""The failure-mode section of the evidence package, from the decision log.

Four tables per candidate (``service.ope.failure_modes`` ranks them):

1. **Largest disagreements with production**, weighted by predicted impact:
   ``log q50(candidate's option) - log q50(production's option)`` from the
   outcome predictor (`service.reports.ope.decoded.PREDICTOR`).
2. **High-uncertainty choices that went badly**: predicted 80% interval width
   (``log q90 - log q10``) times the shortfall of the observed throughput below
   the predicted median (``max(0, log q50 - log observed)``). Outcomes are
   observed only for production's option, so a candidate is judged on the
   rounds where it chose the same option; production itself on all its
   rounds. Each ranking also says which hardware classes are over-represented
   among its top cases against their base rate.
3. **Infeasible raw favourites** per workload kind (the policy's unmasked
   favourite failed feasibility; masked before acting).
4. **Slices where the candidate loses**: the paired per-round difference
   behind the verdict (primary estimator's contribution minus production's
   observed reward) averaged per slice, normal interval; listed when the
   interval is below zero.

Every row carries the report's provenance tag.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.ope.failure_modes import (
    LabelRate,
    Ranked,
    SliceDifference,
    disagreements,
    label_rates,
    losing_slices,
    share_by_label,
    shortfall,
    uncertain_failures,
)
from service.reports.canvas import figure, png
from service.reports.ope.decoded import DecodedLog
from service.reports.ope.ope_run import (
    HARDWARE_CLASS,
    SLICE_TITLES,
    OpeReport,
    PolicyReport,
    log_slices,
)
from service.reports.ope.sections import ReportSection
from service.reports.ope.summary import fmt, interval_json, interval_text
from service.reports.protocol.package import html_table, md_table
from service.storage.reads.ope import OpeLog

KEY = "failure_modes"
TITLE = "Failure modes"
TOP_K = 5
"""Rows per policy in each ranked table."""
LOSING_FIGURE_ROWS = 15
MIN_SLICE_ROUNDS = 30
"""Slices with fewer rounds are not tested: a normal interval needs the CLT to hold."""
PRODUCTION = "production (observed)"

DISAGREE_HEAD = [
    "policy", "request", "workload", "candidate's option", "production's option",
    "predicted impact", "observed (production's option)", "provenance",
]  # fmt: skip
UNCERTAIN_HEAD = [
    "policy", "request", "workload", "option", "interval width", "predicted median",
    "observed", "shortfall", "SLO met", "score", "provenance",
]  # fmt: skip
RATE_HEAD = ["policy", "hardware class", "share of top cases", "base rate", "lift", "provenance"]
FAVOURITE_HEAD = ["policy", "workload kind", "infeasible raw favourites", "share", "provenance"]
LOSING_HEAD = ["policy", "slice", "label", "policy − production", "interval", "n", "provenance"]


@dataclass(frozen=True, eq=False)
class _Table:
    title: str
    head: list[str]
    rows: list[list[str]]
    note: str


def _log_ratio(x: float) -> str:
    """A log ratio as a readable factor, e.g. ``x1.85`` or ``x0.52``."""
    return "—" if not math.isfinite(x) else f"×{math.exp(x):.2f}"


def _workload(log: OpeLog, i: int) -> str:
    return f"{log.workload_kind[i]} / {log.model_family[i]}"


def _observed(log: OpeLog, i: int) -> str:
    slo = log.slo_met[i]
    met = "—" if math.isnan(slo) else ("SLO met" if slo else "SLO missed")
    return f"{fmt(log.throughput[i])}/s, {met}"


def _policy_chosen(p: PolicyReport, decoded: DecodedLog) -> NDArray[np.int64]:
    return decoded.chosen.get(p.policy, np.zeros(0, np.int64))


def _disagreements(
    log: OpeLog, report: OpeReport, decoded: DecodedLog, k: int
) -> tuple[list[list[str]], list[dict[str, Any]]]:
    tag = report.provenance.value
    production = log.production_option
    q_prod = decoded.quantiles_of(production)
    rows, data = [], []
    for p in report.policies:
        chosen = _policy_chosen(p, decoded)
        if not len(chosen):
            continue
        q_cand = decoded.quantiles_of(chosen)
        impact = np.log(q_cand[:, 1]) - np.log(q_prod[:, 1])
        ranked = disagreements(chosen, production, impact, k)
        cand_hw, prod_hw = decoded.hardware(chosen), decoded.hardware(production)
        for i in ranked.index:
            rows.append(
                [
                    p.label,
                    str(log.request_id[i]),
                    _workload(log, i),
                    f"{chosen[i]} ({cand_hw[i]})",
                    f"{production[i]} ({prod_hw[i]})",
                    f"{_log_ratio(impact[i])} predicted throughput",
                    _observed(log, i),
                    tag,
                ]
            )
            data.append(
                {
                    "policy": p.label,
                    "request_id": str(log.request_id[i]),
                    "candidate_option": int(chosen[i]),
                    "candidate_hardware": str(cand_hw[i]),
                    "production_option": int(production[i]),
                    "production_hardware": str(prod_hw[i]),
                    "predicted_log_impact": float(impact[i]),
                    "provenance": tag,
                }
            )
    return rows, data


def _uncertain(
    log: OpeLog, report: OpeReport, decoded: DecodedLog, k: int
) -> tuple[list[list[str]], list[list[str]], list[dict[str, Any]]]:
    """Ranked rows, hardware over-representation rows, and their JSON."""
    tag = report.provenance.value
    production = log.production_option
    choosers: list[tuple[str, NDArray[np.bool_]]] = [(PRODUCTION, production >= 0)]
    for p in report.policies:
        chosen = _policy_chosen(p, decoded)
        if len(chosen):
            choosers.append((p.label, (chosen == production) & (production >= 0)))
    q = decoded.quantiles_of(production)
    width = np.log(q[:, 2]) - np.log(q[:, 0])
    bad = shortfall(q[:, 1], log.throughput)
    hardware = decoded.hardware(production)
    rows: list[list[str]] = []
    rate_rows: list[list[str]] = []
    data: list[dict[str, Any]] = []
    for label, judged in choosers:
        rounds = np.flatnonzero(judged)
        if not len(rounds):
            continue
        ranked = uncertain_failures(width[rounds], bad[rounds], k)
        for j, score in zip(ranked.index, ranked.score, strict=True):
            i = int(rounds[j])
            rows.append(
                [
                    label,
                    str(log.request_id[i]),
                    _workload(log, i),
                    f"{production[i]} ({hardware[i]})",
                    f"{_log_ratio(width[i])} (q90/q10)",
                    f"{fmt(q[i, 1])}/s",
                    _observed(log, i),
                    f"{_log_ratio(bad[i])} below",
                    fmt(log.slo_met[i], 1),
                    fmt(float(score), 3),
                    tag,
                ]
            )
        rates = _over_represented(hardware[rounds], ranked)
        rate_rows += [
            [
                label,
                str(r.label),
                f"{r.top_share:.0%} ({r.top_count}/{len(ranked.index)})",
                f"{r.base_share:.0%} ({r.base_count}/{len(rounds)})",
                fmt(r.lift, 3),
                tag,
            ]
            for r in rates
        ]
        data.append(
            {
                "chooser": label,
                "rounds_judged": len(rounds),
                "rounds_short_of_median": ranked.eligible,
                "top": [
                    {
                        "request_id": str(log.request_id[int(rounds[j])]),
                        "hardware": str(hardware[int(rounds[j])]),
                        "log_width": float(width[int(rounds[j])]),
                        "log_shortfall": float(bad[int(rounds[j])]),
                        "score": float(s),
                    }
                    for j, s in zip(ranked.index, ranked.score, strict=True)
                ],
                "hardware_rates": [
                    {
                        "hardware": str(r.label),
                        "top_share": r.top_share,
                        "base_share": r.base_share,
                    }
                    for r in rates
                ],
                "provenance": tag,
            }
        )
    return rows, rate_rows, data


def _over_represented(labels: NDArray[np.str_], ranked: Ranked) -> list[LabelRate]:
    if not len(ranked.index):
        return []
    return [r for r in label_rates(labels, ranked) if r.top_count and r.lift > 1]


def _favourites(log: OpeLog, report: OpeReport) -> tuple[list[list[str]], list[dict[str, Any]]]:
    tag = report.provenance.value
    rows, data = [], []
    for p in report.policies:
        logged = log.policies.get(p.policy)
        if logged is None:
            continue
        scored = np.array([s != "" for s in logged.status], dtype=bool)
        shares = share_by_label(logged.raw_favourite_infeasible[scored], log.workload_kind[scored])
        for s in shares:
            if s.count:
                rows.append([p.label, str(s.label), f"{s.count}/{s.n}", f"{s.share:.1%}", tag])
                data.append(
                    {"policy": p.label, "workload_kind": str(s.label), "count": s.count,
                     "n": s.n, "share": s.share, "provenance": tag}
                )  # fmt: skip
    return rows, data


def _losing(
    log: OpeLog, report: OpeReport, decoded: DecodedLog
) -> tuple[list[tuple[str, SliceDifference]], int]:
    """Every slice difference of every policy (label ``policy | dim | slice``) and the count."""
    common = log_slices(log)
    found: list[tuple[str, str, SliceDifference]] = []
    for p in report.policies:
        if not len(p.difference):
            continue
        labels: dict[str, NDArray[np.str_]] = dict(common)
        chosen = _policy_chosen(p, decoded)
        if len(chosen):
            labels[HARDWARE_CLASS] = decoded.hardware(chosen)
        for dim, values in labels.items():
            in_slice = values[p.rows]
            for s in losing_slices(
                p.difference, in_slice, level=report.level, min_n=MIN_SLICE_ROUNDS
            ):
                found.append((p.label, dim, s))
    # A slice with every difference equal (e.g. rounds with no feasible option, where
    # everyone defers) has a zero-width interval: nothing to learn, left out.
    out = [
        (f"{who} | {SLICE_TITLES.get(dim, dim)} | {s.label}", s)
        for who, dim, s in found
        if s.interval.width > 0
    ]
    return sorted(out, key=lambda x: x[1].interval.upper), len(out)


def _losing_png(slices: list[tuple[str, SliceDifference]], report: OpeReport) -> bytes:
    shown = slices[:LOSING_FIGURE_ROWS]
    fig = figure(8.0, 0.4 * len(shown) + 1.6)
    ax = fig.subplots()
    for y, (_, s) in enumerate(shown):
        lo, hi = s.interval.lower, s.interval.upper
        colour = "tab:red" if s.loses else "tab:blue"
        if math.isfinite(lo + hi):
            ax.errorbar([s.mean], [y], xerr=[[s.mean - lo], [hi - s.mean]], fmt="o",
                        capsize=3, color=colour)  # fmt: skip
        else:
            ax.plot([s.mean], [y], "o", color=colour)
    ax.axvline(0.0, color="black", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(shown)), [label for label, _ in shown], fontsize=6)
    ax.set_ylim(-0.7, len(shown) - 0.3)
    ax.invert_yaxis()
    ax.set_xlabel(f"policy − production, {report.reward.value} (paired, per slice)")
    ax.set_title(
        f"Slices with the lowest upper bound ({report.level:.0%}, {report.provenance})", fontsize=9
    )
    return png(fig)


def _uncertainty_png(log: OpeLog, decoded: DecodedLog, report: OpeReport) -> bytes:
    production = log.production_option
    q = decoded.quantiles_of(production)
    width = np.log(q[:, 2]) - np.log(q[:, 0])
    bad = shortfall(q[:, 1], log.throughput)
    hardware = decoded.hardware(production)
    fig = figure(7.0, 4.0)
    ax = fig.subplots()
    ok = np.isfinite(width) & np.isfinite(bad)
    for name in np.unique(hardware[ok]):
        rows = ok & (hardware == name)
        ax.scatter(width[rows], bad[rows], s=8, alpha=0.6, label=f"{name} ({rows.sum()})")
    if ok.any():
        ax.legend(fontsize=7, loc="best")
    else:
        ax.text(0.5, 0.5, "no predicted and observed rounds", ha="center", transform=ax.transAxes)
    ax.set_xlabel("predicted log(q90 / q10) of production's option")
    ax.set_ylabel("log shortfall below predicted median")
    ax.set_title(
        f"Uncertainty vs shortfall, production's choices ({decoded.predictor}, "
        f"{report.provenance})",
        fontsize=9,
    )
    return png(fig)


def _tables(
    log: OpeLog, report: OpeReport, decoded: DecodedLog, k: int
) -> tuple[list[_Table], dict[str, Any], list[tuple[str, SliceDifference]], int]:
    tables: list[_Table] = []
    results: dict[str, Any] = {"predictor": decoded.predictor, "top_k": k}
    if decoded.predictor is not None:
        rows, results["disagreements"] = _disagreements(log, report, decoded, k)
        tables.append(
            _Table(
                "Largest disagreements with production, by predicted impact",
                DISAGREE_HEAD,
                rows,
                f"Top {k} per policy by |log predicted median throughput of the candidate's "
                f"option − of production's| ({decoded.predictor}).",
            )
        )
        rows, rate_rows, results["uncertain_failures"] = _uncertain(log, report, decoded, k)
        tables.append(
            _Table(
                "High-uncertainty choices that went badly",
                UNCERTAIN_HEAD,
                rows,
                f"Top {k} per chooser by (predicted q90/q10 width in log) × (log shortfall of "
                "the observed throughput below the predicted median). A candidate is judged "
                "on the rounds where it chose production's option (the only outcome observed).",
            )
        )
        tables.append(
            _Table(
                "Hardware classes over-represented among those cases",
                RATE_HEAD,
                rate_rows,
                "Share of the top cases on each class against its share of the chooser's "
                "judged rounds (lift > 1 listed).",
            )
        )
    rows, results["infeasible_favourites"] = _favourites(log, report)
    tables.append(
        _Table(
            "Infeasible raw favourites by workload kind",
            FAVOURITE_HEAD,
            rows,
            "Decisions whose unmasked favourite failed feasibility (masked before acting).",
        )
    )
    slices, tested = _losing(log, report, decoded)
    losing = [(label, s) for label, s in slices if s.loses]
    tables.append(
        _Table(
            "Slices where the candidate loses",
            LOSING_HEAD,
            [
                [
                    *label.split(" | "),
                    fmt(s.mean),
                    interval_text(s.interval),
                    str(s.n),
                    report.provenance.value,
                ]
                for label, s in losing
            ],
            f"{len(losing)} of {tested} (policy, slice) pairs with at least "
            f"{MIN_SLICE_ROUNDS} rounds have a {report.level:.0%} interval of the paired "
            "difference entirely below zero.",
        )
    )
    results["losing_slices"] = [
        {
            "slice": label,
            "mean": s.mean,
            "interval": interval_json(s.interval),
            "n": s.n,
            "loses": s.loses,
            "provenance": report.provenance.value,
        }
        for label, s in slices
    ]
    results["slices_tested"] = tested
    return tables, results, slices, tested


def build_failure_section(
    log: OpeLog, report: OpeReport, decoded: DecodedLog, *, k: int = TOP_K
) -> ReportSection:
    """The failure-mode `ReportSection` of `report` on `log` (module docstring)."""
    tables, results, slices, tested = _tables(log, report, decoded, k)
    figures: dict[str, bytes] = {}
    if slices:
        figures["failure-losing-slices.png"] = _losing_png(slices, report)
    if decoded.predictor is not None:
        figures["failure-uncertainty.png"] = _uncertainty_png(log, decoded, report)
    md: list[str] = []
    parts: list[str] = []
    for table in tables:
        md += [f"### {table.title}", "", table.note, ""]
        parts.append(f"<h3>{html.escape(table.title)}</h3><p>{html.escape(table.note)}</p>")
        if table.rows:
            md += [*md_table(table.head, table.rows), ""]
            parts.append(html_table(table.head, table.rows))
        else:
            md += ["(none)", ""]
            parts.append("<p>(none)</p>")
    for name in sorted(figures):
        md.append(f"![{name}](figures/{name})")
        parts.append(
            f'<figure><img alt="{html.escape(name)}" src="figures/{html.escape(name)}"/>'
            f"<figcaption>{html.escape(name)}</figcaption></figure>"
        )
    return ReportSection(
        key=KEY,
        title=TITLE,
        markdown="\n".join(md) + "\n",
        html="".join(parts),
        figures=figures,
        results=results,
        limitations=_limitations(decoded, report, tested, results),
    )


def _limitations(
    decoded: DecodedLog, report: OpeReport, tested: int, results: Mapping[str, Any]
) -> tuple[str, ...]:
    out = []
    if decoded.predictor is None:
        out.append(
            "no outcome predictor loaded: disagreement impact and high-uncertainty failures "
            "are not computed."
        )
    else:
        out.append(
            f"predicted impact and uncertainty come from {decoded.predictor}; where its "
            "intervals are mis-calibrated (see the calibration section), the rankings are too."
        )
        out.append(
            "a candidate's outcome is observed only where it chose production's option, so "
            "its high-uncertainty failures are ranked on those rounds alone."
        )
    if tested:
        out.append(
            f"{tested} (policy, slice) differences are each tested at {report.level:.0%} "
            f"without multiplicity adjustment: about {(1 - report.level) * tested:.1f} would "
            "show a loss or a win by chance alone."
        )
    judged = {u["chooser"] for u in results.get("uncertain_failures", [])}
    missing = [p.label for p in report.policies if p.label not in judged]
    if decoded.predictor is not None and missing:
        out.append(
            f"{', '.join(missing)} never chose production's option on a judged round (or "
            "logged no choice): not ranked for high-uncertainty failures."
        )
    return tuple(out)
