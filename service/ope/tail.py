"""The importance-weight tail: Pareto k-hat, a test of E[w] = 1, and the top-1% share.

Why: the Kish ESS and the mean weight are computed from the weights a sample
*saw*. Under a cold logging softmax the target's favourite actions are rare
for production, so their large weights are mostly unseen in a sample: the
observed ``mean(w^2)`` is far below the true ``E[w^2]``, the ESS looks fine,
and the normal interval (whose width comes from the observed variance) is far
too narrow. The shape of the tail tells that story where the ESS cannot.

- **Pareto k-hat** (`pareto_khat`): the shape ``xi`` of a generalized Pareto
  distribution fitted to the largest ``M = ceil(min(n / 5, 3 sqrt(n)))``
  weights above the ``(M+1)``-th largest, by the empirical-Bayes estimator of
  Zhang & Stephens (2009), "A new and efficient estimation method for the
  generalized Pareto distribution", Technometrics 51(3), with the weakly
  informative prior of Vehtari, Simpson, Gelman, Yao & Gabry, "Pareto
  smoothed importance sampling" (JMLR 25, 2024; arXiv 1507.02646), appendix:
  ``xi <- (M xi + 10 * 0.5) / (M + 10)``. Written here (not copied), and not
  ``scipy.stats.genpareto.fit``, which is maximum likelihood: unstable for
  the small tails of a few thousand rounds, and not what the thresholds were
  calibrated for.

  Thresholds (Vehtari et al. 2024, sections 3 and 6): ``xi < 1/2``: the
  weights have finite variance, the CLT holds at the usual rate
  (`KHAT_FINITE_VARIANCE`); ``1/2 <= xi < min(1 - 1/log10(n), 0.7)``
  (`khat_limit`): infinite variance, the mean still converges but slowly and
  a variance-based interval is not a 95% interval; above: the estimate is
  unreliable at this sample size (the tail that decides it has not been
  seen).
- **E[w] = 1** (`weight_mean_z`): with correct propensities and full support,
  ``E[w] = 1`` for every target; ``z = (mean(w) - 1) / (sd(w) / sqrt(n))``. With
  production's whole distribution logged at every round the exact expectation
  ``mean_t (1 - u_t)`` (the supported target mass) replaces 1.
  Its normal reference is only trustworthy when the tail is light (k-hat
  < 1/2): under a heavy tail a mean well below 1 with a large ``|z|`` is what
  an unseen tail looks like, not evidence of wrong propensities.
- **Top-1% share** (`TailSketch.top_share`): the share of ``sum w`` carried by
  the ``ceil(n / 100)`` largest weights.

`TailSketch` keeps the `TAIL_KEEP` largest weights and merges exactly (the
top ``K`` of a union is within the union of each part's top ``K``), so the
batch, streaming and Parquet paths compute one and the same k-hat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

KHAT_FINITE_VARIANCE = 0.5
"""Below this the weights have finite variance (Vehtari et al. 2024, section 3)."""

KHAT_MAX = 0.7
"""Above this no practical sample size makes the estimate reliable (ibid., section 3.2.4)."""

TAIL_KEEP = 20_000
"""Largest weights a `TailSketch` keeps: the k-hat tail (``3 sqrt(n)``) up to ``n`` = 44
million rounds, the top 1% exactly up to 2 million (beyond, a lower bound of it)."""

_PRIOR_N = 10.0
_PRIOR_XI = 0.5


def khat_limit(n: int) -> float:
    """``min(1 - 1/log10(n), 0.7)``: the k-hat above which ``n`` rounds cannot be trusted.

    Vehtari et al. (2024), section 3.2.4: the sample size needed for a given
    accuracy grows as ``n^(1/(1-k))``; for ``n <= 10`` the limit is 0 or below.
    """
    if n <= 10:
        return 0.0
    return min(1.0 - 1.0 / math.log10(n), KHAT_MAX)


def tail_size(n: int) -> int:
    """``M = ceil(min(n / 5, 3 sqrt(n)))``, the tail PSIS fits (Vehtari et al. 2024, eq. 5)."""
    return math.ceil(min(n / 5.0, 3.0 * math.sqrt(n)))


def gpd_shape(exceedances: NDArray[np.float64]) -> NDArray[np.float64]:
    """Zhang & Stephens (2009) estimate of the generalized Pareto shape ``xi``.

    Args:
        exceedances: float64 ``(..., M)``, sorted ascending along the last axis,
            each the excess over the threshold (>= 0).

    Returns:
        float64 ``(...)``: ``xi`` (positive: a heavy tail), before the prior;
        NaN where the largest exceedance is 0 (no tail to fit).

    With ``theta = -xi / sigma`` the profile log-likelihood is
    ``l(theta) = M (ln(theta / k) + k - 1)``, ``k = -mean(ln(1 - theta x))``;
    the estimate is the posterior mean of ``theta`` over the grid
    ``theta_j = 1/x_(M) + (1 - sqrt(m / (j - 1/2))) / (3 x*)``, ``j = 1..m``,
    ``m = 30 + floor(sqrt(M))``, ``x*`` the first quartile, and ``xi = mean(ln(1 - theta x))``.
    """
    x = np.asarray(exceedances, dtype=np.float64)
    size = x.shape[-1]
    top = x[..., -1]
    quart = x[..., max(math.floor(size / 4 + 0.5) - 1, 0)]
    # A discrete tail can have ties at 0 up to the quartile: the smallest positive excess then.
    positive_min = np.where(x > 0, x, np.inf).min(axis=-1)
    quart = np.where(quart > 0, quart, positive_min)
    ok = top > 0
    top = np.where(ok, top, 1.0)
    quart = np.where(np.isfinite(quart) & (quart > 0), quart, 1.0)
    m = 30 + math.floor(math.sqrt(size))
    j = np.arange(1, m + 1, dtype=np.float64)
    theta = 1.0 / top[..., None] + (1.0 - np.sqrt(m / (j - 0.5))) / (3.0 * quart[..., None])
    with np.errstate(divide="ignore", invalid="ignore"):
        k = -np.log1p(-theta[..., :, None] * x[..., None, :]).mean(axis=-1)
        loglik = size * (np.log(theta / k) + k - 1.0)
    loglik = np.where(np.isfinite(loglik), loglik, -np.inf)
    shift = loglik.max(axis=-1, keepdims=True)
    shift = np.where(np.isfinite(shift), shift, 0.0)
    weights = np.exp(loglik - shift)
    weights /= np.maximum(weights.sum(axis=-1, keepdims=True), 1e-300)
    theta_hat = (weights * theta).sum(axis=-1)
    xi = np.log1p(-theta_hat[..., None] * x).mean(axis=-1)
    out: NDArray[np.float64] = np.where(ok, xi, np.nan)
    return out


def pareto_khat(top_weights: NDArray[np.float64], n: int) -> NDArray[np.float64]:
    """PSIS k-hat of the weight tail, with the weakly informative prior.

    Args:
        top_weights: float64 ``(..., K)`` with ``K >= tail_size(n) + 1``: the
            largest weights of each sample, in any order.
        n: rounds in each sample.

    Returns:
        float64 ``(...)``; NaN when ``n < 25`` or the tail is flat (no weight
        exceeds the threshold).
    """
    w = np.sort(np.asarray(top_weights, dtype=np.float64), axis=-1)
    if n < 25:
        return np.full(w.shape[:-1], np.nan)
    size = min(tail_size(n), w.shape[-1] - 1)
    tail = w[..., -size:]
    threshold = w[..., -size - 1]
    xi = gpd_shape(tail - threshold[..., None])
    out: NDArray[np.float64] = (size * xi + _PRIOR_N * _PRIOR_XI) / (size + _PRIOR_N)
    return out


def weight_mean_z(n: int, sum_w: float, sum_w2: float, expected: float = 1.0) -> float:
    """``(mean(w) - expected) / (sd(w) / sqrt(n))``; NaN below two rounds or with no spread.

    `expected` is 1 (full support, right propensities) unless the logging
    distribution is known at every round: then it is the exact
    ``mean_t E_mu[w | x_t] = 1 - mean_t u_t`` (`service.ope.diagnostics`), and the
    test speaks of the propensities alone.
    """
    if n < 2:
        return math.nan
    mean = sum_w / n
    var = max(sum_w2 - n * mean * mean, 0.0) / (n - 1)
    if var <= 0:
        return 0.0 if mean == expected else math.copysign(math.inf, mean - expected)
    return (mean - expected) / math.sqrt(var / n)


@dataclass(frozen=True, eq=False)
class TailSketch:
    """The `TAIL_KEEP` largest weights seen, mergeable; enough for k-hat and the top 1%.

    Attributes:
        n: rounds seen.
        top: float64 ``(min(n, TAIL_KEEP),)`` the largest weights, unsorted.
        total: ``sum w`` over all rounds.
    """

    n: int = 0
    top: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    total: float = 0.0

    @staticmethod
    def of(weights: NDArray[np.float64]) -> TailSketch:
        """The sketch of one batch of weights ``(n,)``."""
        w = np.asarray(weights, dtype=np.float64)
        return TailSketch(len(w), _largest(w), float(w.sum()))

    def merge(self, other: TailSketch) -> TailSketch:
        """The sketch of both sets of rounds (exact)."""
        return TailSketch(
            self.n + other.n,
            _largest(np.concatenate([self.top, other.top])),
            self.total + other.total,
        )

    def khat(self) -> float:
        """`pareto_khat` of these rounds (NaN when too few or flat)."""
        if self.n < 25:
            return math.nan
        return float(pareto_khat(self.top, self.n))

    def top_share(self) -> float:
        """Share of ``sum w`` on the ``ceil(n/100)`` largest weights (a lower bound past
        ``100 * TAIL_KEEP`` rounds); 0 when every weight is 0."""
        if self.total <= 0:
            return 0.0
        k = min(math.ceil(self.n / 100), len(self.top))
        return float(np.sort(self.top)[-k:].sum() / self.total) if k else 0.0


def _largest(w: NDArray[np.float64]) -> NDArray[np.float64]:
    if len(w) <= TAIL_KEEP:
        return w.copy()
    return np.partition(w, len(w) - TAIL_KEEP)[-TAIL_KEEP:]
