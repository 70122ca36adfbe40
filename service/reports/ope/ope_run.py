"""`understudy ope`'s engine: every logged policy estimated on the decision log, with a verdict.

For each policy version in the log, on the rounds it can be judged on
(``service.reports.ope.arrays``):

- IPS, SNIPS and DR estimates (``service.ope.estimate``, normal intervals);
  DR's reward model is a constant, cross-fitted on two folds (each fold's
  rounds get the mean reward of the other fold): no features are decoded, so
  it only lowers variance, and a caveat says so;
- the paired difference to production (the primary estimator's per-round
  contributions minus production's observed reward on the same rounds), with
  the interval `service.ope.comparison.verdict_method` allows under the
  weights' diagnostics: normal when the tail is light, the paired off-policy
  betting interval when it is heavy and the reward bounded, none otherwise;
  the verdict follows from it;
- the primary estimate per slice (``estimate_by_slice``): workload kind,
  model family and time window always (they are columns of the log), plus any
  label arrays the caller decodes from the stored requests (the hardware class
  of the option each policy chose: `SliceLabels`).

Production's own value is its observed mean reward (on-policy, normal interval).
Every number carries a `Provenance`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray

from service.ope import (
    BanditData,
    Estimate,
    Estimator,
    Interval,
    IntervalMethod,
    NotIdentifiable,
    PairedOffPolicyBettingCS,
    Result,
    estimate,
    estimate_by_slice,
    normal_interval,
)
from service.ope.comparison import no_verdict_reason, verdict_method
from service.reports.ope.arrays import (
    Dropped,
    PolicyRounds,
    Reward,
    policy_rounds,
    production_rounds,
)
from service.reports.ope.marks import range_of
from service.storage.reads.ope import OpeLog

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


TIME_WINDOWS = 4
"""Equal-length windows of ``received_at`` the log is cut into for the time-window slice."""
WORKLOAD_KIND = "workload_kind"
MODEL_FAMILY = "model_family"
TIME_WINDOW = "time_window"
HARDWARE_CLASS = "hardware_class"
SLICE_TITLES = {
    WORKLOAD_KIND: "workload kind",
    MODEL_FAMILY: "model family",
    TIME_WINDOW: "time window",
    HARDWARE_CLASS: "hardware class of the chosen option",
}
"""Slice dimensions, in report order, and how a table names them."""


@dataclass(frozen=True, eq=False)
class SliceLabels:
    """Slice labels decoded by the caller, aligned with the rounds of the `OpeLog`.

    Attributes:
        per_round: dimension -> str ``(n,)``, the same for every policy.
        per_policy: ``(name, version)`` -> dimension -> str ``(n,)``, e.g. the
            hardware class of the option the policy chose.
    """

    per_round: Mapping[str, NDArray[np.str_]] = field(default_factory=dict)
    per_policy: Mapping[tuple[str, str], Mapping[str, NDArray[np.str_]]] = field(
        default_factory=dict
    )


def time_windows(received_at: NDArray[np.float64], k: int = TIME_WINDOWS) -> NDArray[np.str_]:
    """Each round's window among `k` equal-length windows of the log's time span, labelled
    by its UTC start and end (``HH:MM:SS`` when the span is under a day, else dates)."""
    n = len(received_at)
    if n == 0:
        return np.zeros(0, dtype=np.str_)
    lo, hi = float(np.min(received_at)), float(np.max(received_at))
    step = (hi - lo) / k if hi > lo else 1.0
    index = np.minimum(((received_at - lo) // step).astype(np.int64), k - 1)
    form = "%H:%M:%S" if hi - lo < 86_400 else "%Y-%m-%d %H:%M"

    def at(ts: float) -> str:
        return datetime.fromtimestamp(ts, UTC).strftime(form)

    names = [f"{i + 1}: {at(lo + i * step)}–{at(lo + (i + 1) * step)}" for i in range(k)]
    return np.array(names, dtype=np.str_)[index]


_BATCH_SUFFIX = re.compile(r"\s*\(batch size \d+\)\s*$")


def model_families(model_family: NDArray[np.str_]) -> NDArray[np.str_]:
    """The family without a trailing ``(batch size N)`` (Gavel's job names carry one):
    a batch size is a configuration, and slicing by it leaves slices too small to read."""
    return np.array([_BATCH_SUFFIX.sub("", str(f)) for f in model_family], dtype=np.str_)


def log_slices(log: OpeLog) -> dict[str, NDArray[np.str_]]:
    """The slice labels every log carries: workload kind, model family, time window."""
    return {
        WORKLOAD_KIND: log.workload_kind,
        MODEL_FAMILY: model_families(log.model_family),
        TIME_WINDOW: time_windows(log.received_at),
    }


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
        slices: dimension (`SLICE_TITLES`) -> label -> primary `Result`.
        weights: float64 ``(n,)`` importance weights (for the weight plot).
        provenance: where the numbers come from.
        rows: int64 ``(n,)``, the rounds used, as indices into the `OpeLog`.
        difference: float64 ``(n,)``, per round, the primary estimator's
            contribution minus production's observed reward (empty when the
            primary estimate is refused): the paired difference behind
            `vs_production`, averaged per slice by the failure-mode section.
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
    slices: dict[str, dict[str, Result]]
    weights: NDArray[np.float64] = field(repr=False)
    provenance: Provenance
    rows: NDArray[np.int64] = field(repr=False, default_factory=lambda: np.zeros(0, np.int64))
    difference: NDArray[np.float64] = field(repr=False, default_factory=lambda: np.zeros(0))

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


def reward_bounds(reward: Reward) -> tuple[float, float] | None:
    """The reward's bounds from its declaration (`marks.range_of`), which a betting
    interval needs; None for completion and queue times, which are unbounded."""
    return range_of(reward).bounds


def verdict(
    primary: Result | None, diff: Interval | None, dropped_all: bool, no_interval: bool = False
) -> str:
    """One line from the primary result and the interval `verdict_method` chose
    (`no_interval`: it chose none)."""
    if dropped_all or primary is None:
        return "no usable rounds"
    if isinstance(primary, NotIdentifiable):
        return f"not identifiable: {primary.reason}"
    if diff is None:
        if no_interval:
            return no_verdict_reason(primary.diagnostics)
        return "estimated; no paired production reward to compare"
    how = (
        f"{primary.estimator.value}, {diff.level:.0%} normal interval"
        if diff.method is IntervalMethod.NORMAL
        else f"ips, {diff.level:.0%} off-policy betting interval (weight tail: Pareto "
        f"k-hat {primary.diagnostics.khat:.2f})"
    )
    if diff.lower > 0:
        return f"better than production ({how})"
    if diff.upper < 0:
        return f"worse than production ({how})"
    return f"no detectable difference from production ({how})"


def paired_interval(
    data: BanditData, chosen: Estimate, level: float, reward: Reward
) -> tuple[Interval | None, NDArray[np.float64]]:
    """The verdict's interval of target − production on `data`'s rounds, and the paired
    per-round differences (the primary's contributions minus the observed reward)."""
    if chosen.contributions is None or data.n < 2:
        return None, np.zeros(0)
    paired = chosen.contributions - data.reward
    bounds = reward_bounds(reward)
    method = verdict_method(chosen.diagnostics, bounded=bounds is not None)
    if method is IntervalMethod.NORMAL:
        return normal_interval(paired, level), paired
    if method is None or bounds is None:
        return None, paired
    cs = PairedOffPolicyBettingCS(1 - level, *bounds, n_planned=data.n)
    cs.update(weight=data.weight, reward=data.reward)
    return cs.interval(), paired


def _estimate_policy(
    log: OpeLog,
    rounds: PolicyRounds,
    estimators: tuple[Estimator, ...],
    primary: Estimator,
    level: float,
    provenance: Provenance,
    labels: Mapping[str, NDArray[np.str_]],
    reward: Reward,
) -> PolicyReport:
    data = rounds.data
    results: dict[Estimator, Result] = {}
    diff: Interval | None = None
    paired = np.zeros(0)
    slices: dict[str, dict[str, Result]] = {}
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
        if isinstance(chosen, Estimate):
            diff, paired = paired_interval(data, chosen, level, reward)
        for dimension, values in labels.items():
            found = estimate_by_slice(data, values[rounds.rows], primary, level=level)
            slices[dimension] = {str(s.label): s.result for s in found}
    return PolicyReport(
        policy=rounds.policy,
        n=0 if data is None else data.n,
        dropped=rounds.dropped,
        infeasible_favourites=rounds.infeasible_favourites,
        timeout_share=rounds.timeout_share,
        results=results,
        primary=primary,
        vs_production=diff,
        verdict=verdict(
            results.get(primary),
            diff,
            data is None,
            no_interval=diff is None and len(paired) > 0,
        ),
        slices=slices,
        weights=weights,
        provenance=provenance,
        rows=rounds.rows,
        difference=paired,
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
    slices: SliceLabels | None = None,
) -> OpeReport:
    """Estimate every policy version logged in `log` (module docstring).

    `slices` adds label arrays decoded by the caller to the log's own
    (`log_slices`); a dimension given there replaces the log's.
    """
    asked = estimators if primary in estimators else (*estimators, primary)
    provenance = traffic.provenance
    extra = slices or SliceLabels()
    common = {**log_slices(log), **extra.per_round}
    for dimension, values in common.items():
        if len(values) != log.n:
            raise ValueError(f"slice `{dimension}` has {len(values)} labels for {log.n} rounds")
    policies = [
        _estimate_policy(
            log,
            policy_rounds(log, reward, key),
            asked,
            primary,
            level,
            provenance,
            {**common, **extra.per_policy.get(key, {})},
            reward,
        )
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
