"""Betting confidence sequences: bounded means, off-policy values and paired differences.

Waudby-Smith & Ramdas (2023), "Estimating means of bounded random variables by
betting" (JRSSB 86(1)), and for importance-weighted rewards Waudby-Smith, Wu,
Ramdas, Karampatziakis & Mineiro (2022), "Anytime-valid off-policy inference
for contextual bandits". Every sequence here is two one-sided bets at
``alpha / 2`` on nonnegative pseudo-outcomes (`plugin_bets`, `log_capital`);
each keeps O(grid) state and updates from the new batch only. Grid sequences
report the nearest grid points outside the set (conservative by at most one
grid step). Cross-checked against the `confseq` package's ``betting_cs`` in
``tests/ope/test_confseq_crosscheck.py``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from service.contract import InvalidInput
from service.ope.results import Interval, IntervalMethod

_CELLS = 2_000_000
"""Batch rounds x grid points processed at once by the betting sequences."""


def check_alpha(alpha: float) -> None:
    if not (isinstance(alpha, float | int) and 0 < alpha < 1):
        raise InvalidInput("alpha", f"must be in (0, 1), got {alpha}")


def finite(name: str, values: NDArray[np.float64] | float) -> NDArray[np.float64]:
    v = np.atleast_1d(np.asarray(values, dtype=np.float64))
    if v.ndim != 1:
        raise InvalidInput(name, f"must be a 1-dimensional array, got shape {v.shape}")
    if not np.isfinite(v).all():
        t = int(np.flatnonzero(~np.isfinite(v))[0])
        raise InvalidInput(name, f"must be finite, got {v[t]} at round {t}")
    return v


def plugin_bets(
    phi: NDArray[np.float64],
    *,
    log_threshold: float,
    n_planned: int | None = None,
    start: int = 0,
    sum_before: NDArray[np.float64] | float = 0.0,
    dev2_before: NDArray[np.float64] | float = 0.0,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Predictable plug-in bets ``lambda_i`` for rounds ``start + 1 .. start + b``.

    Waudby-Smith & Ramdas (2023), eq. (26) for a sequence,
    ``sqrt(2 ln(1/alpha) / (sigma2_{i-1} i ln(1 + i)))``, or, with `n_planned`,
    the fixed-``n`` plug-in of their section 5 (eq. 27),
    ``sqrt(2 ln(1/alpha) / (n sigma2_{i-1}))``, tightest at ``t = n``; with
    ``mu_i = (1/2 + sum_{j<=i} phi_j) / (i + 1)``,
    ``sigma2_i = (1/4 + sum_{j<=i} (phi_j - mu_j)^2) / (i + 1)``. Either is
    predictable (``lambda_i`` reads rounds before ``i`` only), so the capital
    stays a nonnegative supermartingale and the set is valid at every ``t``.

    Args:
        phi: float64 ``(..., b)``: the batch's pseudo-outcomes, any leading axes
            (one per independent stream, e.g. replications).
        log_threshold: ``ln(1/alpha)`` of the one-sided bet.
        n_planned: the sample size to tune for; None = the sequence's bets.
        start, sum_before, dev2_before: rounds, ``sum phi`` and
            ``sum (phi_j - mu_j)^2`` before the batch (shape ``(...)``).

    Returns:
        ``lambda`` ``(..., b)``, and ``sum (phi_j - mu_j)^2`` after the batch ``(...)``.
    """
    b = phi.shape[-1]
    i = start + 1 + np.arange(b, dtype=np.float64)
    s0 = np.asarray(sum_before, dtype=np.float64)[..., None]
    d0 = np.asarray(dev2_before, dtype=np.float64)[..., None]
    mu = (0.5 + s0 + np.cumsum(phi, axis=-1)) / (i + 1)
    dev2 = np.cumsum((phi - mu) ** 2, axis=-1)
    var_after = (0.25 + d0 + dev2) / (i + 1)
    first = np.broadcast_to((0.25 + d0) / (start + 1), var_after[..., :1].shape)
    var_before = np.concatenate([first, var_after[..., :-1]], axis=-1)
    scale = float(n_planned) if n_planned is not None else i * np.log1p(i)
    lam = np.sqrt(2 * log_threshold / (var_before * scale))
    return lam, d0[..., 0] + dev2[..., -1]


def log_capital(
    phi: NDArray[np.float64], lam: NDArray[np.float64], m: NDArray[np.float64] | float, c: float
) -> NDArray[np.float64]:
    """``ln K(m) = sum_i ln(1 + min(lambda_i, c/m) (phi_i - m))`` over the last axis.

    `m` broadcasts against ``phi[..., 0]`` (one candidate mean per stream);
    ``K`` is non-increasing in ``m``. The coverage table evaluates it at the
    true mean, which is what decides whether the set covers.
    """
    m_ = np.asarray(m, dtype=np.float64)[..., None]
    with np.errstate(divide="ignore"):
        cap = np.where(m_ > 0, c / np.maximum(m_, 1e-300), np.inf)
    out: NDArray[np.float64] = np.log1p(np.minimum(lam, cap) * (phi - m_)).sum(axis=-1)
    return out


class _NonNegativeBet:
    """One-sided betting capital on a grid of candidate means ``m in [0, 1]``.

    For nonnegative pseudo-outcomes ``phi_i`` with conditional mean ``theta``,
    ``K_t(m) = prod_i (1 + lambda_i(m) (phi_i - m))`` with
    ``lambda_i(m) = min(lambda_i, c / m)`` is a nonnegative martingale at
    ``m = theta`` (each factor >= 1 - c > 0), so by Ville's inequality
    ``{m: K_t(m) < 1/alpha}`` is a lower confidence sequence; ``lambda_i``
    from `plugin_bets`. ``K_t(m)`` is non-increasing in ``m``, so the
    rejected set is ``[0, L)``.
    """

    def __init__(
        self, alpha: float, grid: NDArray[np.float64], c: float, n_planned: int | None = None
    ) -> None:
        self.log_threshold = math.log(1 / alpha)
        self.grid = grid
        self.c = c
        self.n_planned = n_planned
        self.log_capital = np.zeros(len(grid))
        self.t = 0
        self._sum = 0.0
        self._dev2 = 0.0

    def update(self, phi: NDArray[np.float64]) -> None:
        b = len(phi)
        lam, dev2 = plugin_bets(
            phi,
            log_threshold=self.log_threshold,
            n_planned=self.n_planned,
            start=self.t,
            sum_before=self._sum,
            dev2_before=self._dev2,
        )
        step = max(1, _CELLS // len(self.grid))
        for s in range(0, b, step):
            self.log_capital += log_capital(
                phi[None, s : s + step], lam[None, s : s + step], self.grid, self.c
            )
        self.t += b
        self._sum += float(phi.sum())
        self._dev2 = float(dev2)

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
    v = finite(name, values)
    out = (v < lo) | (v > hi)
    if out.any():
        t = int(np.flatnonzero(out)[0])
        raise InvalidInput(name, f"must be in [{lo:g}, {hi:g}], got {v[t]} at round {t}")
    scaled: NDArray[np.float64] = (v - lo) / (hi - lo)
    return scaled


class _TwoSidedBet:
    """Two one-sided bets at ``alpha / 2`` each: lower on ``phi_lo``, upper on ``phi_hi``."""

    def __init__(
        self,
        alpha: float = 0.05,
        lower: float = 0.0,
        upper: float = 1.0,
        grid_size: int = 1000,
        c: float = 0.5,
        n_planned: int | None = None,
    ) -> None:
        """Outcomes in ``[lower, upper]``; `n_planned` tunes the bets for one sample size."""
        self.lower, self.upper = _bounds(lower, upper)
        check_alpha(alpha)
        if not 0 < c < 1:
            raise InvalidInput("c", f"must be in (0, 1), got {c}")
        if n_planned is not None and not (isinstance(n_planned, int) and n_planned >= 1):
            raise InvalidInput("n_planned", f"must be an integer >= 1 or None, got {n_planned}")
        self.alpha = float(alpha)
        grid = _grid(grid_size)
        self._lo = _NonNegativeBet(alpha / 2, grid, c, n_planned)
        self._hi = _NonNegativeBet(alpha / 2, grid, c, n_planned)

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
        super().__init__(alpha, lower, upper, grid_size, c)

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
    stated bounds; then valid at every t. `n_planned` tunes the bets for one
    sample size (`plugin_bets`): still valid at every t, tightest there.
    """

    def update(self, *, weight: NDArray[np.float64], reward: NDArray[np.float64]) -> None:
        """Add a batch: importance weights and rewards, each float64 ``(b,)``."""
        w, r = checked_weights(weight, reward, self.lower, self.upper)
        self._update(w * r, w * (1.0 - r))

    def interval(self) -> Interval:
        """The sequence at the current ``t``."""
        return self._interval(self.lower, self.upper, IntervalMethod.OFF_POLICY_BETTING_CS)


def checked_weights(
    weight: NDArray[np.float64], reward: NDArray[np.float64], lo: float, hi: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Weights (finite, >= 0, one per reward) and rewards rescaled to [0, 1]."""
    w = finite("weight", weight)
    r = _scaled("reward", reward, lo, hi)
    if len(w) != len(r):
        raise InvalidInput("weight", f"must have one entry per reward ({len(r)}), got {len(w)}")
    if (w < 0).any():
        t = int(np.flatnonzero(w < 0)[0])
        raise InvalidInput("weight", f"must be >= 0, got {w[t]} at round {t}")
    return w, r


def difference_pseudo_outcomes(
    w: NDArray[np.float64], r: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``phi_lo = (w r + 1 - r) / 2`` and ``phi_hi = (w (1 - r) + r) / 2``, both >= 0.

    With ``E[w | x] = 1`` (correct propensities, full support) their means are
    ``(1 + D) / 2`` and ``(1 - D) / 2`` for ``D = V_target - V_logging``, the
    target's value minus the logging policy's on the same rounds (rewards in
    [0, 1]); any leading axes.
    """
    lo: NDArray[np.float64] = (w * r + 1.0 - r) / 2.0
    hi: NDArray[np.float64] = (w * (1.0 - r) + r) / 2.0
    return lo, hi


class PairedOffPolicyBettingCS(_TwoSidedBet):
    """Betting confidence sequence for a target's value minus the logging policy's.

    The paired comparison behind a verdict ("better than production"): on the
    same logged rounds, ``D = E[w r] - E[r]``. `difference_pseudo_outcomes`
    turns it into two nonnegative means, each bet on as in
    `OffPolicyBettingCS` (Waudby-Smith, Wu, Ramdas, Karampatziakis & Mineiro
    2022, section 3), so no bound on the weights is needed: it keeps its
    coverage however heavy the weight tail. Bounds: ``D = 2 L_lo - 1`` and
    ``D = 1 - 2 L_hi``, times ``upper - lower``. Assumptions as
    `OffPolicyBettingCS`; `n_planned` tunes the bets for one sample size.
    """

    def update(self, *, weight: NDArray[np.float64], reward: NDArray[np.float64]) -> None:
        """Add a batch: importance weights and the logged rewards, each float64 ``(b,)``."""
        w, r = checked_weights(weight, reward, self.lower, self.upper)
        self._update(*difference_pseudo_outcomes(w, r))

    def interval(self) -> Interval:
        """The sequence at the current ``t``, in reward units."""
        span = self.upper - self.lower
        a, b = self._lo.lower(), self._hi.lower()
        return Interval(
            (2 * a - 1) * span,
            (1 - 2 * b) * span,
            1 - self.alpha,
            IntervalMethod.OFF_POLICY_BETTING_CS,
            self.n,
        )
