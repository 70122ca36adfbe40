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
from service.ope.results import Interval, IntervalMethod

_CELLS = 2_000_000
"""Batch rounds x grid points processed at once by the betting sequences."""


def _check_alpha(alpha: float) -> None:
    if not (isinstance(alpha, float | int) and 0 < alpha < 1):
        raise InvalidInput("alpha", f"must be in (0, 1), got {alpha}")


def _finite(name: str, values: NDArray[np.float64] | float) -> NDArray[np.float64]:
    v = np.atleast_1d(np.asarray(values, dtype=np.float64))
    if v.ndim != 1:
        raise InvalidInput(name, f"must be a 1-dimensional array, got shape {v.shape}")
    if not np.isfinite(v).all():
        t = int(np.flatnonzero(~np.isfinite(v))[0])
        raise InvalidInput(name, f"must be finite, got {v[t]} at round {t}")
    return v


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
        _check_alpha(alpha)
        if not (isinstance(n_star, float | int) and n_star > 0):
            raise InvalidInput("n_star", f"must be > 0, got {n_star}")
        self.alpha = float(alpha)
        self.rho = asymptotic_rho(alpha, n_star)
        self.n = 0
        self.mean = 0.0
        self._m2 = 0.0

    def update(self, values: NDArray[np.float64]) -> None:
        """Add a batch of per-round values, float64 ``(b,)``."""
        v = _finite("values", values)
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


class _NonNegativeBet:
    """One-sided betting capital on a grid of candidate means ``m in [0, 1]``.

    For nonnegative pseudo-outcomes ``phi_i`` with conditional mean ``theta``,
    ``K_t(m) = prod_i (1 + lambda_i(m) (phi_i - m))`` with
    ``lambda_i(m) = min(lambda_i, c / m)`` is a nonnegative martingale at
    ``m = theta`` (each factor >= 1 - c > 0), so by Ville's inequality
    ``{m: K_t(m) < 1/alpha}`` is a lower confidence sequence. ``lambda_i`` is
    the predictable plug-in of Waudby-Smith & Ramdas (2023), eq. (26):
    ``sqrt(2 ln(1/alpha) / (sigma2_{i-1} i ln(1 + i)))`` with
    ``mu_i = (1/2 + sum_{j<=i} phi_j) / (i + 1)``,
    ``sigma2_i = (1/4 + sum_{j<=i} (phi_j - mu_j)^2) / (i + 1)``.
    ``K_t(m)`` is non-increasing in ``m``, so the rejected set is ``[0, L)``.
    """

    def __init__(self, alpha: float, grid: NDArray[np.float64], c: float) -> None:
        self.log_threshold = math.log(1 / alpha)
        self.grid = grid
        with np.errstate(divide="ignore"):
            self.cap = np.where(grid > 0, c / np.maximum(grid, 1e-300), np.inf)
        self.log_capital = np.zeros(len(grid))
        self.t = 0
        self._sum = 0.0
        self._dev2 = 0.0

    def update(self, phi: NDArray[np.float64]) -> None:
        b = len(phi)
        i = self.t + 1 + np.arange(b, dtype=np.float64)
        mu = (0.5 + self._sum + np.cumsum(phi)) / (i + 1)
        dev2 = np.cumsum((phi - mu) ** 2)
        var_after = (0.25 + self._dev2 + dev2) / (i + 1)
        var_before = np.concatenate([[(0.25 + self._dev2) / (self.t + 1)], var_after[:-1]])
        lam = np.sqrt(2 * self.log_threshold / (var_before * i * np.log1p(i)))
        step = max(1, _CELLS // len(self.grid))
        for s in range(0, b, step):
            bet = np.minimum(lam[s : s + step, None], self.cap[None, :])
            self.log_capital += np.log1p(bet * (phi[s : s + step, None] - self.grid[None, :])).sum(
                axis=0
            )
        self.t += b
        self._sum += float(phi.sum())
        self._dev2 += float(dev2[-1])

    def lower(self) -> float:
        """The largest grid point below the first non-rejected one (0 when none is rejected)."""
        accepted = np.flatnonzero(self.log_capital < self.log_threshold)
        if len(accepted) == 0:
            return float(self.grid[-1])
        k = int(accepted[0])
        return float(self.grid[k - 1]) if k > 0 else float(self.grid[0])


def _grid(size: int) -> NDArray[np.float64]:
    if not (isinstance(size, int) and size >= 10):
        raise InvalidInput("grid_size", f"must be an integer >= 10, got {size}")
    return np.linspace(0.0, 1.0, size + 1)


def _bounds(lower: float, upper: float) -> tuple[float, float]:
    if not (math.isfinite(lower) and math.isfinite(upper) and lower < upper):
        raise InvalidInput("bounds", f"must be finite with lower < upper, got [{lower}, {upper}]")
    return float(lower), float(upper)


def _scaled(name: str, values: NDArray[np.float64], lo: float, hi: float) -> NDArray[np.float64]:
    v = _finite(name, values)
    out = (v < lo) | (v > hi)
    if out.any():
        t = int(np.flatnonzero(out)[0])
        raise InvalidInput(name, f"must be in [{lo:g}, {hi:g}], got {v[t]} at round {t}")
    scaled: NDArray[np.float64] = (v - lo) / (hi - lo)
    return scaled


class _TwoSidedBet:
    """Two one-sided bets at ``alpha / 2`` each: lower on ``phi_lo``, upper on ``phi_hi``."""

    def __init__(self, alpha: float, grid_size: int, c: float) -> None:
        _check_alpha(alpha)
        if not 0 < c < 1:
            raise InvalidInput("c", f"must be in (0, 1), got {c}")
        self.alpha = float(alpha)
        grid = _grid(grid_size)
        self._lo = _NonNegativeBet(alpha / 2, grid, c)
        self._hi = _NonNegativeBet(alpha / 2, grid, c)

    @property
    def n(self) -> int:
        """Rounds so far."""
        return self._lo.t

    def _update(self, phi_lo: NDArray[np.float64], phi_hi: NDArray[np.float64]) -> None:
        if len(phi_lo):
            self._lo.update(phi_lo)
            self._hi.update(phi_hi)

    def _interval(self, lo: float, hi: float, method: IntervalMethod) -> Interval:
        """Bounds in the original units: the upper bet is on ``1 - mean``."""
        a, b = self._lo.lower(), 1.0 - self._hi.lower()
        return Interval(lo + a * (hi - lo), lo + b * (hi - lo), 1 - self.alpha, method, self.n)


class BettingCS(_TwoSidedBet):
    """Betting confidence sequence for the mean of values in ``[lower, upper]``.

    Waudby-Smith & Ramdas (2023), "Estimating means of bounded random variables
    by betting", JRSSB 86(1): the hedged capital process (Theorem 3, theta =
    1/2) with predictable plug-in bets truncated at ``c/m`` and ``c/(1 - m)``,
    on a grid of ``grid_size + 1`` candidate means.
    Assumptions: values i.i.d. (or with a constant conditional mean) in the
    stated bounds; then valid at every t, no asymptotics. Not for importance-
    weighted values, which are unbounded above: use `OffPolicyBettingCS`.
    """

    def __init__(
        self,
        alpha: float = 0.05,
        lower: float = 0.0,
        upper: float = 1.0,
        grid_size: int = 1000,
        c: float = 0.5,
    ) -> None:
        self.lower, self.upper = _bounds(lower, upper)
        super().__init__(alpha, grid_size, c)

    def update(self, values: NDArray[np.float64]) -> None:
        """Add a batch of values, float64 ``(b,)`` within the bounds."""
        x = _scaled("values", values, self.lower, self.upper)
        self._update(x, 1.0 - x)

    def interval(self) -> Interval:
        """The sequence at the current ``t``."""
        return self._interval(self.lower, self.upper, IntervalMethod.BETTING_CS)


class OffPolicyBettingCS(_TwoSidedBet):
    """Betting confidence sequence for a target's value from importance-weighted rewards.

    Waudby-Smith, Wu, Ramdas, Karampatziakis & Mineiro (2022), "Anytime-valid
    off-policy inference for contextual bandits", section 3: with rewards
    rescaled to ``r in [0, 1]`` and weights ``w = pi(a|x) / mu(a|x) >= 0``,
    ``phi = w r >= 0`` has conditional mean ``V`` and ``w (1 - r) >= 0`` has
    mean ``1 - V``, so two nonnegative betting processes (each at
    ``alpha / 2``) give lower and upper bounds, with no bound on the weights
    needed. Assumptions: a fixed target, correct logged propensities (which
    may change over time: the logging policy can be adaptive), full support
    (otherwise ``E[w r] < V``: check the diagnostics first), rewards in the
    stated bounds; then valid at every t.
    """

    def __init__(
        self,
        alpha: float = 0.05,
        lower: float = 0.0,
        upper: float = 1.0,
        grid_size: int = 1000,
        c: float = 0.5,
    ) -> None:
        self.lower, self.upper = _bounds(lower, upper)
        super().__init__(alpha, grid_size, c)

    def update(self, *, weight: NDArray[np.float64], reward: NDArray[np.float64]) -> None:
        """Add a batch: importance weights and rewards, each float64 ``(b,)``."""
        w = _finite("weight", weight)
        r = _scaled("reward", reward, self.lower, self.upper)
        if len(w) != len(r):
            raise InvalidInput("weight", f"must have one entry per reward ({len(r)}), got {len(w)}")
        if (w < 0).any():
            t = int(np.flatnonzero(w < 0)[0])
            raise InvalidInput("weight", f"must be >= 0, got {w[t]} at round {t}")
        self._update(w * r, w * (1.0 - r))

    def interval(self) -> Interval:
        """The sequence at the current ``t``."""
        return self._interval(self.lower, self.upper, IntervalMethod.OFF_POLICY_BETTING_CS)


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
        _check_alpha(alpha)
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
        x = _finite("outcomes", np.asarray(outcomes, dtype=np.float64))
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
