"""`understudy ope --parquet`: ``run_ope``'s report from additive sums over record batches.

Memory holds one batch and a few numbers per policy and slice, whatever the
slice's size. Three passes over the sorted scan (``parquet_source.scan``,
judged by ``parquet_rounds``), each a sum over rounds:

1. per policy, which rows are usable rounds, their fold (the round's rank
   among the policy's usable rounds, mod 2, as ``ope_run.constant_model``
   numbers them) and per-fold reward sums; per round, production's reward
   moments and the dropped-round counts;
2. per policy, each batch's usable rounds become a `BanditData` whose DR model
   is the other fold's mean reward, folded into one `StreamingEstimator` per
   estimator and, for the primary estimator, per slice label
   (``service.ope.streaming``: kernel means plus diagnostic sums);
3. with those means fixed, the centred sums of squares of the per-round
   contributions ``psi_t`` (``service.ope.kernels``) and of the paired
   differences ``psi_t - r_t``: the interval then comes from the same
   two-pass variance ``run_ope`` computes, so a slice whose contributions are
   all equal gets a zero-width interval, as on the live log, instead of the
   square root of rounding noise that the co-moment form leaves; and, where
   the primary's weight tail (known after pass 2) sends the verdict to the
   paired betting interval (``service.ope.comparison``), that sequence, fed
   batch by batch (O(grid) per policy; batch-invariant).

Every pass is a map over batches and a sum, so the batches could be spread
over many workers (docs/export.md). Equal to ``run_ope`` on the same rounds to
float rounding (tests: 1e-9). Per-round weights are not kept
(`PolicyReport.weights` is empty).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from service.ope import (
    BanditData,
    Estimate,
    Estimator,
    Interval,
    IntervalMethod,
    PairedOffPolicyBettingCS,
    Result,
)
from service.ope.comparison import verdict_method
from service.ope.diagnostics import caveats
from service.ope.estimators import SWITCH_TAU
from service.ope.intervals import normal_from_moments
from service.ope.kernels import Moments, parts
from service.ope.streaming import StreamingEstimator
from service.reports.ope.arrays import Dropped, Reward
from service.reports.ope.ope_run import (
    CONSTANT_MODEL_CAVEAT,
    DEFAULT_ESTIMATORS,
    NOT_TARGETS,
    TIME_WINDOW,
    OpeReport,
    PolicyReport,
    Traffic,
    log_slices,
    reward_bounds,
    time_windows,
    verdict,
)
from service.reports.ope.parquet_rounds import Batch, batches
from service.reports.ope.parquet_source import Rows, open_slice, slice_size
from service.storage.reads.ope import OpeFilter, Progress

Labels = Callable[[Rows], dict[str, NDArray[np.str_]]]


def _moments(x: NDArray[np.float64]) -> Moments:
    """Moments of the rows of `x` ``(n, k)`` (`Moments.merge` works for any k)."""
    mean = x.mean(axis=0)
    dev = x - mean
    return Moments(len(x), mean, dev.T @ dev)


@dataclass(eq=False)
class _Target:
    """One streamed estimate: the core's `StreamingEstimator` (pass 2), then the centred
    sum of squares of its contributions (pass 3)."""

    streaming: StreamingEstimator
    squares: float = 0.0

    def contributions(self, data: BanditData) -> NDArray[np.float64]:
        """``psi_t`` of `data`'s rounds, with the final ``V_c`` and ``mean(m)``."""
        p = parts(data, self.streaming.estimator, SWITCH_TAU)
        mean = self.streaming.moments.mean
        vc = mean[1] / mean[2]
        psi: NDArray[np.float64] = p.direct + vc + (p.correction - vc * p.normaliser) / mean[2]
        return psi

    def add_squares(self, data: BanditData) -> None:
        deviation = self.contributions(data) - self.streaming.moments.value()
        self.squares += float((deviation**2).sum())

    def result(self) -> Result:
        """As ``estimate`` gives it on all rounds at once (but no contributions)."""
        r = self.streaming.estimate()
        if not isinstance(r, Estimate):
            return r
        variance = self.squares / (r.n - 1) if r.n > 1 else math.nan
        interval = normal_from_moments(r.value, variance, r.n, self.streaming.level)
        half = (interval.upper - interval.lower) / 2
        return replace(r, interval=interval, caveats=caveats(r.diagnostics, r.basis, r.value, half))


@dataclass(eq=False)
class _Policy:
    """One policy version's running sums."""

    rows: int = 0
    raw_favourites: int = 0
    kept: int = 0
    timeouts: int = 0
    fold_sum: list[float] = field(default_factory=lambda: [0.0, 0.0])
    fold_n: list[int] = field(default_factory=lambda: [0, 0])
    targets: dict[Estimator, _Target] = field(default_factory=dict)
    slices: dict[str, dict[str, _Target]] = field(default_factory=dict)
    paired_squares: float = 0.0
    betting: PairedOffPolicyBettingCS | None = None

    def model(self) -> tuple[float, float]:
        """DR's constant per fold: the other fold's mean reward (all rounds' when empty)."""
        total = sum(self.fold_sum) / max(self.kept, 1)
        return (
            self.fold_sum[1] / self.fold_n[1] if self.fold_n[1] else total,
            self.fold_sum[0] / self.fold_n[0] if self.fold_n[0] else total,
        )

    def paired_mean(self, primary: Estimator) -> float:
        """Mean of ``psi_t - r_t`` over the kept rounds."""
        return self.targets[primary].streaming.moments.value() - sum(self.fold_sum) / self.kept


@dataclass(eq=False)
class _Rounds:
    """Per-round sums: count, rewards, and why rounds cannot be used."""

    n: int = 0
    production: Moments = field(default_factory=lambda: Moments(0, np.zeros(1), np.zeros((1, 1))))
    no_reward: int = 0
    no_production: int = 0
    usable: int = 0

    def add(self, b: Batch) -> None:
        r = b.reward[b.new_round]
        p = b.pscore[b.new_round]
        has = ~np.isnan(r)
        ok_p = np.isfinite(p) & (p > 0) & (p <= 1)
        self.n += int(b.new_round.sum())
        self.no_reward += int((~has).sum())
        self.no_production += int((has & ~ok_p).sum())
        self.usable += int((has & ok_p).sum())
        if has.any():
            self.production = self.production.merge(_moments(r[has][:, None]))


def _first_pass(batches: Iterator[Batch]) -> tuple[_Rounds, dict[tuple[str, str], _Policy]]:
    rounds = _Rounds()
    policies: dict[tuple[str, str], _Policy] = {}
    for b in batches:
        rounds.add(b)
        for key, u in b.by_policy.items():
            acc = policies.setdefault(key, _Policy())
            acc.rows += len(u.rows)
            acc.raw_favourites += int(b.rows.raw_favourite_infeasible[u.rows].sum())
            kept = u.rows[u.keep]
            fold = (acc.kept + np.arange(len(kept))) % 2
            for k in (0, 1):
                acc.fold_sum[k] += float(b.reward[kept][fold == k].sum())
                acc.fold_n[k] += int((fold == k).sum())
            acc.kept += len(kept)
            acc.timeouts += sum(b.rows.status[i] == "timeout" for i in kept)
    return rounds, policies


def _policy_data(
    scanned: Iterator[Batch],
    policies: dict[tuple[str, str], _Policy],
    rounds: _Rounds,
    labels: Labels,
) -> Iterator[tuple[_Policy, BanditData, dict[str, NDArray[np.str_]]]]:
    """Per batch and target policy: its usable rounds as `BanditData` with the DR model,
    and their slice labels. ``unusable_pscore`` rides on a policy's first batch only."""
    seen = dict.fromkeys(policies, 0)
    for b in scanned:
        batch_labels = labels(b.rows)
        for key, u in b.by_policy.items():
            if key[0] in NOT_TARGETS or not u.keep.any():
                continue
            acc = policies[key]
            kept = u.rows[u.keep]
            fold = (seen[key] + np.arange(len(kept))) % 2
            q = np.asarray(acc.model())[fold]
            data = BanditData(
                reward=b.reward[kept],
                action=b.action[kept],
                pscore=b.pscore[kept],
                action_dist=u.target[u.keep],
                feasible=u.feasible[u.keep],
                logging_dist=None if b.logging is None else b.logging[kept],
                estimated_rewards=np.repeat(q[:, None], u.target.shape[1], axis=1),
                unusable_pscore=rounds.no_production if seen[key] == 0 else 0,
            )
            seen[key] += len(kept)
            yield acc, data, {d: v[kept] for d, v in batch_labels.items()}


def _by_label(
    labels: dict[str, NDArray[np.str_]],
) -> Iterator[tuple[str, str, NDArray[np.bool_]]]:
    for dimension, values in labels.items():
        for label in np.unique(values):
            yield dimension, str(label), values == label


def _estimate_pass(
    scanned: Iterator[Batch],
    policies: dict[tuple[str, str], _Policy],
    rounds: _Rounds,
    labels: Labels,
    primary: Estimator,
    level: float,
) -> None:
    for acc, data, data_labels in _policy_data(scanned, policies, rounds, labels):
        for t in acc.targets.values():
            t.streaming.update(data)
        for dimension, label, rows in _by_label(data_labels):
            by_label = acc.slices.setdefault(dimension, {})
            t = by_label.setdefault(label, _Target(StreamingEstimator(primary, level=level)))
            t.streaming.update(data.subset(rows))


def _verdict_method(acc: _Policy, primary: Estimator, reward: Reward) -> IntervalMethod | None:
    """``verdict_method`` on the primary's diagnostics (known after pass 2); None for a
    policy pass 2 fed nothing (no usable rounds, or not a target: production's mirror)."""
    streaming = acc.targets[primary].streaming
    chosen = streaming.estimate() if streaming.n else None
    if not isinstance(chosen, Estimate):
        return None
    return verdict_method(chosen.diagnostics, bounded=reward_bounds(reward) is not None)


def _variance_pass(
    scanned: Iterator[Batch],
    policies: dict[tuple[str, str], _Policy],
    rounds: _Rounds,
    labels: Labels,
    primary: Estimator,
    level: float,
    reward: Reward,
) -> None:
    for acc in policies.values():
        if (
            acc.targets
            and _verdict_method(acc, primary, reward) is IntervalMethod.OFF_POLICY_BETTING_CS
        ):
            bounds = reward_bounds(reward)
            assert bounds is not None  # the betting method is chosen only for bounded rewards
            acc.betting = PairedOffPolicyBettingCS(1 - level, *bounds, n_planned=acc.kept)
    for acc, data, data_labels in _policy_data(scanned, policies, rounds, labels):
        if acc.betting is not None:
            acc.betting.update(weight=data.weight, reward=data.reward)
        for t in acc.targets.values():
            t.add_squares(data)
        for dimension, label, rows in _by_label(data_labels):
            acc.slices[dimension][label].add_squares(data.subset(rows))
        paired = acc.targets[primary].contributions(data) - data.reward
        acc.paired_squares += float(((paired - acc.paired_mean(primary)) ** 2).sum())


def _labeller(first: float, last: float) -> Callable[[Rows], dict[str, NDArray[np.str_]]]:
    """``ope_run.log_slices`` for a batch, its time windows cut over the whole slice's span."""

    def labels(rows: Rows) -> dict[str, NDArray[np.str_]]:
        out = log_slices(rows.log)
        if TIME_WINDOW in out:
            span = np.concatenate([[first, last], rows.log.received_at])
            out[TIME_WINDOW] = time_windows(span)[2:]
        return out

    return labels


def _paired(acc: _Policy, primary: Estimator, level: float, reward: Reward) -> Interval | None:
    """The verdict's interval: normal of ``psi_t - r_t`` over the policy's rounds, or the
    paired betting interval, as ``service.ope.comparison.verdict_method`` says."""
    if acc.kept < 2:
        return None
    method = _verdict_method(acc, primary, reward)
    if method is None:
        return None
    if method is IntervalMethod.OFF_POLICY_BETTING_CS:
        return acc.betting.interval() if acc.betting is not None else None
    variance = acc.paired_squares / (acc.kept - 1)
    return normal_from_moments(acc.paired_mean(primary), variance, acc.kept, level)


def _report(
    key: tuple[str, str],
    acc: _Policy,
    rounds: _Rounds,
    primary: Estimator,
    level: float,
    traffic: Traffic,
    reward: Reward,
) -> PolicyReport:
    dropped = Dropped(rounds.no_reward, rounds.no_production, rounds.usable - acc.kept)
    results: dict[Estimator, Result] = {}
    for est, target in acc.targets.items() if acc.kept else ():
        result = target.result()
        if isinstance(result, Estimate) and est.needs_model:
            result = replace(result, caveats=(*result.caveats, CONSTANT_MODEL_CAVEAT))
        results[est] = result
    chosen = results.get(primary)
    diff = _paired(acc, primary, level, reward) if isinstance(chosen, Estimate) else None
    return PolicyReport(
        policy=key,
        n=acc.kept,
        dropped=dropped,
        infeasible_favourites=acc.raw_favourites / acc.rows if acc.rows else math.nan,
        timeout_share=acc.timeouts / acc.kept if acc.kept else 0.0,
        results=results,
        primary=primary,
        vs_production=diff,
        verdict=verdict(
            chosen,
            diff,
            acc.kept == 0,
            no_interval=diff is None
            and acc.kept > 1
            and _verdict_method(acc, primary, reward) is None,
        ),
        slices={
            dimension: {k: by_label[k].result() for k in sorted(by_label)}
            for dimension, by_label in acc.slices.items()
        },
        weights=np.zeros(0),
        provenance=traffic.provenance,
    )


def stream_ope(
    root: Path,
    where: OpeFilter | None = None,
    *,
    reward: Reward = Reward.SLO_MET,
    estimators: tuple[Estimator, ...] = DEFAULT_ESTIMATORS,
    primary: Estimator = Estimator.DR,
    level: float = 0.95,
    traffic: Traffic = Traffic.PRODUCTION,
    batch_rows: int = 50_000,
    memory_limit: str | None = None,
    progress: Progress | None = None,
) -> OpeReport:
    """``run_ope`` on the slice at `root` for `where`, streamed (module docstring).

    `batch_rows` rows are in Python at a time; `memory_limit` bounds DuckDB's sort
    (``parquet_source.scan``).
    """
    f = where or OpeFilter()
    size = slice_size(open_slice(root), f)
    width = size.most_options + 1
    asked = estimators if primary in estimators else (*estimators, primary)
    labels = _labeller(size.first, size.last)
    done = 0

    def scanned() -> Iterator[Batch]:
        nonlocal done
        for b in batches(root, f, reward, width, batch_rows, memory_limit):
            yield b
            done += b.rows.n
            if progress is not None:
                progress(done, 3 * size.rows)

    rounds, policies = _first_pass(scanned())
    for acc in policies.values():
        acc.targets = {e: _Target(StreamingEstimator(e, level=level)) for e in asked}
    _estimate_pass(scanned(), policies, rounds, labels, primary, level)
    _variance_pass(scanned(), policies, rounds, labels, primary, level, reward)
    production = rounds.production
    return OpeReport(
        reward=reward,
        rounds=rounds.n,
        production=normal_from_moments(
            float(production.mean[0]),
            float(production.comoment[0, 0] / (production.n - 1)),
            production.n,
            level,
        )
        if production.n > 1
        else None,
        production_value=float(production.mean[0]) if production.n else None,
        policies=[
            _report(key, policies[key], rounds, primary, level, traffic, reward)
            for key in sorted(policies)
            if key[0] not in NOT_TARGETS
        ],
        level=level,
        provenance=traffic.provenance,
    )
