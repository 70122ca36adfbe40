"""Overlap diagnostics: effective sample size, weight tail, support, and identifiability.

With importance weights ``w_t = pi(a_t|x_t) / mu(a_t|x_t)`` (``mu`` = logging):

- **ESS** (Kish 1965): ``(sum_t w_t)^2 / sum_t w_t^2``; how many on-policy rounds
  the weighted sample is worth. Owen (2013), "Monte Carlo theory, methods and
  examples", ch. 9.
- **Weight tail**: ``max w`` and the share of ``sum w`` carried by rounds with
  ``w > tail_threshold``.
- **Support** (positivity): importance weighting is unbiased only if
  ``mu(a|x) > 0`` wherever ``pi(a|x) > 0``. Per round, the unsupported target
  mass is

      u_t = sum_a pi(a|x_t) 1[mu(a|x_t) = 0]            (with `logging_dist`)
      u_t = (1 - pi(a_t|x_t)) 1[mu(a_t|x_t) = 1]        (without: a logged
                                                          propensity of 1 means
                                                          no other action is logged)

  The first form is used at every round whose logging distribution is known
  (production sent its whole distribution: ``ProductionDecision.probabilities``)
  and the second elsewhere, round by round; `Diagnostics.support_rounds` says
  how many were checked exactly. Where it is known, ``E_mu[w | x_t] =
  sum_{a: mu(a|x_t) > 0} pi(a|x_t) = 1 - u_t`` exactly, so the test of the mean
  weight compares ``mean(w)`` with ``mean_t (1 - u_t)``
  (`Diagnostics.expected_mean_weight`) instead of 1 when every round is known.

  Feasibility enters through the per-decision feasible set: the target may
  not use an infeasible action (validated), so a decision with one feasible
  action is always supported, and "deterministic logging" is counted only
  over decisions with a real choice. When ``mean(u) > tolerance`` the value is
  **not identifiable** from the weights (Rosenbaum & Rubin 1983; for bandits,
  Sachdeva, Su & Joachims 2020, "Off-policy bandits with deficient support"):
  the estimators return `NotIdentifiable` with the reason, never a number.

The weight tail's shape (Pareto k-hat, the test of E[w] = 1, the top-1%
share) is in `service.ope.tail`; its sketch merges like the sums.

Everything here is a sum over rounds (`DiagnosticSums`), so streaming and
batch diagnostics agree exactly up to float rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from service.ope.data import BanditData
from service.ope.results import Basis, Diagnostics
from service.ope.tail import TailSketch, khat_limit, weight_mean_z

TAIL_THRESHOLD = 10.0
"""Default: a round whose action the logging policy took 10x less often than the target would."""

MIN_ESS = 30.0
"""Below this effective sample size the normal interval gets a caveat."""

MEAN_WEIGHT_Z = 3.29
"""|z| of the E[w] = 1 test reported: two-sided 0.1%, so that across many (policy,
slice) rows a correct log rarely raises it by chance."""

MEAN_WEIGHT_TOLERANCE = 0.1
"""A mean weight this far from 1 is reported even when its z is small."""

_DETERMINISTIC = 1.0 - 1e-12


def unsupported_mass(data: BanditData) -> NDArray[np.float64]:
    """``u_t``, the target's probability on actions never logged at round t, shape ``(n,)``:
    exact where the logging distribution is known, from the logged propensity elsewhere."""
    estimate = np.where(data.pscore >= _DETERMINISTIC, 1.0 - data.target_pscore, 0.0)
    if data.logging_dist is None:
        return estimate
    # NaN rows (not known) compare False: their exact term is replaced by the estimate
    exact = (data.action_dist * (data.logging_dist <= 0)).sum(axis=1)
    out: NDArray[np.float64] = np.where(data.logging_known, exact, estimate)
    return out


@dataclass(frozen=True, slots=True)
class DiagnosticSums:
    """Additive sufficient statistics of `Diagnostics` (see the module docstring)."""

    n: int = 0
    sum_w: float = 0.0
    sum_w2: float = 0.0
    max_w: float = 0.0
    tail_w: float = 0.0
    zero_target: int = 0
    unsupported: float = 0.0
    unsupported_rounds: int = 0
    choice_rounds: int = 0
    deterministic: int = 0
    logged_infeasible: int = 0
    unusable_pscore: int = 0
    support_rounds: int = 0
    known_unsupported: float = 0.0
    tail_threshold: float = TAIL_THRESHOLD
    reward_min: float = math.inf
    reward_max: float = -math.inf
    tail: TailSketch = field(default_factory=TailSketch)
    expected_w2: float = 0.0
    max_possible_w: float = 0.0

    @staticmethod
    def of(data: BanditData, tail_threshold: float = TAIL_THRESHOLD) -> DiagnosticSums:
        """The sums over `data`'s rounds."""
        w = data.weight
        u = unsupported_mass(data)
        rows = np.arange(data.n)
        if data.feasible is not None:
            choice = data.feasible.sum(axis=1) >= 2
            infeasible = int((~data.feasible[rows, data.action]).sum())
        else:
            choice = np.ones(data.n, dtype=bool)
            infeasible = 0
        expected_w2, max_possible = 0.0, 0.0
        known = data.logging_known
        if known.any():
            mu = data.logging_dist[known]  # type: ignore[index]  # known: not None
            pi = data.action_dist[known]
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(mu > 0, pi / mu, 0.0)
            expected_w2 = float((ratio * pi).sum())
            max_possible = float(ratio.max())
        return DiagnosticSums(
            n=data.n,
            sum_w=float(w.sum()),
            sum_w2=float((w * w).sum()),
            max_w=float(w.max()),
            tail_w=float(w[w > tail_threshold].sum()),
            zero_target=int((data.target_pscore == 0).sum()),
            unsupported=float(u.sum()),
            unsupported_rounds=int((u > 0).sum()),
            choice_rounds=int(choice.sum()),
            deterministic=int((choice & (data.pscore >= _DETERMINISTIC)).sum()),
            logged_infeasible=infeasible,
            unusable_pscore=data.unusable_pscore,
            support_rounds=int(known.sum()),
            known_unsupported=float(u[known].sum()),
            tail_threshold=tail_threshold,
            reward_min=float(data.reward.min()),
            reward_max=float(data.reward.max()),
            tail=TailSketch.of(w),
            expected_w2=expected_w2,
            max_possible_w=max_possible,
        )

    def merge(self, other: DiagnosticSums) -> DiagnosticSums:
        """The sums over both sets of rounds."""
        return DiagnosticSums(
            n=self.n + other.n,
            sum_w=self.sum_w + other.sum_w,
            sum_w2=self.sum_w2 + other.sum_w2,
            max_w=max(self.max_w, other.max_w),
            tail_w=self.tail_w + other.tail_w,
            zero_target=self.zero_target + other.zero_target,
            unsupported=self.unsupported + other.unsupported,
            unsupported_rounds=self.unsupported_rounds + other.unsupported_rounds,
            choice_rounds=self.choice_rounds + other.choice_rounds,
            deterministic=self.deterministic + other.deterministic,
            logged_infeasible=self.logged_infeasible + other.logged_infeasible,
            unusable_pscore=self.unusable_pscore + other.unusable_pscore,
            support_rounds=self.support_rounds + other.support_rounds,
            known_unsupported=self.known_unsupported + other.known_unsupported,
            tail_threshold=self.tail_threshold,
            reward_min=min(self.reward_min, other.reward_min),
            reward_max=max(self.reward_max, other.reward_max),
            tail=self.tail.merge(other.tail),
            expected_w2=self.expected_w2 + other.expected_w2,
            max_possible_w=max(self.max_possible_w, other.max_possible_w),
        )

    @property
    def support_known(self) -> bool:
        """Whether support was checked exactly at every round (True with no rounds)."""
        return self.support_rounds == self.n

    def finish(self) -> Diagnostics:
        """The `Diagnostics` these sums describe."""
        n = max(self.n, 1)
        ess = self.sum_w**2 / self.sum_w2 if self.sum_w2 > 0 else 0.0
        # E[w] the sample mean should match: exact (1 - mean u) when every round's
        # logging distribution is known, else 1 (the test as without it)
        expected_w = 1.0 - self.unsupported / n if self.support_known and self.n else 1.0
        return Diagnostics(
            n=self.n,
            ess=ess,
            ess_share=ess / n,
            mean_weight=self.sum_w / n,
            max_weight=self.max_w,
            tail_threshold=self.tail_threshold,
            tail_weight_share=self.tail_w / self.sum_w if self.sum_w > 0 else 0.0,
            zero_target_share=self.zero_target / n,
            unsupported_share=self.unsupported / n,
            unsupported_rounds=self.unsupported_rounds,
            deterministic_share=self.deterministic / self.choice_rounds
            if self.choice_rounds
            else 0.0,
            support_known=self.support_known,
            support_rounds=self.support_rounds,
            logged_infeasible=self.logged_infeasible,
            unusable_pscore=self.unusable_pscore,
            reward_min=self.reward_min,
            reward_max=self.reward_max,
            khat=self.tail.khat(),
            khat_limit=khat_limit(self.n),
            weight_mean_z=weight_mean_z(self.n, self.sum_w, self.sum_w2, expected_w),
            top_share=self.tail.top_share(),
            expected_w2=self.expected_w2 / n if self.support_known else math.nan,
            max_possible_weight=self.max_possible_w if self.support_known else math.nan,
            expected_mean_weight=1.0 - self.known_unsupported / self.support_rounds
            if self.support_rounds
            else math.nan,
        )


def diagnostics(data: BanditData, tail_threshold: float = TAIL_THRESHOLD) -> Diagnostics:
    """Overlap diagnostics of `data`'s target against its logging policy."""
    return DiagnosticSums.of(data, tail_threshold).finish()


def identification_failure(d: Diagnostics, support_tolerance: float = 0.0) -> str | None:
    """Why the logged rewards cannot identify the target's value, or None when they can.

    Args:
        d: the diagnostics.
        support_tolerance: the unsupported target mass (mean of ``u_t``) accepted
            as negligible; 0 by default, since any unsupported mass biases every
            importance-weighted estimator by up to that share of the reward range.
    """
    if d.unsupported_share > support_tolerance:
        reason = (
            f"no overlap: the target puts {d.unsupported_share:.1%} of its probability on "
            f"actions the logging policy never takes ({d.unsupported_rounds} of {d.n} "
            "decisions), so no logged reward speaks for them"
        )
        if d.deterministic_share > 0:
            reason += (
                f"; the logging policy is deterministic in {d.deterministic_share:.0%} of "
                "the decisions that had a choice"
            )
        return reason
    if d.ess == 0:
        return (
            "no logged action has positive target probability (effective sample size 0): "
            "the logged rewards say nothing about the target"
        )
    return None


def caveats(d: Diagnostics, basis: Basis, value: float, half_width: float) -> tuple[str, ...]:
    """Plain-language limits to print next to an estimate's number.

    Args:
        d: the diagnostics.
        basis: the estimate's basis.
        value: the estimate.
        half_width: half the width of its normal interval; within two of these
            of the logged outcome's range, a normal interval is a Wald interval
            near a bound, which under-covers (e.g. a success rate near 1 with
            few failures among the weighted rounds).
    """
    out = []
    if basis is Basis.MODEL_BASED:
        out.append(
            "model-based: the value comes only from the reward model; its interval covers "
            "the sampling of contexts, not the model's error"
        )
        if d.unsupported_share > 0:
            out.append(
                f"the target takes actions the logging policy never took "
                f"({d.unsupported_share:.1%} of its probability): only the model speaks for them"
            )
    else:
        if d.ess < MIN_ESS:
            out.append(
                f"effective sample size {d.ess:.1f} is small: the normal interval may under-cover"
            )
        if d.tail_weight_share > 0.5:
            out.append(
                f"rounds with weight > {d.tail_threshold:g} carry {d.tail_weight_share:.0%} of "
                "the weight: the estimate rests on few rounds"
            )
        out += weight_caveats(d)
        near = min(d.reward_max - value, value - d.reward_min)
        if d.reward_max == d.reward_min:
            out.append(
                f"every logged outcome equals {d.reward_min:g}: the interval reflects no "
                "outcome variability; for bounded rewards prefer a betting sequence"
            )
        elif math.isfinite(half_width) and near < 2 * half_width:
            out.append(
                "the value is near the edge of the logged outcomes' range "
                f"[{d.reward_min:g}, {d.reward_max:g}]: the normal interval may under-cover; "
                "for bounded rewards prefer a betting sequence"
            )
        if not d.support_known and d.support_rounds:
            out.append(
                f"support checked exactly on the {d.support_rounds} of {d.n} rounds whose "
                "logging distribution is known; elsewhere only where the logged propensity is 1"
            )
        elif not d.support_known:
            out.append(
                "support checked only where the logged propensity is 1 "
                "(no full logging distribution given)"
            )
    if d.unusable_pscore:
        out.append(
            f"{d.unusable_pscore} rounds ({d.unusable_share:.1%}) dropped for a missing or "
            "invalid propensity; assumed missing at random"
        )
    return tuple(out)


def weight_caveats(d: Diagnostics) -> list[str]:
    """The weight tail and the E[w] = 1 test, each with the explanation the log allows.

    Three causes make the mean weight miss 1 and are told apart here:

    - an **unseen tail** (k-hat >= 1/2): the target favours actions production
      rarely takes; most such rounds are not in the sample, so ``mean(w)`` is
      low and its z (which assumes a light tail) is large, with correct
      propensities and full support. With `logging_dist` the exact
      ``E[w^2 | x]`` shows how much of the tail the sample missed;
    - **missing support**: the target puts mass where production never acts
      (with `logging_dist` that is refused as not identifiable before this);
    - **wrong propensities**: with a light tail the z is trustworthy; with
      `logging_dist` and full support only the propensities remain (and a
      logged propensity that disagrees with the logged distribution says so
      directly); without it support and propensities cannot be told apart.
    """
    out: list[str] = []
    expected = d.expected_mean_weight if d.support_known and d.n else 1.0
    if d.heavy_tail:
        text = (
            f"Pareto k-hat {d.khat:.2f} of the importance-weight tail is >= 0.5 (Vehtari et "
            "al., PSIS): the weights' variance is infinite, so the normal interval is not a "
            "valid interval at its nominal level; the top 1% of rounds carry "
            f"{d.top_share:.0%} of the weight"
        )
        if d.unreliable_tail:
            text += (
                f"; k-hat is above {d.khat_limit:.2f} = min(1 - 1/log10(n), 0.7), so the "
                f"part of the tail that decides the value was not seen in {d.n} rounds"
            )
        out.append(text)
    off = (
        abs(d.mean_weight - expected) > MEAN_WEIGHT_TOLERANCE
        or abs(d.weight_mean_z) > MEAN_WEIGHT_Z
    )
    if off and d.heavy_tail:
        text = (
            f"the mean importance weight is {d.mean_weight:.2f} (z {d.weight_mean_z:.1f} for "
            "E[w] = 1): an unseen tail of production's low-propensity actions — the target "
            "favours actions production rarely takes and most such rounds are not in this "
            "sample; the z assumes a light tail, so this is not evidence of wrong propensities"
        )
        if math.isfinite(d.expected_w2):
            text += (
                f"; the exact E[w^2] on these contexts is {d.expected_w2:.3g}, the sample's "
                f"mean w^2 {d.mean_w2:.3g}"
            )
        out.append(text)
    elif off and d.support_known:
        out.append(
            f"the mean importance weight is {d.mean_weight:.2f} (z {d.weight_mean_z:.1f} for "
            "E[w] = 1) with a light tail and full support in the logged distributions: "
            "production's logged propensities do not match the actions it took (wrong "
            "propensities); every importance-weighted number here is biased"
        )
    elif off and d.mean_weight > 1.0:
        out.append(
            f"the mean importance weight is {d.mean_weight:.2f} (z {d.weight_mean_z:.1f} for "
            "E[w] = 1) with a light tail: above 1, which missing support cannot cause, so "
            "the logged propensities are wrong (too small for the actions production took)"
        )
    elif off:
        out.append(
            f"the mean importance weight is {d.mean_weight:.2f} (z {d.weight_mean_z:.1f} for "
            "E[w] = 1) with a light tail: either the target puts mass on actions production "
            "never takes (missing support) or the logged propensities are wrong; without "
            "the full logging distribution the two cannot be told apart"
        )
    return out
