"""PNG figures of an `OpeReport`: estimates with intervals, per slice, weight distributions.

matplotlib's Agg canvas is attached to each figure (no pyplot, no global
backend), through ``service.reports.canvas``. A policy that is not identifiable
is drawn as an empty row labelled "not identifiable", never as a number. An
estimate marked by ``marks`` (outside the reward's range, too thin) is drawn
grey and hollow with its interval clipped to the range, and its row label
says why; the reward's finite bounds are drawn as dotted lines.
"""

from __future__ import annotations

import math

import numpy as np

from service.ope import Result
from service.reports.canvas import figure, file_name, png
from service.reports.ope.marks import MarkKind, RewardRange, mark_result, range_of
from service.reports.ope.ope_run import SLICE_TITLES, OpeReport, PolicyReport

MARK_LABEL = {MarkKind.OUTSIDE_RANGE: "out of range", MarkKind.TOO_THIN: "thin"}
"""Short row-label suffixes; a clipped bound alone is visible in the plot itself."""


def _forest(
    title: str,
    rows: list[tuple[str, Result | None]],
    reference: float | None,
    reward: RewardRange,
) -> bytes:
    """One row per label: point and interval, or a "not identifiable" note; marked
    estimates grey and hollow, their label suffixed with the marks."""
    fig = figure(9.0, 0.36 * len(rows) + 1.4)
    ax = fig.subplots()
    labels = []
    for y, (label, r) in enumerate(rows):
        m = mark_result(r, reward)
        if m is None or not math.isfinite(m.value):
            note = "no rounds" if r is None else "not identifiable"
            ax.text(0.01, y, note, transform=ax.get_yaxis_transform(), va="center", color="red")
            labels.append(label)
            continue
        colour = "tab:blue" if m.plain else "grey"
        if math.isfinite(m.lower) and math.isfinite(m.upper):
            ax.hlines(y, m.lower, m.upper, color=colour, linewidth=1.5)
            ax.plot([m.lower, m.upper], [y, y], "|", color=colour, markersize=8)
        face = colour if m.plain else "white"
        ax.plot([m.value], [y], "o", color=colour, markerfacecolor=face)
        why = [MARK_LABEL[k] for k in (MarkKind.OUTSIDE_RANGE, MarkKind.TOO_THIN) if k in m.kinds]
        labels.append(f"{label} ({', '.join(why)})" if why else label)
    for bound in (reward.lower, reward.upper):
        if math.isfinite(bound):
            ax.axvline(bound, color="grey", linestyle=":", linewidth=1)
    if reference is not None and math.isfinite(reference):
        ax.axvline(reference, color="black", linestyle="--", linewidth=1, label="production")
        ax.legend(fontsize=9, loc="best")
    ax.set_yticks(range(len(rows)), labels, fontsize=10)
    for tick, (_, r) in zip(ax.get_yticklabels(), rows, strict=True):
        m = mark_result(r, reward)
        if m is not None and not m.plain:
            tick.set_color("grey")
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=12)
    ax.tick_params(axis="x", labelsize=10)
    return png(fig)


def estimates_png(report: OpeReport) -> bytes:
    """Every policy's primary estimate and interval, production's observed value as a line."""
    rows = [(p.label, p.primary_result) for p in report.policies]
    title = f"{report.reward.value}: estimates, {report.level:.0%} intervals ({report.provenance})"
    reward = range_of(report.reward)
    return _forest(title, rows or [("(no policies)", None)], report.production_value, reward)


def slices_png(report: OpeReport, policy: PolicyReport) -> bytes:
    """One policy's primary estimate per slice, every dimension (``dimension: label`` rows)."""
    rows: list[tuple[str, Result | None]] = [
        (f"{SLICE_TITLES.get(dim, dim).split(' of ')[0]}: {label}", result)
        for dim, by_label in policy.slices.items()
        for label, result in sorted(by_label.items())
    ]
    title = f"{policy.label} by slice ({policy.primary.value}, {report.provenance})"
    reward = range_of(report.reward)
    return _forest(title, rows or [("(no rounds)", None)], report.production_value, reward)


def weights_png(report: OpeReport) -> bytes:
    """Importance-weight distributions (log10 of the positive weights) and zero-weight shares."""
    fig = figure(7.0, 3.8)
    ax = fig.subplots()
    drawn = False
    for p in report.policies:
        w = p.weights
        if not len(w):
            continue
        positive = w[w > 0]
        zero = 1.0 - len(positive) / len(w)
        if len(positive):
            ax.hist(
                np.log10(positive),
                bins=30,
                histtype="step",
                label=f"{p.label} (w=0: {zero:.0%}, max {w.max():.3g})",
            )
            drawn = True
    if not drawn:
        ax.text(0.5, 0.5, "no positive weights", ha="center", transform=ax.transAxes)
    else:
        ax.legend(fontsize=6, loc="best")
    ax.set_xlabel("log10 importance weight  pi(a|x) / production propensity")
    ax.set_ylabel("rounds")
    ax.set_title(f"Importance-weight distribution ({report.provenance})", fontsize=10)
    return png(fig)


def all_figures(report: OpeReport) -> dict[str, bytes]:
    """File name -> PNG bytes for every figure of the package."""
    figures = {
        "estimates.png": estimates_png(report),
        "weights.png": weights_png(report),
    }
    for p in report.policies:
        if p.slices:
            figures["slices-" + file_name(p.label)] = slices_png(report, p)
    return figures
