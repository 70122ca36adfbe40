"""What the OPE core returns: estimates with intervals and diagnostics, or a refusal.

Every estimate carries an interval, its sample size and its diagnostics
(ARCHITECTURE.md, non-negotiable 6). Where the data cannot identify the
target's value, the answer is a `NotIdentifiable` with the reason, never a
number::

    Result = Estimate | NotIdentifiable

    Estimate          value, Interval, n, Diagnostics, basis, caveats, contributions
    NotIdentifiable   reason, Diagnostics
    Interval          lower, upper, level, method, n
    Diagnostics       ESS, weights, support, propensity screening
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray


class Estimator(StrEnum):
    """The estimators of `service.ope.estimators`."""

    DM = "dm"
    IPS = "ips"
    SNIPS = "snips"
    DR = "dr"
    SNDR = "sndr"
    SWITCH_DR = "switch-dr"

    @property
    def additive(self) -> bool:
        """Whether the estimate is a plain mean of per-round terms (not self-normalised)."""
        return self not in (Estimator.SNIPS, Estimator.SNDR)

    @property
    def needs_model(self) -> bool:
        """Whether the estimator reads a reward model (`estimated_rewards`)."""
        return self in (Estimator.DM, Estimator.DR, Estimator.SNDR, Estimator.SWITCH_DR)

    @property
    def needs_propensities(self) -> bool:
        """DM is model-based; every other estimator weights by logged propensities."""
        return self is not Estimator.DM


class Basis(StrEnum):
    """Where the number comes from; a reader must be able to tell them apart."""

    MODEL_BASED = "model-based"
    """Only the reward model (DM): no logged reward corrects it; support is not needed."""
    IMPORTANCE_WEIGHTED = "importance-weighted"
    """Logged rewards reweighted by the logging propensities (IPS, SNIPS)."""
    DOUBLY_ROBUST = "doubly-robust"
    """Reward model plus importance-weighted residuals (DR, SNDR, switch-DR)."""


class IntervalMethod(StrEnum):
    """How an `Interval` was computed."""

    NORMAL = "normal"
    BOOTSTRAP = "bootstrap-percentile"
    ASYMPTOTIC_CS = "asymptotic-cs"
    BETTING_CS = "betting-cs"
    OFF_POLICY_BETTING_CS = "off-policy-betting-cs"
    PROPORTION_CS = "proportion-cs"
    CLOPPER_PEARSON = "clopper-pearson"
    STUDENT_T = "student-t"
    """Student's t over independent replications (seeds), `service.learning.stats.over_seeds`."""

    @property
    def anytime_valid(self) -> bool:
        """Whether the interval may be checked after every batch (a confidence sequence)."""
        return self in (
            IntervalMethod.ASYMPTOTIC_CS,
            IntervalMethod.BETTING_CS,
            IntervalMethod.OFF_POLICY_BETTING_CS,
            IntervalMethod.PROPORTION_CS,
        )


@dataclass(frozen=True, slots=True)
class Interval:
    """A two-sided interval at nominal `level` (a confidence sequence's value at `n`).

    Attributes:
        lower, upper: the bounds; infinite when the data cannot bound the mean yet.
        level: nominal coverage, e.g. 0.95.
        method: how it was computed (`IntervalMethod.anytime_valid` tells whether
            it may be monitored continuously).
        n: the sample size it was computed from.
    """

    lower: float
    upper: float
    level: float
    method: IntervalMethod
    n: int

    @property
    def width(self) -> float:
        """``upper - lower``."""
        return self.upper - self.lower

    def contains(self, value: float) -> bool:
        """Whether ``lower <= value <= upper``."""
        return self.lower <= value <= self.upper

    @property
    def sign(self) -> int:
        """+1 if the interval lies above 0, -1 if below, 0 if it straddles 0 or is unbounded.

        The sign of a difference's interval is a comparison's verdict (wins / loses /
        no difference), so it lives with the interval rather than with each caller.
        """
        if self.lower > 0:
            return 1
        if self.upper < 0:
            return -1
        return 0

    def intersect(self, other: Interval) -> Interval:
        """The running intersection of two bounds of one sequence (still anytime-valid)."""
        return Interval(
            max(self.lower, other.lower),
            min(self.upper, other.upper),
            self.level,
            self.method,
            max(self.n, other.n),
        )

    @staticmethod
    def unbounded(level: float, method: IntervalMethod, n: int) -> Interval:
        """``(-inf, inf)``: too little data to say anything."""
        return Interval(-math.inf, math.inf, level, method, n)


@dataclass(frozen=True, slots=True)
class Diagnostics:
    """How far the logged data can be trusted for one target; see `service.ope.diagnostics`.

    With ``w_t = pi(a_t|x_t) / pscore_t``:

    Attributes:
        n: rounds used.
        ess: Kish effective sample size ``(sum w)^2 / sum w^2`` (0 when every w is 0).
        ess_share: ``ess / n``.
        mean_weight: ``mean(w)``; about ``1 - unsupported_share`` when propensities are right.
        max_weight: ``max(w)``.
        tail_threshold: the weight above which a round counts as tail.
        tail_weight_share: share of ``sum w`` carried by rounds with ``w > tail_threshold``.
        zero_target_share: share of logged actions the target gives probability 0.
        unsupported_share: mean over rounds of the target's probability on actions
            the logging policy never takes there (see `service.ope.diagnostics`).
        unsupported_rounds: rounds where that probability is > 0.
        deterministic_share: share of rounds with a real choice (two or more feasible
            actions, or all rounds when the feasible set is unknown) whose logged
            propensity is 1.
        support_known: True when the logging distribution is known at every round
            (support checked exactly everywhere); False: at the other rounds it is
            checked only where the logged propensity is 1.
        support_rounds: rounds whose logging distribution is known (production
            logged its whole distribution there), support checked exactly.
        logged_infeasible: logged actions outside the per-decision feasible set.
        unusable_pscore: rounds dropped before estimation because their propensity
            was missing or invalid (`service.ope.data.screen_pscore`).
        reward_min, reward_max: the range of the logged outcome.
        khat: Pareto k-hat of the weight tail (`service.ope.tail`); NaN when
            fewer than 25 rounds or no weight exceeds the tail threshold.
        khat_limit: ``min(1 - 1/log10(n), 0.7)``, the k-hat above which ``n``
            rounds cannot be trusted (Vehtari et al. 2024).
        weight_mean_z: ``(mean(w) - E) / (sd(w) / sqrt(n))``, the test of E[w] = E: E is
            `expected_mean_weight` when support is known at every round, else 1.
        top_share: share of ``sum w`` on the 1% of rounds with the largest weights.
        expected_w2: with `logging_dist`, the exact ``mean_t E[w^2 | x_t] =
            mean_t sum_a pi(a|x_t)^2 / mu(a|x_t)`` over supported actions (what
            the sample's mean ``w^2`` estimates); NaN without it.
        max_possible_weight: with `logging_dist`, the largest weight any action
            of these contexts could get, ``max_{t,a} pi(a|x_t) / mu(a|x_t)``
            (seen or not); NaN without it.
        expected_mean_weight: over the rounds whose logging distribution is known,
            the exact ``mean_t E_mu[w | x_t] = mean_t sum_{a: mu(a|x_t) > 0} pi(a|x_t)``
            (``1 -`` their unsupported share); NaN when none is known.
    """

    n: int
    ess: float
    ess_share: float
    mean_weight: float
    max_weight: float
    tail_threshold: float
    tail_weight_share: float
    zero_target_share: float
    unsupported_share: float
    unsupported_rounds: int
    deterministic_share: float
    support_known: bool
    logged_infeasible: int
    unusable_pscore: int
    reward_min: float
    reward_max: float
    khat: float = math.nan
    khat_limit: float = 0.7
    weight_mean_z: float = math.nan
    top_share: float = 0.0
    expected_w2: float = math.nan
    max_possible_weight: float = math.nan
    support_rounds: int = 0
    expected_mean_weight: float = math.nan

    @property
    def mean_w2(self) -> float:
        """The sample's ``mean(w^2)`` (``ess = n mean(w)^2 / mean(w^2)``)."""
        return self.n * self.mean_weight**2 / self.ess if self.ess > 0 else 0.0

    @property
    def heavy_tail(self) -> bool:
        """k-hat >= 1/2: the weights' variance is infinite, so no variance-based
        interval (normal, percentile bootstrap) is a 95% interval (`service.ope.tail`)."""
        return self.khat >= 0.5

    @property
    def unreliable_tail(self) -> bool:
        """k-hat above `khat_limit`: the tail that decides the value was not seen at this n."""
        return self.khat > self.khat_limit

    @property
    def unusable_share(self) -> float:
        """Share of all logged rounds dropped for a missing or invalid propensity."""
        total = self.n + self.unusable_pscore
        return self.unusable_pscore / total if total else 0.0


@dataclass(frozen=True, eq=False)
class Estimate:
    """A policy value estimate with its interval and diagnostics.

    Attributes:
        estimator: which estimator.
        basis: model-based, importance-weighted or doubly robust.
        value: the estimate.
        interval: its interval (normal by default; see `service.ope.intervals`).
        n: rounds used.
        diagnostics: weights, ESS and support.
        caveats: plain-language limits a reader must see next to the number.
        contributions: float64 ``(n,)`` per-round terms whose mean is `value`
            (the influence-function linearisation for self-normalised
            estimators), kept so slices and intervals reuse them; None when the
            estimate came from streaming sufficient statistics.
    """

    estimator: Estimator
    basis: Basis
    value: float
    interval: Interval
    n: int
    diagnostics: Diagnostics
    caveats: tuple[str, ...] = ()
    contributions: NDArray[np.float64] | None = field(default=None, repr=False)

    @property
    def identifiable(self) -> bool:
        """Always True: a number was warranted."""
        return True


@dataclass(frozen=True, slots=True)
class NotIdentifiable:
    """The data cannot identify the target's value: no number, the reason instead.

    Attributes:
        estimator: the estimator that was asked.
        reason: why, in plain language (e.g. deterministic logging that differs
            from the target).
        diagnostics: the evidence behind the reason.
    """

    estimator: Estimator
    reason: str
    diagnostics: Diagnostics

    @property
    def identifiable(self) -> bool:
        """Always False."""
        return False


Result = Estimate | NotIdentifiable
"""What every estimator returns."""
