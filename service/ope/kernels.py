"""Every estimator as one kernel over three per-round parts.

Each estimator of `service.ope.estimators` is

    V = mean_t d_t  +  (sum_t c_t) / (sum_t m_t)

with ``w_t = pi(a_t|x_t) / pscore_t``, ``q_pi(x_t) = sum_a pi(a|x_t) q_hat(x_t, a)``
and ``q_t = q_hat(x_t, a_t)``:

==========  ============  =========================================  =======
estimator   d_t           c_t                                        m_t
==========  ============  =========================================  =======
DM          q_pi(x_t)     0                                          1
IPS         0             w_t r_t                                    1
SNIPS       0             w_t r_t                                    w_t
DR          q_pi(x_t)     w_t (r_t - q_t)                            1
SNDR        q_pi(x_t)     w_t (r_t - q_t)                            w_t
switch-DR   q_pi(x_t)     w_t 1[w_t <= tau] (r_t - q_t)              1
==========  ============  =========================================  =======

Per-round contributions are the influence-function linearisation

    psi_t = d_t + V_c + (c_t - V_c m_t) / mean(m),      V_c = sum c / sum m,

whose mean is exactly V (for ``m = 1``: ``psi_t = d_t + c_t``), so a normal
interval, a bootstrap, a slice or a stream all reuse the same three arrays.
Sums of the parts and of their cross-products (`Moments`) are sufficient for
the value and its normal interval, which is what streaming keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.ope.data import BanditData
from service.ope.results import Estimator


@dataclass(frozen=True, eq=False)
class Parts:
    """The three per-round arrays of the kernel, each float64 ``(n,)``."""

    direct: NDArray[np.float64]
    correction: NDArray[np.float64]
    normaliser: NDArray[np.float64]

    @property
    def n(self) -> int:
        """Rounds."""
        return len(self.direct)

    def stacked(self) -> NDArray[np.float64]:
        """``(n, 3)``: columns d, c, m."""
        return np.stack([self.direct, self.correction, self.normaliser], axis=1)


def parts(data: BanditData, estimator: Estimator, tau: float) -> Parts:
    """The kernel's parts for `estimator` on `data` (`tau`: switch-DR's weight threshold)."""
    n = data.n
    w = data.weight
    ones = np.ones(n)
    if estimator in (Estimator.IPS, Estimator.SNIPS):
        c = w * data.reward
        return Parts(np.zeros(n), c, w if estimator is Estimator.SNIPS else ones)
    q = data.estimated_rewards
    assert q is not None  # checked by the caller, which names the argument
    q_pi = (data.action_dist * q).sum(axis=1)
    if estimator is Estimator.DM:
        return Parts(q_pi, np.zeros(n), ones)
    residual = data.reward - q[np.arange(n), data.action]
    if estimator is Estimator.SWITCH_DR:
        return Parts(q_pi, np.where(w <= tau, w * residual, 0.0), ones)
    return Parts(q_pi, w * residual, w if estimator is Estimator.SNDR else ones)


def value(p: Parts) -> float:
    """``V = mean(d) + sum(c) / sum(m)``."""
    return float(p.direct.mean() + p.correction.sum() / p.normaliser.sum())


def contributions(p: Parts) -> NDArray[np.float64]:
    """``psi_t``, shape ``(n,)``; ``mean(psi) == V``."""
    vc = p.correction.sum() / p.normaliser.sum()
    out: NDArray[np.float64] = (
        p.direct + vc + (p.correction - vc * p.normaliser) / p.normaliser.mean()
    )
    return out


@dataclass(frozen=True, slots=True)
class Moments:
    """Count, means and co-moment matrix of the rows ``(d_t, c_t, m_t)``.

    Merged with Chan, Golub & LeVeque (1979), "Updating formulae and a pairwise
    algorithm for computing sample variances": numerically stable, and the
    merge of two batches equals the moments of their union.

    Attributes:
        n: rows.
        mean: float64 ``(3,)``.
        comoment: float64 ``(3, 3)``, ``sum_t (x_t - mean)(x_t - mean)^T``.
    """

    n: int
    mean: NDArray[np.float64]
    comoment: NDArray[np.float64]

    @staticmethod
    def empty() -> Moments:
        """No rows yet."""
        return Moments(0, np.zeros(3), np.zeros((3, 3)))

    @staticmethod
    def of(p: Parts) -> Moments:
        """The moments of one batch of parts."""
        x = p.stacked()
        mean = x.mean(axis=0)
        dev = x - mean
        return Moments(p.n, mean, dev.T @ dev)

    def merge(self, other: Moments) -> Moments:
        """The moments of both batches."""
        if other.n == 0:
            return self
        if self.n == 0:
            return other
        n = self.n + other.n
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.n / n)
        comoment = self.comoment + other.comoment + np.outer(delta, delta) * (self.n * other.n / n)
        return Moments(n, mean, comoment)

    def value(self) -> float:
        """``V``, as `value` computes it from the rows."""
        return float(self.mean[0] + self.mean[1] / self.mean[2])

    def contribution_variance(self) -> float:
        """Sample variance (ddof 1) of ``psi_t``, which is linear in the rows.

        ``psi_t = d_t + c_t / mean(m) - (V_c / mean(m)) m_t + V_c``, so its
        variance is ``v^T S v`` with ``v = (1, 1/mean(m), -V_c/mean(m))`` and ``S``
        the sample covariance of the rows.
        """
        if self.n < 2:
            return float("nan")
        m_bar = self.mean[2]
        vc = self.mean[1] / m_bar
        v = np.array([1.0, 1.0 / m_bar, -vc / m_bar])
        return float(v @ self.comoment @ v / (self.n - 1))
