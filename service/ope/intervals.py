"""Fixed-sample intervals: normal (CLT), seeded percentile bootstrap, Clopper-Pearson.

These hold at one pre-chosen sample size. To look after every batch use the
confidence sequences of `service.ope.sequences` instead.

- `normal_interval`: ``mean(psi) +- z_{1-a/2} sd(psi) / sqrt(n)`` over the
  per-round contributions ``psi`` (`service.ope.kernels`). Assumes the rounds
  are independent (i.i.d. contexts, a fixed logging policy) with finite
  variance and ``n`` large enough for the CLT (the weights' tail decides how
  large: see the ESS and tail diagnostics). For self-normalised estimators it
  is the delta method. Reference: Dudik, Langford & Li (2011), "Doubly robust
  policy evaluation and learning"; Swaminathan & Joachims (2015), "The
  self-normalized estimator for counterfactual learning".
- `bootstrap_interval`: percentile bootstrap (Efron & Tibshirani 1993, ch. 13)
  of the estimator itself, recomputed on ``n_boot`` resamples of the rounds.
  Same independence assumption; seeded, so reproducible. Vectorised: a
  resample's multiplicity counts times the ``(n, 3)`` kernel parts is one
  matrix product.
- `clopper_pearson`: exact binomial interval (Clopper & Pearson 1934), the
  project's only one: scipy's exact interval (`scipy.stats.binomtest`'s
  ``proportion_ci(method="exact")``), so every caller (OPE coverage tables,
  calibration coverage, the evaluator's false-stop checks) reads the same bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from service.contract import InvalidInput
from service.ope.kernels import Parts
from service.ope.results import Interval, IntervalMethod

_CHUNK_CELLS = 4_000_000
"""Resample cells (resamples x rounds) drawn at once, to bound memory."""


def check_level(level: float) -> None:
    """Raise `InvalidInput` naming `level` unless it is in (0, 1)."""
    if not (isinstance(level, float | int) and 0 < level < 1):
        raise InvalidInput("level", f"must be in (0, 1), got {level}")


def normal_from_moments(mean: float, variance: float, n: int, level: float) -> Interval:
    """``mean +- z sqrt(variance / n)``; unbounded when ``n < 2``."""
    if n < 2 or not math.isfinite(variance):
        return Interval.unbounded(level, IntervalMethod.NORMAL, n)
    half = float(stats.norm.ppf(0.5 + level / 2)) * math.sqrt(max(variance, 0.0) / n)
    return Interval(mean - half, mean + half, level, IntervalMethod.NORMAL, n)


def normal_interval(values: NDArray[np.float64], level: float = 0.95) -> Interval:
    """Normal interval for the mean of `values`, float64 ``(n,)`` (see the module docstring)."""
    check_level(level)
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    variance = float(v.var(ddof=1)) if n > 1 else math.nan
    return normal_from_moments(float(v.mean()) if n else math.nan, variance, n, level)


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """Percentile bootstrap settings.

    Attributes:
        n_boot: resamples (>= 100).
        seed: seed of ``numpy.random.default_rng``; the same seed and data give
            the same interval.
    """

    n_boot: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_boot < 100:
            raise InvalidInput("n_boot", f"must be >= 100, got {self.n_boot}")


def resampled_values(p: Parts, config: Bootstrap) -> NDArray[np.float64]:
    """The estimator on ``n_boot`` resamples of the rounds, float64 ``(n_boot,)``.

    Each resample draws ``n`` rounds with replacement; its multiplicity counts
    ``K`` (``n_boot x n``) give the sums ``K @ [d, c, m]`` and so
    ``V* = sum d*/n + sum c*/sum m*`` (NaN where ``sum m* = 0``).
    """
    rng = np.random.default_rng(config.seed)
    n = p.n
    x = p.stacked()
    chunk = max(1, min(config.n_boot, _CHUNK_CELLS // max(n, 1)))
    out = np.empty(config.n_boot)
    for start in range(0, config.n_boot, chunk):
        b = min(chunk, config.n_boot - start)
        idx = rng.integers(0, n, size=(b, n)) + (np.arange(b) * n)[:, None]
        counts = np.bincount(idx.ravel(), minlength=b * n).reshape(b, n).astype(np.float64)
        sums = counts @ x
        with np.errstate(divide="ignore", invalid="ignore"):
            out[start : start + b] = sums[:, 0] / n + sums[:, 1] / sums[:, 2]
    return out


def bootstrap_interval(p: Parts, level: float, config: Bootstrap) -> Interval:
    """Percentile interval ``[q_{a/2}, q_{1-a/2}]`` of `resampled_values`."""
    check_level(level)
    v = resampled_values(p, config)
    v = v[np.isfinite(v)]
    if len(v) < config.n_boot // 2:
        return Interval.unbounded(level, IntervalMethod.BOOTSTRAP, p.n)
    lo, hi = np.quantile(v, [0.5 - level / 2, 0.5 + level / 2])
    return Interval(float(lo), float(hi), level, IntervalMethod.BOOTSTRAP, p.n)


def clopper_pearson(successes: int, trials: int, level: float = 0.99) -> Interval:
    """Exact two-sided binomial interval for a proportion (Clopper & Pearson 1934).

    Computed by scipy (``binomtest(k, n).proportion_ci(level, method="exact")``)
    rather than by hand, so there is one implementation to trust. It equals the
    closed form ``[Beta_{a/2}(k, n - k + 1), Beta_{1-a/2}(k + 1, n - k)]`` with
    ``a = 1 - level`` (scipy finds the roots of the binomial tails numerically;
    the two agree to ~1e-12, see tests/ope/test_ope_exact.py), and its ends are
    exactly 0 at ``k = 0`` and 1 at ``k = n``. ``trials = 0`` is refused here
    (scipy would raise a bare ``ValueError``): callers with no trials have no
    interval to report and must say so themselves.
    """
    check_level(level)
    if trials < 1 or not 0 <= successes <= trials:
        raise InvalidInput(
            "successes", f"must be in [0, trials] with trials >= 1, got {successes}/{trials}"
        )
    ci = stats.binomtest(successes, trials).proportion_ci(confidence_level=level, method="exact")
    return Interval(float(ci.low), float(ci.high), level, IntervalMethod.CLOPPER_PEARSON, trials)
