"""Calibration of quantile predictors against observed outcomes, and a window flag rule.

A predictor logs, per decision, quantiles ``q`` of an outcome at levels
``taus`` (the shipped ones: throughput at 0.1 / 0.5 / 0.9,
``service.policies.predictor``). Here, for outcomes ``y`` joined later:

- **PIT** (probability integral transform, Dawid 1984; Gneiting, Balabdaoui &
  Raftery, JRSS-B 2007): ``u = F(y)`` with ``F`` the predictive CDF. Only the
  logged quantiles are known, so ``F`` is the *knot CDF*: in ``z = Phi^-1(tau)``
  space it is piecewise linear in ``log y`` (``log_scale``) between the logged
  quantiles, and extended beyond the outermost ones with the slope of the end
  segment. With three quantiles that is a split log-normal. ``F(q_tau) = tau``
  exactly at every logged level, so statements at logged levels are
  assumption-free; anything between them depends on the knot shape.
- **Coverage** of the central ``c`` interval: ``(1-c)/2 <= u <= (1+c)/2``,
  with an exact (Clopper–Pearson) interval and an exact two-sided binomial
  p-value from `scipy.stats.binomtest`. `Coverage.exact` says whether both
  ends are logged quantiles (80% for the shipped predictors) or implied by the
  knot shape (50%, 90%).
- **PIT histogram** with a chi-square test of uniformity over its bins.
- **Reliability**: rows binned by the predicted median (equal-count bins);
  per bin the predicted and observed median, mean log error and coverage.

**Flag rule** (`flag_window`). A window is flagged when Holm's step-down
procedure (Holm, Scand. J. Statist. 1979) at family level `alpha` rejects any
of these exact binomial tests, all of statements the predictor itself made:

- for every logged level ``tau``: H0 ``P(Y <= q_tau) = tau``;
- for every reported central level whose ends are both logged: H0 coverage = ``c``.

Why this rule: if the predictor is calibrated at its logged quantiles, every
H0 holds and Holm keeps the probability of any rejection — a false flag —
at most `alpha` whatever the dependence between the tests (they share the
rows), with no distributional assumption beyond independent rows. Implied
levels are left out by default: they test the knot shape, not the predictor
(the shipped predictor's implied 50% interval covers ~62% on its training
condition: its predictive distribution is more peaked than a split
log-normal), so including them would flag a predictor that is calibrated at
every level it states. Power: shrinking or shifting the interval moves
``P(Y <= q_tau)`` at the tails or the median by far more than the binomial
noise at window sizes of ~100 (docs/calibration.md has the measured rates).
Rows are not independent: outcomes of one busy period share cluster state,
and on the training condition the counts vary ~3x more than binomially
(with independent-row tests, 12% of calibrated windows were flagged at
``alpha = 0.01``). Each test therefore uses Kish's effective sample size
``n / design_effect`` with the design effect measured on the training
condition (`DESIGN_EFFECT`); the false-flag rate is controlled under that
measured dependence, not under any dependence.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from service.checks.calibration_stats import (
    _TOL,
    LEVELS,
    Coverage,
    PitHistogram,
    _check,
    coverage,
    holm,
    pit,
    pit_histogram,
)
from service.contract import InvalidInput

FLAG_ALPHA = 0.01
"""Family-wise false-flag rate of `flag_window` on a calibrated predictor."""
MIN_OUTCOMES = 20
"""Fewest outcomes a window needs before it can be flagged."""
DESIGN_EFFECT = 3.0
"""Variance of a window's counts over the binomial's on the training condition (Kish's
design effect): outcomes of one busy period share cluster state, so ~3 rows carry one
row's information. Measured for the shipped predictor: 2.4-3.3 at q10, 2.1-2.9 at q50,
1.2-1.5 at q90 and the 80% coverage (docs/calibration.md); the largest is used."""


@dataclass(frozen=True, slots=True)
class FlagTest:
    """One hypothesis of the flag rule and its Holm decision.

    Attributes:
        name: e.g. ``"P(Y <= q0.1)"`` or ``"coverage 0.8"``.
        expected, observed: the H0 proportion and the window's.
        p_value: exact two-sided binomial p-value.
        rejected: whether Holm rejects it at the family level.
    """

    name: str
    expected: float
    observed: float
    p_value: float
    rejected: bool


@dataclass(frozen=True, slots=True)
class WindowFlag:
    """The flag rule on one window (module docstring).

    Attributes:
        flagged: any test rejected, with at least `min_outcomes` outcomes.
        n: outcomes in the window.
        alpha: family-wise level.
        tests: every test, in the order they were formed.
        reason: one sentence: why flagged, why not testable, or "calibrated".
    """

    flagged: bool
    n: int
    alpha: float
    tests: tuple[FlagTest, ...]
    reason: str


@dataclass(frozen=True, eq=False)
class Reliability:
    """Error by predicted value: rows in equal-count bins of the predicted median.

    Arrays have shape ``(B,)``: `n` rows, `predicted` median of the predicted
    medians, `observed` median outcome, `log_error` mean of ``log y - log q50``
    (``y - q50`` when not on the log scale), `below` share of ``y <= q50``
    (0.5 if calibrated), `coverage` share inside the widest logged interval.
    """

    n: NDArray[np.int64]
    predicted: NDArray[np.float64]
    observed: NDArray[np.float64]
    log_error: NDArray[np.float64]
    below: NDArray[np.float64]
    coverage: NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class CalibrationReport:
    """Everything measured on one set of rows (a policy, a slice or a window)."""

    n: int
    coverage: tuple[Coverage, ...]
    pit: PitHistogram
    reliability: Reliability
    flag: WindowFlag


def flag_window(
    u: NDArray[np.float64],
    taus: Sequence[float],
    levels: Sequence[float] = LEVELS,
    *,
    alpha: float = FLAG_ALPHA,
    min_outcomes: int = MIN_OUTCOMES,
    design_effect: float = DESIGN_EFFECT,
    test_implied: bool = False,
) -> WindowFlag:
    """The flag rule (module docstring) on PIT values `u` of one window.

    Each test is the exact binomial test on the effective counts ``k / d`` of
    ``n / d`` rows (rounded), ``d`` = `design_effect` (1 = independent rows).
    `test_implied` adds the coverage levels whose ends are not logged (they
    test the knot shape as well as the predictor).
    """
    if design_effect < 1:
        raise InvalidInput("design_effect", f"must be >= 1, got {design_effect}")
    if not 0 < alpha < 1:
        raise InvalidInput("alpha", f"must be in (0, 1), got {alpha}")
    n = len(u)
    if n < max(min_outcomes, 1):
        return WindowFlag(False, n, alpha, (), f"too few outcomes to test ({n} < {min_outcomes})")
    hypotheses: list[tuple[str, float, int]] = []
    for tau in taus:
        hypotheses.append((f"P(Y <= q{tau:g})", float(tau), int(np.sum(u <= tau + _TOL))))
    for c in levels:
        cov = coverage(u, c, taus)
        if cov.exact or test_implied:
            hypotheses.append((f"coverage {c:g}", float(c), cov.covered))
    n_eff = max(round(n / design_effect), 1)
    p = [
        float(stats.binomtest(min(round(k / design_effect), n_eff), n_eff, e).pvalue)
        for _, e, k in hypotheses
    ]
    rejected = holm(p, alpha)
    tests = tuple(
        FlagTest(name, e, k / n, pv, bool(r))
        for (name, e, k), pv, r in zip(hypotheses, p, rejected, strict=True)
    )
    bad = [t for t in tests if t.rejected]
    if not bad:
        return WindowFlag(False, n, alpha, tests, "calibrated at every tested level")
    worst = min(bad, key=lambda t: t.p_value)
    reason = (
        f"{worst.name} is {worst.observed:.3f}, expected {worst.expected:g} "
        f"(p = {worst.p_value:.2g}, Holm at {alpha:g}, n = {n}, design effect {design_effect:g})"
    )
    return WindowFlag(True, n, alpha, tests, reason)


def reliability(
    taus: Sequence[float],
    quantiles: NDArray[np.float64],
    outcome: NDArray[np.float64],
    *,
    bins: int = 10,
    log_scale: bool = True,
) -> Reliability:
    """Error by predicted value in up to `bins` equal-count bins of the predicted median."""
    q = np.sort(np.asarray(quantiles, dtype=np.float64), axis=1)
    y = np.asarray(outcome, dtype=np.float64)
    _check(taus, q, y)
    t = np.asarray(taus)
    mid = int(np.argmin(np.abs(t - 0.5)))
    median = q[:, mid]
    order = np.argsort(median, kind="stable")
    groups = [g for g in np.array_split(order, min(bins, len(y))) if len(g)] if len(y) else []
    err = (np.log(y) - np.log(median)) if log_scale else (y - median)
    inside = (y >= q[:, 0]) & (y <= q[:, -1])

    def per(f: Callable[[NDArray[np.intp]], object]) -> NDArray[np.float64]:
        return np.array([f(g) for g in groups], dtype=np.float64)

    return Reliability(
        n=np.array([len(g) for g in groups], dtype=np.int64),
        predicted=per(lambda g: np.median(median[g])),
        observed=per(lambda g: np.median(y[g])),
        log_error=per(lambda g: err[g].mean()),
        below=per(lambda g: (y[g] <= median[g]).mean()),
        coverage=per(lambda g: inside[g].mean()),
    )


def calibrate(
    taus: Sequence[float],
    quantiles: NDArray[np.float64],
    outcome: NDArray[np.float64],
    *,
    levels: Sequence[float] = LEVELS,
    log_scale: bool = True,
    bins: int = 10,
    alpha: float = FLAG_ALPHA,
    min_outcomes: int = MIN_OUTCOMES,
    design_effect: float = DESIGN_EFFECT,
    confidence: float = 0.95,
) -> CalibrationReport:
    """Coverage, PIT histogram, reliability and the flag rule on one set of rows."""
    u = pit(taus, quantiles, outcome, log_scale=log_scale)
    return CalibrationReport(
        n=len(u),
        coverage=tuple(coverage(u, c, taus, confidence) for c in levels),
        pit=pit_histogram(u, bins),
        reliability=reliability(taus, quantiles, outcome, bins=bins, log_scale=log_scale),
        flag=flag_window(
            u, taus, levels, alpha=alpha, min_outcomes=min_outcomes, design_effect=design_effect
        ),
    )


def by_slice(
    keys: NDArray[np.generic] | Sequence[Hashable],
    taus: Sequence[float],
    quantiles: NDArray[np.float64],
    outcome: NDArray[np.float64],
    *,
    log_scale: bool = True,
    alpha: float = FLAG_ALPHA,
    min_outcomes: int = MIN_OUTCOMES,
    design_effect: float = DESIGN_EFFECT,
) -> dict[Hashable, CalibrationReport]:
    """`calibrate` per distinct value of `keys` ``(n,)`` — workload kind, hardware class,
    tenant, time window, scenario: a slice is just a grouping key per row.
    """
    k = np.asarray(keys)
    if k.shape != (len(outcome),):
        raise InvalidInput("keys", f"must have shape ({len(outcome)},), got {k.shape}")
    q = np.asarray(quantiles, dtype=np.float64)
    y = np.asarray(outcome, dtype=np.float64)
    out: dict[Hashable, CalibrationReport] = {}
    for value in sorted(set(k.tolist()), key=str):
        rows = k == value
        out[value] = calibrate(
            taus,
            q[rows],
            y[rows],
            log_scale=log_scale,
            alpha=alpha,
            min_outcomes=min_outcomes,
            design_effect=design_effect,
        )
    return out


__all__ = [
    "DESIGN_EFFECT",
    "FLAG_ALPHA",
    "LEVELS",
    "MIN_OUTCOMES",
    "CalibrationReport",
    "Coverage",
    "FlagTest",
    "PitHistogram",
    "Reliability",
    "WindowFlag",
    "by_slice",
    "calibrate",
    "coverage",
    "flag_window",
    "holm",
    "pit",
    "pit_histogram",
    "reliability",
]
