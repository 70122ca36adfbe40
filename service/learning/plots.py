"""Sweep figure: one panel per shift family, value difference vs production with 95% bars.

Uses matplotlib's Agg backend (files only, no display), selected on the
figure object rather than globally, so importing this module changes no
process-wide state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from service.learning.shifts import AXIS_LABELS


def sweep_figure(doc: dict[str, Any], path: Path) -> None:
    """Write ``sweep.png``: per family, a curve with interval bars per candidate."""
    families = list(doc["families"])
    fig = Figure(figsize=(5.0 * len(families), 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(families), squeeze=False)[0]
    for ax, family in zip(axes, families, strict=True):
        points = doc["families"][family]
        names = [k for k in points[0] if k not in ("size", "production")]
        for i, name in enumerate(names):
            xs, ys, lo, hi = [], [], [], []
            for p in points:
                d = p[name]["vs_production"]
                if d["mean"] is None:
                    continue
                xs.append(p["size"])
                ys.append(d["mean"])
                lo.append(d["mean"] - d["lo"] if d["lo"] is not None else 0.0)
                hi.append(d["hi"] - d["mean"] if d["hi"] is not None else 0.0)
            shift = (i - (len(names) - 1) / 2) * 0.01 * (max(xs) - min(xs) or 1.0)
            ax.errorbar(
                [x + shift for x in xs], ys, yerr=[lo, hi], marker="o", capsize=3, label=name
            )
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xlabel(AXIS_LABELS.get(family, family))
        ax.set_ylabel("on-policy value - production (SLO met per job)")
        ax.set_title(family)
    axes[0].legend(loc="best", fontsize="small")
    seeds = doc["spec"]["seeds"]
    fig.suptitle(f"95% t-intervals over {len(seeds)} seeds x {doc['spec']['episodes']} episodes")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
