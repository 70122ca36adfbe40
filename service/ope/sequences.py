"""Anytime-valid confidence sequences, updated batch by batch from running statistics.

A ``(1 - alpha)`` confidence sequence ``C_t`` covers the mean at every ``t``
simultaneously: ``P(exists t: mu not in C_t) <= alpha``. So it may be checked
after every batch and stopped on at any data-dependent time; a fixed-sample
interval may not (Howard, Ramdas, McAuliffe & Sekhon 2021, "Time-uniform,
nonparametric, nonasymptotic confidence sequences"). Each class keeps O(1) or
O(grid) state; ``update`` takes the new batch only.

================================  ============================================  ==============
class                             for                                           assumptions
================================  ============================================  ==============
`AsymptoticCS`                    any per-round values: IPS/DR contributions,   i.i.d. (or
                                  candidate-minus-production differences        martingale
                                                                                differences),
                                                                                finite variance;
                                                                                valid as t grows
`BettingCS`                       a mean of values in known ``[lower, upper]``  i.i.d., bounded;
                                                                                exact at every t
`OffPolicyBettingCS`              IPS value of a target, rewards in known       fixed target,
                                  ``[lower, upper]``, weights >= 0 unbounded    correct
                                                                                propensities;
                                                                                exact at every t
`ProportionCS`                    a rate (errors, infeasible favourites, SLO)   i.i.d. Bernoulli;
                                                                                exact at every t
================================  ============================================  ==============

Grid-based sequences (the betting ones) report the nearest grid points
outside the set, so their bounds are conservative by at most one grid step.
A two-sided sequence at ``alpha`` also gives one-sided bounds at ``alpha``
(conservative), e.g. for a non-inferiority guardrail.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray
from scipy import optimize, special

from service.contract import InvalidInput
from service.ope.betting import (
    BettingCS,
    OffPolicyBettingCS,
    PairedOffPolicyBettingCS,
    check_alpha,
    finite,
)
from service.ope.results import Interval, IntervalMethod

__all__ = [
    "AsymptoticCS",
    "BettingCS",
    "OffPolicyBettingCS",
    "PairedOffPolicyBettingCS",
    "ProportionCS",
    "asymptotic_rho",
]


def asymptotic_rho(alpha: float, n_star: float) -> float:
    """The mixture's tuning ``rho`` that makes the sequence tightest near ``t = n_star``.

    ``rho = sqrt((-2 ln alpha + ln(-2 ln alpha + 1)) / n_star)`` (Waudby-Smith
    et al. 2021, eq. for the optimal rho; GrowthBook's "sequential tuning
    parameter" is ``n_star``).
    """
    la = math.log(alpha)
    return math.sqrt((-2 * la + math.log(-2 * la + 1)) / n_star)


class AsymptoticCS:
    """Asymptotic confidence sequence for a mean (Waudby-Smith, Arbour, Sinha, Kennedy &
    Ramdas 2021, "Time-uniform central limit theory and asymptotic confidence sequences",
    Theorem 2.2; the form GrowthBook uses for sequential testing).

    With running mean ``mu_t`` and standard deviation ``s_t`` of the values,

        C_t = mu_t +- s_t sqrt( 2 (t rho^2 + 1) / (t^2 rho^2) * ln( sqrt(t rho^2 + 1) / alpha ) ).

    Assumptions: values i.i.d. (or martingale differences around a fixed mean)
    with finite variance (Lindeberg-type); the coverage guarantee holds as t
    grows, so it is approximate in the first few hundred rounds, more so
    under heavy-tailed importance weights. Feed it per-round IPS/DR
    contributions (`service.ope.streaming.round_values`), or differences
    candidate minus production on the same rounds. State: count, mean, M2.
    """

    def __init__(self, alpha: float = 0.05, n_star: float = 5000.0) -> None:
        check_alpha(alpha)
        if not (isinstance(n_star, float | int) and n_star > 0):
            raise InvalidInput("n_star", f"must be > 0, got {n_star}")
        self.alpha = float(alpha)
        self.rho = asymptotic_rho(alpha, n_star)
        self.n = 0
        self.mean = 0.0
        self._m2 = 0.0

    def update(self, values: NDArray[np.float64]) -> None:
        """Add a batch of per-round values, float64 ``(b,)``."""
        v = finite("values", values)
        if len(v) == 0:
            return
        b = len(v)
        mb = float(v.mean())
        m2b = float(((v - mb) ** 2).sum())
        n = self.n + b
        delta = mb - self.mean
        self.mean += delta * b / n
        self._m2 += m2b + delta * delta * self.n * b / n
        self.n = n

    @property
    def std(self) -> float:
        """Sample standard deviation (ddof 1) of the values so far."""
        return math.sqrt(self._m2 / (self.n - 1)) if self.n > 1 else math.nan

    def interval(self) -> Interval:
        """``C_t`` at the current ``t``; unbounded before two values or with zero spread."""
        t, r2 = self.n, self.rho**2
        if t < 2 or self._m2 <= 0:
            return Interval.unbounded(1 - self.alpha, IntervalMethod.ASYMPTOTIC_CS, t)
        half = self.std * math.sqrt(
            2 * (t * r2 + 1) / (t * t * r2) * math.log(math.sqrt(t * r2 + 1) / self.alpha)
        )
        return Interval(
            self.mean - half, self.mean + half, 1 - self.alpha, IntervalMethod.ASYMPTOTIC_CS, t
        )


class ProportionCS:
    """Confidence sequence for a proportion from counts: the beta-binomial mixture.

    ``M_t(p) = B(a + S_t, b + F_t) / (B(a, b) p^S_t (1 - p)^F_t)`` is a
    nonnegative martingale at the true ``p`` (a mixture of likelihood ratios;
    Robbins 1970, "Statistical methods related to the law of the iterated
    logarithm"; Howard et al. 2021, section 3), so ``{p: M_t(p) < 1/alpha}`` is
    a ``(1 - alpha)`` sequence. It is an interval around ``S_t / t``, whose ends
    are found by root finding. Sufficient statistics: successes and trials.
    Assumptions: i.i.d. Bernoulli (or a constant conditional success
    probability); valid at every t.
    """

    def __init__(self, alpha: float = 0.05, prior: float = 0.5) -> None:
        check_alpha(alpha)
        if not prior > 0:
            raise InvalidInput("prior", f"must be > 0, got {prior}")
        self.alpha = float(alpha)
        self.prior = float(prior)
        self.successes = 0
        self.trials = 0

    @property
    def n(self) -> int:
        """Trials so far."""
        return self.trials

    def update(self, outcomes: NDArray[np.bool_]) -> None:
        """Add a batch of 0/1 outcomes, shape ``(b,)``."""
        x = finite("outcomes", np.asarray(outcomes, dtype=np.float64))
        if not np.isin(x, (0.0, 1.0)).all():
            t = int(np.flatnonzero(~np.isin(x, (0.0, 1.0)))[0])
            raise InvalidInput("outcomes", f"must be 0 or 1, got {x[t]} at round {t}")
        self.update_counts(int(x.sum()), len(x))

    def update_counts(self, successes: int, trials: int) -> None:
        """Add counts: `successes` out of `trials`."""
        if not (0 <= successes <= trials):
            raise InvalidInput("successes", f"must be in [0, trials], got {successes}/{trials}")
        self.successes += successes
        self.trials += trials

    def _excess(self, p: float) -> float:
        """``ln M_t(p) - ln(1/alpha)``; negative inside the sequence."""
        s, f, a = self.successes, self.trials - self.successes, self.prior
        log_mix = special.betaln(a + s, a + f) - special.betaln(a, a)
        return float(
            log_mix - special.xlogy(s, p) - special.xlog1py(f, -p) - math.log(1 / self.alpha)
        )

    def interval(self) -> Interval:
        """The sequence at the current ``t``."""
        level = 1 - self.alpha
        if self.trials == 0:
            return Interval(0.0, 1.0, level, IntervalMethod.PROPORTION_CS, 0)
        s, t = self.successes, self.trials
        p_hat = s / t
        tiny = 1e-15
        lo = 0.0
        if s > 0 and self._excess(tiny) > 0:
            lo = float(optimize.brentq(self._excess, tiny, p_hat, xtol=1e-14))
        hi = 1.0
        if s < t and self._excess(1 - tiny) > 0:
            hi = float(optimize.brentq(self._excess, p_hat, 1 - tiny, xtol=1e-14))
        return Interval(lo, hi, level, IntervalMethod.PROPORTION_CS, t)
