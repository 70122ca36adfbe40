"""The "Outcome drift" section: placed jobs' throughput against each policy's training episodes.

For every policy whose ``training_summary.json`` has an outcome block
(`service.policies.outcome_summary`; policies trained on simulated episodes),
the joined outcomes in the filter are read with their stored requests
(`service.storage.reads.outcome_drift`), and the outcome check
(`service.checks.outcome_drift`) is applied to the whole period and to windows
of consecutive outcomes over time: per hardware class, the median of
``ln(throughput)`` minus the training median of the job's cell. This is what
input drift cannot see — hardware running slower or faster than when the
policy was trained. Source: outcomes Runtime reported for production's own
placements (no off-policy weight enters them).
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine

from service.checks.outcome_drift import OutcomeRows, OutcomeWindow, check_window, outcome_rows
from service.policies.outcome_summary import OutcomeSummary
from service.reports.canvas import figure, file_name, png
from service.reports.ope.drift_section import training_summaries
from service.reports.ope.sections import ReportSection
from service.reports.protocol.package import html_table, md_table
from service.storage.reads.ope import OpeFilter
from service.storage.reads.outcome_drift import read_placed_outcomes

MIN_WINDOWS = 8
"""Windows over time: the largest calibrated size giving at least this many."""
HEAD = [
    "policy",
    "outcomes",
    "with a reference",
    "hardware class",
    "shift (log)",
    "speed vs training",
    "flagged windows",
]


def _windows(s: OutcomeSummary, rows: OutcomeRows) -> tuple[int, list[OutcomeWindow]]:
    sizes = sorted(r.window_outcomes for r in s.rules)
    fitting = [n for n in sizes if len(rows) // n >= MIN_WINDOWS]
    size = fitting[-1] if fitting else sizes[0]
    starts = range(0, len(rows) - size + 1, size)
    return size, [
        check_window(s.reference, s.rules, rows.take(np.arange(a, a + size))) for a in starts
    ]


def _plot(name: str, size: int, windows: list[OutcomeWindow], s: OutcomeSummary) -> bytes:
    fig = figure(7.0, 3.6)
    ax = fig.subplots()
    x = np.arange(1, len(windows) + 1)
    classes = s.reference.hardware_classes
    for k, hardware in enumerate(classes):
        ax.plot(x, [w.shift(hardware) for w in windows], marker="o", label=hardware, color=f"C{k}")
    flagged = [i + 1 for i, w in enumerate(windows) if w.flagged]
    for i in flagged:
        ax.axvspan(i - 0.4, i + 0.4, color="red", alpha=0.12, lw=0)
    ax.axhline(0.0, color="black", lw=1)
    ax.axhline(math.log(0.5), color="grey", lw=1, ls=":", label="half speed")
    if not windows:
        ax.text(0.5, 0.5, "fewer outcomes than one window", ha="center", transform=ax.transAxes)
    ax.set_xlabel(f"window of {size} outcomes (time order; red: flagged)")
    ax.set_ylabel("median ln(throughput)\nminus training")
    ax.set_title(f"{name}: outcome drift per hardware class (reported outcomes)", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    return png(fig)


def build_outcome_drift_section(
    engine: Engine, where: OpeFilter, policies_dir: Path
) -> ReportSection | None:
    """The section, or None when no policy in the filter has an outcome reference."""
    loaded, refused = training_summaries(policies_dir, where.policies, "Outcome drift")
    summaries = {n: s.outcome for n, s in loaded.items() if s.outcome is not None}
    if not summaries:
        return None
    requests, outcomes = read_placed_outcomes(engine, where=where)
    rows = outcome_rows(requests, outcomes)
    table: list[list[str]] = []
    figures: dict[str, bytes] = {}
    results: dict[str, Any] = {"outcomes": len(rows), "policies": []}
    limitations = list(refused)
    for name, s in summaries.items():
        period = check_window(s.reference, s.rules, rows)
        size, windows = _windows(s, rows)
        n_flag = sum(w.flagged for w in windows)
        fig = "outcome-drift-" + file_name(name)
        figures[fig] = _plot(name, size, windows, s)
        for hardware, m, n in zip(period.classes, period.medians, period.counts, strict=True):
            speed = f"{math.exp(m):.0%}" if math.isfinite(m) else "n/a (too few)"
            table.append(
                [
                    name,
                    str(period.n_outcomes),
                    str(period.n_residuals),
                    f"{hardware} ({n})",
                    f"{m:+.3f}" if math.isfinite(m) else "-",
                    speed,
                    f"{n_flag} / {len(windows)}",
                ]
            )
        results["policies"].append(
            {
                "policy": name,
                "outcomes": period.n_outcomes,
                "residuals": period.n_residuals,
                "period": {
                    h: (float(m) if math.isfinite(m) else None)
                    for h, m in zip(period.classes, period.medians, strict=True)
                },
                "period_flagged": period.flagged,
                "window_outcomes": size,
                "windows": [
                    {
                        "flagged": w.flagged,
                        "statistic": w.statistic if math.isfinite(w.statistic) else None,
                    }
                    for w in windows
                ],
                "figure": f"figures/{fig}",
            }
        )
        if n_flag or period.flagged:
            moved = [
                f"{h} at {math.exp(m):.0%} of training speed"
                for h, m in zip(period.classes, period.medians, strict=True)
                if math.isfinite(m) and abs(m) > 0.05
            ]
            limitations.append(
                f"Placed jobs ran at another speed than in `{name}`'s training episodes"
                f" ({', '.join(moved) or 'per-window shifts'}; {n_flag} of {len(windows)}"
                f" windows of {size} outcomes flagged): its model's view of that hardware is"
                " stale, and its estimates there rest on outdated speeds."
            )
    intro = (
        "Outcomes Runtime reported for production's placements, against the outcomes of each"
        " policy's training episodes: per hardware class, the median of ln(throughput) minus"
        " the training median of the job's cell (model family x hardware class x accelerators),"
        " over the whole period and per window of consecutive outcomes, with the calibrated"
        " flag rule (false-flag rate 1% under training conditions; docs/drift.md, Outcome"
        " drift). A shift of -0.69 is half speed. Source: reported outcomes (not off-policy)."
    )
    md = [intro, "", *md_table(HEAD, table)]
    md += [""] + [
        f"![outcome drift of {n}](figures/outcome-drift-{file_name(n)})" for n in summaries
    ]
    body = [f"<p>{html.escape(intro)}</p>", html_table(HEAD, table)]
    body += [
        f'<img src="figures/outcome-drift-{html.escape(file_name(n))}"'
        f' alt="outcome drift of {html.escape(n)}">'
        for n in summaries
    ]
    return ReportSection(
        key="outcome_drift",
        title="Outcome drift against training episodes",
        markdown="\n".join(md) + "\n",
        html="\n".join(body),
        figures=figures,
        results=results,
        limitations=tuple(limitations),
    )
