"""`understudy ope`'s engine: every logged policy estimated on the decision log, with a verdict.

For each policy version in the log, on the rounds it can be judged on
(``service.evaluation_report.arrays``):

- IPS, SNIPS and DR estimates (``service.ope.estimate``, normal intervals);
  DR's reward model is a constant, cross-fitted on two folds (each fold's
  rounds get the mean reward of the other fold): no features are decoded, so
  it only lowers variance, and a caveat says so;
- the paired difference to production (the primary estimator's per-round
  contributions minus production's observed reward on the same rounds) with a
  normal interval, from which the verdict follows;
- the primary estimate per workload kind (``estimate_by_slice``).

Production's own value is its observed mean reward (on-policy, normal interval).
Every number carries a `Provenance`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray

from service.evaluation_report.arrays import (
    Dropped,
    PolicyRounds,
    Reward,
    policy_rounds,
    production_rounds,
)
from service.ope import (
    BanditData,
    Estimate,
    Estimator,
    Interval,
    NotIdentifiable,
    Result,
    estimate,
    estimate_by_slice,
    normal_interval,
)
from service.storage.ope_reads import OpeLog

DEFAULT_ESTIMATORS = (Estimator.IPS, Estimator.SNIPS, Estimator.DR)
NOT_TARGETS = frozenset({"production-mirror"})
"""Logged policies that are not OPE targets: ``production-mirror`` is one-hot on the
logged action itself, so its "distribution" depends on the outcome of production's draw
(its weights are ``1 / pscore``) and no off-policy estimate of it means anything;
production's value is reported on-policy instead."""
CONSTANT_MODEL_CAVEAT = (
    "the DR reward model is a constant (cross-fitted mean reward): it lowers variance "
    "but corrects no bias"
)


class Provenance(StrEnum):
    """Where a number comes from; every reported number carries one."""

    SIMULATED = "simulated"
    """Traffic and outcomes came from the simulator (e.g. the log `make demo` leaves)."""
    SHADOW_LOGGED = "shadow-logged (off-policy)"
    """Production's real traffic, the candidate never acted: off-policy estimates."""
    ONLINE_BOUNDED = "online-bounded"
    """A bound from an online protocol in which the candidate acted."""


class Traffic(StrEnum):
    """What produced the logged traffic."""

    PRODUCTION = "production"
    SIMULATED = "simulated"

    @property
    def provenance(self) -> Provenance:
        """The tag of every number estimated from this traffic's decision log."""
        return Provenance.SIMULATED if self is Traffic.SIMULATED else Provenance.SHADOW_LOGGED


@dataclass(frozen=True, eq=False)
class PolicyReport:
    """One policy version's estimates, difference to production and verdict.

    Attributes:
        policy: ``(name, version)``.
        n: rounds used.
        dropped: rounds of the log left out, by reason.
        infeasible_favourites: share of decisions whose raw favourite was infeasible.
        timeout_share: share of the rounds used whose decision timed out (fallback).
        results: one `Result` per estimator asked.
        primary: the estimator the verdict and slices use.
        vs_production: interval of (policy − production) on the same rounds, or None.
        verdict: one line.
        slices: workload kind -> primary `Result`.
        weights: float64 ``(n,)`` importance weights (for the weight plot).
        provenance: where the numbers come from.
    """

    policy: tuple[str, str]
    n: int
    dropped: Dropped
    infeasible_favourites: float
    timeout_share: float
    results: dict[Estimator, Result]
    primary: Estimator
    vs_production: Interval | None
    verdict: str
    slices: dict[str, Result]
    weights: NDArray[np.float64] = field(repr=False)
    provenance: Provenance

    @property
    def label(self) -> str:
        """``name@version``."""
        return f"{self.policy[0]}@{self.policy[1]}"

    @property
    def primary_result(self) -> Result | None:
        """The primary estimator's result, if it was run."""
        return self.results.get(self.primary)


@dataclass(frozen=True, eq=False)
class OpeReport:
    """Every policy's report on one read of the log.

    Attributes:
        reward: the reward definition.
        rounds: joined rounds read.
        production: production's observed mean reward interval (None when no reward).
        policies: one `PolicyReport` per logged policy version.
        level: nominal interval coverage.
        provenance: tag of the log-derived numbers.
    """

    reward: Reward
    rounds: int
    production: Interval | None
    production_value: float | None
    policies: list[PolicyReport]
    level: float
    provenance: Provenance


def constant_model(data: BanditData) -> NDArray[np.float64]:
    """Two-fold cross-fitted constant reward model, shape ``(n, A)``."""
    fold = np.arange(data.n) % 2
    q = np.empty(data.n)
    for k in (0, 1):
        other = data.reward[fold != k]
        q[fold == k] = other.mean() if len(other) else data.reward.mean()
    return np.repeat(q[:, None], data.n_actions, axis=1)


def _verdict(primary: Result | None, diff: Interval | None, dropped_all: bool) -> str:
    if dropped_all or primary is None:
        return "no usable rounds"
    if isinstance(primary, NotIdentifiable):
        return f"not identifiable: {primary.reason}"
    if diff is None:
        return "estimated; no paired production reward to compare"
    if diff.lower > 0:
        return f"better than production ({primary.estimator.value}, {diff.level:.0%} interval)"
    if diff.upper < 0:
        return f"worse than production ({primary.estimator.value}, {diff.level:.0%} interval)"
    return "no detectable difference from production"


def _estimate_policy(
    log: OpeLog,
    rounds: PolicyRounds,
    estimators: tuple[Estimator, ...],
    primary: Estimator,
    level: float,
    provenance: Provenance,
) -> PolicyReport:
    data = rounds.data
    results: dict[Estimator, Result] = {}
    diff: Interval | None = None
    slices: dict[str, Result] = {}
    weights = np.zeros(0)
    if data is not None:
        data = data.with_outcome(data.reward, constant_model(data))
        weights = data.weight
        for est in estimators:
            result = estimate(data, est, level=level)
            if isinstance(result, Estimate) and est.needs_model:
                result = _with_caveat(result, CONSTANT_MODEL_CAVEAT)
            results[est] = result
        chosen = results.get(primary)
        if isinstance(chosen, Estimate) and chosen.contributions is not None and data.n > 1:
            diff = normal_interval(chosen.contributions - data.reward, level)
        kinds = log.workload_kind[rounds.rows]
        for s in estimate_by_slice(data, kinds, primary, level=level):
            slices[str(s.label)] = s.result
    return PolicyReport(
        policy=rounds.policy,
        n=0 if data is None else data.n,
        dropped=rounds.dropped,
        infeasible_favourites=rounds.infeasible_favourites,
        timeout_share=rounds.timeout_share,
        results=results,
        primary=primary,
        vs_production=diff,
        verdict=_verdict(results.get(primary), diff, data is None),
        slices=slices,
        weights=weights,
        provenance=provenance,
    )


def _with_caveat(result: Estimate, caveat: str) -> Estimate:
    return Estimate(
        estimator=result.estimator,
        basis=result.basis,
        value=result.value,
        interval=result.interval,
        n=result.n,
        diagnostics=result.diagnostics,
        caveats=(*result.caveats, caveat),
        contributions=result.contributions,
    )


def run_ope(
    log: OpeLog,
    *,
    reward: Reward = Reward.SLO_MET,
    estimators: tuple[Estimator, ...] = DEFAULT_ESTIMATORS,
    primary: Estimator = Estimator.DR,
    level: float = 0.95,
    traffic: Traffic = Traffic.PRODUCTION,
) -> OpeReport:
    """Estimate every policy version logged in `log` (module docstring)."""
    asked = estimators if primary in estimators else (*estimators, primary)
    provenance = traffic.provenance
    policies = [
        _estimate_policy(log, policy_rounds(log, reward, key), asked, primary, level, provenance)
        for key in log.policies
        if key[0] not in NOT_TARGETS
    ]
    observed = production_rounds(log, reward)
    production = normal_interval(observed, level) if len(observed) > 1 else None
    return OpeReport(
        reward=reward,
        rounds=log.n,
        production=production,
        production_value=float(observed.mean()) if len(observed) else None,
        policies=policies,
        level=level,
        provenance=provenance,
    )
