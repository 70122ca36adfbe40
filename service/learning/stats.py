"""Intervals over seeds, and the JSON form that keeps results byte-stable.

A seed is one independent replication of everything random in a comparison
(the episodes' jobs, speeds and production's draws), so the spread across
seeds is the honest error of a figure: the 95% interval is Student's t,

    mean ± t_{0.975, K-1} · sd / sqrt(K)

over the ``K`` per-seed values (paired differences are formed within a seed
before this step). With one seed no interval exists: the interval is
unbounded and ``lo``/``hi`` are null in JSON rather than a made-up width.

The interval is the project's one `service.ope.Interval` (method
``student-t``); the mean travels beside it, as an estimate's value does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats as sps

from service.ope.results import Interval, IntervalMethod

DIGITS = 6
"""Figures are rounded to this many decimals in JSON, so reruns compare byte for byte."""


LEVEL = 0.95
"""Nominal level of every seed interval (the JSON form does not carry it)."""


def over_seeds(values: Sequence[float], level: float = LEVEL) -> tuple[float, Interval]:
    """Mean and Student-t interval of per-seed `values` (NaNs dropped).

    The interval is unbounded when fewer than two seeds remain; the mean is NaN
    when none does.
    """
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if len(x) == 0:
        return math.nan, Interval.unbounded(level, IntervalMethod.STUDENT_T, 0)
    mean = float(x.mean())
    if len(x) < 2:
        return mean, Interval.unbounded(level, IntervalMethod.STUDENT_T, len(x))
    half = float(sps.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, Interval(mean - half, mean + half, level, IntervalMethod.STUDENT_T, len(x))


def interval_dict(mean: float, interval: Interval) -> dict[str, Any]:
    """JSON-ready, rounded: ``{mean, lo, hi, n}``; an unbounded end is null."""
    return {
        "mean": rounded(mean),
        "lo": rounded(interval.lower),
        "hi": rounded(interval.upper),
        "n": interval.n,
    }


def interval_from_dict(document: dict[str, Any]) -> Interval:
    """The seed interval back from `interval_dict`'s form (a null end is unbounded)."""
    lo, hi = document["lo"], document["hi"]
    return Interval(
        -math.inf if lo is None else float(lo),
        math.inf if hi is None else float(hi),
        LEVEL,
        IntervalMethod.STUDENT_T,
        int(document["n"]),
    )


def rounded(value: float | None) -> float | None:
    """`value` rounded to `DIGITS`; None for None and non-finite values (JSON has no NaN)."""
    if value is None or not math.isfinite(value):
        return None
    out = round(float(value), DIGITS)
    return 0.0 if out == 0 else out  # no "-0.0"


def dumps(document: Any) -> str:
    """Canonical JSON: sorted keys, fixed indentation, trailing newline."""
    return json.dumps(document, sort_keys=True, indent=1, allow_nan=False) + "\n"
