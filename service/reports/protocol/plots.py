"""Each criterion's trajectory as a PNG: estimate, interval, the judged bound and the threshold.

Uses matplotlib's Agg backend selected on the figure object (not globally),
so importing this module changes no process-wide state and works without a
display, on any thread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from service.protocols.criteria import Evaluation
from service.reports.canvas import figure, png


def _num(x: float | None) -> float:
    return x if x is not None and math.isfinite(x) else math.nan


def trajectory_png(
    name: str, points: Sequence[tuple[float, Evaluation]], transition_at: float | None
) -> bytes:
    """One criterion over time (hours since its first evaluation).

    Args:
        name: the criterion.
        points: ``(Unix seconds, evaluation)`` oldest first.
        transition_at: when the verdict was recorded (a vertical line), if any.
    """
    t0 = points[0][0]
    hours = [(t - t0) / 3600 for t, _ in points]
    evs = [e for _, e in points]
    last = evs[-1]
    fig = figure(6.4, 3.6)
    ax = fig.subplots()
    ax.fill_between(
        hours,
        [_num(e.lower) for e in evs],
        [_num(e.upper) for e in evs],
        alpha=0.2,
        label="confidence sequence",
        step="post",
    )
    ax.plot(hours, [_num(e.value) for e in evs], marker=".", label="estimate")
    ax.plot(hours, [_num(e.bound) for e in evs], linestyle=":", label="judged bound")
    ax.axhline(last.threshold, color="black", linestyle="--", linewidth=1, label="threshold")
    if transition_at is not None:
        ax.axvline((transition_at - t0) / 3600, color="red", linewidth=1, label="verdict")
    ax.set_xlabel("hours since the first evaluation")
    ax.set_ylabel(last.metric)
    ax.set_title(f"{name} ({last.role.value}): {last.status.value} at n={last.n}", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    return png(fig)
