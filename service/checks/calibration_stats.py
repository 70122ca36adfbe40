"""Calibration statistics: PIT on the knot CDF, coverage with exact intervals, PIT histogram, Holm.

The measurements the flag rule and the reports in `service.checks.calibration`
are built from; that module's docstring explains each one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from service.contract import InvalidInput
from service.ope.intervals import clopper_pearson
from service.ope.results import Interval

LEVELS: tuple[float, float, float] = (0.5, 0.8, 0.9)
"""Nominal central interval levels reported."""
_TOL = 1e-9


@dataclass(frozen=True, slots=True)
class Coverage:
    """Observed coverage of the central interval at nominal `level`.

    Attributes:
        level: nominal coverage ``c``.
        covered, n: outcomes inside the interval, outcomes.
        observed: ``covered / n`` (NaN when ``n == 0``).
        interval: exact binomial interval of the coverage (None when ``n == 0``).
        p_value: exact two-sided binomial test of coverage = `level` (NaN when ``n == 0``).
        exact: both ends are logged quantiles (else implied by the knot shape).
    """

    level: float
    covered: int
    n: int
    observed: float
    interval: Interval | None
    p_value: float
    exact: bool


@dataclass(frozen=True, eq=False)
class PitHistogram:
    """PIT counts per bin and a chi-square test of uniformity.

    Attributes:
        edges: float64 ``(B + 1,)`` bin edges on [0, 1].
        counts: int64 ``(B,)``.
        statistic, p_value: Pearson chi-square against uniform counts (NaN when empty).
    """

    edges: NDArray[np.float64]
    counts: NDArray[np.int64]
    statistic: float
    p_value: float


def _check(
    taus: Sequence[float], quantiles: NDArray[np.float64], outcome: NDArray[np.float64]
) -> None:
    t = np.asarray(taus, dtype=np.float64)
    if t.ndim != 1 or len(t) < 2 or not np.all((t > 0) & (t < 1)) or np.any(np.diff(t) <= 0):
        raise InvalidInput("taus", f"must be >= 2 increasing levels in (0, 1), got {list(taus)}")
    if quantiles.ndim != 2 or quantiles.shape[1] != len(t):
        raise InvalidInput("quantiles", f"must have shape (n, {len(t)}), got {quantiles.shape}")
    if outcome.shape != (quantiles.shape[0],):
        raise InvalidInput(
            "outcome", f"must have shape ({quantiles.shape[0]},), got {outcome.shape}"
        )
    if not (np.all(np.isfinite(quantiles)) and np.all(np.isfinite(outcome))):
        raise InvalidInput("quantiles", "and `outcome` must be finite")


def pit(
    taus: Sequence[float],
    quantiles: NDArray[np.float64],
    outcome: NDArray[np.float64],
    *,
    log_scale: bool = True,
) -> NDArray[np.float64]:
    """PIT values ``(n,)`` under the knot CDF (module docstring).

    Args:
        taus: logged quantile levels, increasing, ``(L,)``.
        quantiles: ``(n, L)`` predicted quantiles (sorted per row here).
        outcome: ``(n,)`` observed outcomes; positive when `log_scale`.
        log_scale: interpolate in ``log y`` (positive outcomes such as throughput).
    """
    q = np.sort(np.asarray(quantiles, dtype=np.float64), axis=1)
    y = np.asarray(outcome, dtype=np.float64)
    _check(taus, q, y)
    if log_scale:
        if np.any(q <= 0) or np.any(y <= 0):
            raise InvalidInput("outcome", "and `quantiles` must be > 0 on the log scale")
        q, y = np.log(q), np.log(y)
    z = stats.norm.ppf(np.asarray(taus, dtype=np.float64))
    spread = np.maximum(np.abs(q).max(axis=1, keepdims=True), 1.0) * _TOL
    q = q + spread * np.arange(q.shape[1])  # tied quantiles: a point mass made a steep step
    n, k = q.shape
    seg = np.clip(np.sum(q[:, 1:-1] < y[:, None], axis=1), 0, k - 2)  # segment of each row
    rows = np.arange(n)
    x0, x1 = q[rows, seg], q[rows, seg + 1]
    zz = z[seg] + (z[seg + 1] - z[seg]) * (y - x0) / (x1 - x0)
    out: NDArray[np.float64] = stats.norm.cdf(zz)
    return out


def _binomial(k: int, n: int, p: float, confidence: float) -> tuple[Interval, float]:
    """The exact interval of ``k / n`` (the one `clopper_pearson`) and the exact test of `p`."""
    return clopper_pearson(k, n, confidence), float(stats.binomtest(k, n, p).pvalue)


def _logged(taus: Sequence[float], tau: float) -> bool:
    return any(abs(t - tau) < 1e-6 for t in taus)


def coverage(
    u: NDArray[np.float64],
    level: float,
    taus: Sequence[float],
    confidence: float = 0.95,
) -> Coverage:
    """Coverage of the central `level` interval from PIT values `u` (see `pit`)."""
    if not 0 < level < 1:
        raise InvalidInput("level", f"must be in (0, 1), got {level}")
    lo, hi = (1 - level) / 2, (1 + level) / 2
    inside = (u >= lo - _TOL) & (u <= hi + _TOL)
    n, k = len(u), int(inside.sum())
    exact = _logged(taus, lo) and _logged(taus, hi)
    if n == 0:
        return Coverage(level, 0, 0, float("nan"), None, float("nan"), exact)
    interval, p = _binomial(k, n, level, confidence)
    return Coverage(level, k, n, k / n, interval, p, exact)


def pit_histogram(u: NDArray[np.float64], bins: int = 10) -> PitHistogram:
    """Equal-width PIT histogram and Pearson's chi-square test against uniform (``B - 1`` df)."""
    if bins < 2:
        raise InvalidInput("bins", f"must be >= 2, got {bins}")
    edges = np.linspace(0.0, 1.0, bins + 1)
    counts = np.histogram(np.clip(u, 0.0, 1.0), bins=edges)[0].astype(np.int64)
    if len(u) == 0:
        return PitHistogram(edges, counts, float("nan"), float("nan"))
    test = stats.chisquare(counts)
    return PitHistogram(edges, counts, float(test.statistic), float(test.pvalue))


def holm(p_values: Sequence[float], alpha: float) -> NDArray[np.bool_]:
    """Holm's step-down rejections: sorted ``p_(i) <= alpha / (m - i)`` until the first failure."""
    p = np.asarray(p_values, dtype=np.float64)
    m = len(p)
    rejected = np.zeros(m, dtype=bool)
    for i, j in enumerate(np.argsort(p, kind="stable")):
        if not p[j] <= alpha / (m - i):
            break
        rejected[j] = True
    return rejected
