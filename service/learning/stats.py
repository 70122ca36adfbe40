"""Intervals over seeds, and the JSON form that keeps results byte-stable.

A seed is one independent replication of everything random in a comparison
(the episodes' jobs, speeds and production's draws), so the spread across
seeds is the honest error of a figure: the 95% interval is Student's t,

    mean ± t_{0.975, K-1} · sd / sqrt(K)

over the ``K`` per-seed values (paired differences are formed within a seed
before this step). With one seed no interval exists and ``lo``/``hi`` are
null rather than a made-up width.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

DIGITS = 6
"""Figures are rounded to this many decimals in JSON, so reruns compare byte for byte."""


@dataclass(frozen=True, slots=True)
class Interval:
    """A mean over seeds with its 95% t-interval (None when it cannot be formed)."""

    mean: float
    lo: float | None
    hi: float | None
    n: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, rounded."""
        return {
            "mean": rounded(self.mean),
            "lo": rounded(self.lo),
            "hi": rounded(self.hi),
            "n": self.n,
        }

    @property
    def sign(self) -> int:
        """+1 if the interval lies above 0, -1 if below, 0 if it straddles 0 or is missing."""
        if self.lo is not None and self.lo > 0:
            return 1
        if self.hi is not None and self.hi < 0:
            return -1
        return 0


def over_seeds(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean and Student-t interval of per-seed `values` (NaNs dropped)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if len(x) == 0:
        return Interval(math.nan, None, None, 0)
    mean = float(x.mean())
    if len(x) < 2:
        return Interval(mean, None, None, len(x))
    half = float(sps.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return Interval(mean, mean - half, mean + half, len(x))


def rounded(value: float | None) -> float | None:
    """`value` rounded to `DIGITS`; None for None and non-finite values (JSON has no NaN)."""
    if value is None or not math.isfinite(value):
        return None
    out = round(float(value), DIGITS)
    return 0.0 if out == 0 else out  # no "-0.0"


def dumps(document: Any) -> str:
    """Canonical JSON: sorted keys, fixed indentation, trailing newline."""
    return json.dumps(document, sort_keys=True, indent=1, allow_nan=False) + "\n"
