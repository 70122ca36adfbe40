"""One running experiment's statistics, updated batch by batch, and its verdict.

`ExperimentMonitor(protocol)` is pure: the evaluator loop feeds it batches
from the decision log, the statistical tests feed it batches from the
simulator. Per batch of joined rounds it computes each off-policy metric's
per-round terms with the protocol's estimator (`service.ope.round_values`;
a self-normalised estimator's additive counterpart, since SNIPS/SNDR have no
fixed per-round terms), with the outcome model fitted on *earlier* batches
only (`service.protocols.reward_model`), then hands the named streams to
each criterion's tracker (`service.protocols.trackers`). `evaluations()`
judges every criterion (`service.protocols.criteria.judge`) and
`service.protocols.verdicts.decide` picks at most one transition.

No criterion gives a verdict before `minimum_samples` joined rounds
(data-quality criteria: before that many of their own trials).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from service.ope import BanditData, Estimator, NotIdentifiable, StreamingEstimator, round_values
from service.protocols.bounds import cost_bounds, reward_bounds
from service.protocols.criteria import (
    Evaluation,
    Role,
    Spec,
    Status,
    criteria_of,
    judge,
    without_number,
)
from service.protocols.planner import sequence_n_star
from service.protocols.reward_model import KnownPlusResidualModel, LinearOutcomeModel, MeanModel
from service.protocols.rounds import Decisions, JoinedRounds, QualityCounts
from service.protocols.schema import (
    METRICS,
    Against,
    Metric,
    MetricKind,
    Mode,
    Protocol,
    SequenceMethod,
)
from service.protocols.schema import Estimator as DeclaredEstimator
from service.protocols.trackers import (
    BettingTracker,
    DifferenceTracker,
    MeanTracker,
    PairedBettingTracker,
    ProportionTracker,
    Streams,
    Tracker,
    snapshot_proportion,
)
from service.protocols.verdicts import limit_evaluation

ADDITIVE = {
    DeclaredEstimator.DM: Estimator.DM,
    DeclaredEstimator.IPS: Estimator.IPS,
    DeclaredEstimator.SNIPS: Estimator.IPS,
    DeclaredEstimator.DR: Estimator.DR,
    DeclaredEstimator.SNDR: Estimator.DR,
    DeclaredEstimator.SWITCH_DR: Estimator.SWITCH_DR,
}
"""The estimator whose per-round terms feed the sequences (self-normalised -> additive)."""


class ExperimentMonitor:
    """Running statistics and criteria of one experiment (module docstring)."""

    def __init__(self, protocol: Protocol, n_features: int | None = None) -> None:
        self.protocol = protocol
        self.specs: tuple[Spec, ...] = criteria_of(protocol)
        self.n_star = sequence_n_star(protocol)
        self.estimator = ADDITIVE[protocol.analysis.estimator]
        self.trackers: dict[str, Tracker] = {}
        self.notes: dict[str, str] = {}
        for spec in self.specs:
            if spec.role is not Role.DATA_QUALITY:
                self.trackers[spec.name] = self._tracker(spec)
        self.off_policy = {s.metric for s in self.specs if METRICS[s.metric].needs_off_policy}
        self._reward_model: LinearOutcomeModel | MeanModel = (
            MeanModel() if n_features is None else LinearOutcomeModel(n_features)
        )
        self._cost_model = KnownPlusResidualModel()
        self._support = StreamingEstimator(Estimator.IPS)
        self._baseline_support: StreamingEstimator | None = (
            None if protocol.baseline.is_production else StreamingEstimator(Estimator.IPS)
        )
        self.n_joined = 0
        self.n_decisions = 0
        self.unusable_pscore = 0
        self.no_candidate_decision = 0
        self.quality = QualityCounts()
        self.breaches: list[str] = []

    # -- trackers ----------------------------------------------------------------------------

    def _tracker(self, spec: Spec) -> Tracker:
        metric = METRICS[spec.metric]
        m, a = spec.metric, spec.alpha
        base = spec.against is Against.BASELINE
        if metric.kind is MetricKind.OFF_POLICY:
            return self._off_policy_tracker(spec, metric, base)
        if metric.kind is MetricKind.PROPORTION:
            if not base:
                return ProportionTracker(f"cand:{m}", a)
            return DifferenceTracker(
                ProportionTracker(f"cand:{m}", a / 2), ProportionTracker(f"base:{m}", a / 2)
            )
        if not base:
            return MeanTracker(f"cand:{m}", a, self.n_star)
        return DifferenceTracker(
            MeanTracker(f"cand:{m}", a / 2, self.n_star),
            MeanTracker(f"base:{m}", a / 2, self.n_star),
        )

    def _off_policy_tracker(self, spec: Spec, metric: Metric, base: bool) -> Tracker:
        m, a = spec.metric, spec.alpha
        if self.protocol.analysis.sequence is SequenceMethod.BETTING:
            bounds = (reward_bounds if m == "reward" else cost_bounds)(self.protocol)
            if bounds is not None:
                lo, hi = bounds
                if not base:
                    return BettingTracker(f"y:{m}", a, lo, hi, weight="w:cand")
                if self.protocol.baseline.is_production:
                    return PairedBettingTracker(f"y:{m}", "w:cand", a, lo, hi)
                half = BettingTracker(f"y:{m}", a / 2, lo, hi, weight="w:cand")
                other = BettingTracker(f"y:{m}", a / 2, lo, hi, weight="w:base")
                return DifferenceTracker(half, other)
            self.notes[spec.name] = (
                f"betting needs a bounded {m}; the asymptotic sequence is used instead"
            )
        return MeanTracker(f"diff:{m}" if base else f"cand:{m}", a, self.n_star)

    # -- updates -----------------------------------------------------------------------------

    def update_joined(self, rounds: JoinedRounds) -> None:
        """Fold in a batch of joined rounds (off-policy metrics, production's rates)."""
        self.n_joined += rounds.n
        if rounds.n == 0:
            return
        mass = rounds.target.sum(axis=1)
        has_target = mass > 0
        self.no_candidate_decision += int((~has_target).sum())
        pscore_ok = np.isfinite(rounds.pscore) & (rounds.pscore > 0) & (rounds.pscore <= 1)
        self.unusable_pscore += int((has_target & ~pscore_ok).sum())
        usable = has_target & pscore_ok
        target = rounds.target[usable] / mass[usable, None]
        baseline = None
        if rounds.baseline_target is not None:
            bmass = rounds.baseline_target.sum(axis=1)
            usable &= bmass > 0
            target = rounds.target[usable] / mass[usable, None]
            baseline = rounds.baseline_target[usable] / bmass[usable, None]
        streams: dict[str, NDArray[np.float64]] = {}
        if rounds.production_infeasible is not None and self.protocol.baseline.is_production:
            streams["base:infeasible_favourite_rate"] = rounds.production_infeasible.astype(float)
        for metric in sorted(self.off_policy):
            streams |= self._off_policy_streams(metric, rounds, usable, target, baseline)
        self._update_support(rounds, usable, target, baseline)
        self._feed(streams)

    def _off_policy_streams(
        self,
        metric: str,
        rounds: JoinedRounds,
        usable: NDArray[np.bool_],
        target: NDArray[np.float64],
        baseline: NDArray[np.float64] | None,
    ) -> dict[str, NDArray[np.float64]]:
        y_all = rounds.reward if metric == "reward" else rounds.cost
        ok = usable & np.isfinite(y_all)
        keep = ok[usable]
        y, action, pscore = y_all[ok], rounds.action[ok], rounds.pscore[ok]
        if len(y) == 0:
            return {}
        q = self._predict(metric, rounds, ok)
        cand = BanditData(
            reward=y, action=action, pscore=pscore, action_dist=target[keep], estimated_rewards=q
        )
        v_cand = round_values(cand, self.estimator)
        out = {
            f"cand:{metric}": v_cand,
            f"y:{metric}": y,
            "w:cand": cand.weight,
        }
        if baseline is None:
            out[f"base:{metric}"] = y
            out[f"diff:{metric}"] = v_cand - y
        else:
            base = cand.with_target(baseline[keep])
            v_base = round_values(base, self.estimator)
            out |= {
                f"base:{metric}": v_base,
                f"diff:{metric}": v_cand - v_base,
                "w:base": base.weight,
            }
        self._learn(metric, rounds, ok)
        return out

    def _predict(
        self, metric: str, rounds: JoinedRounds, ok: NDArray[np.bool_]
    ) -> NDArray[np.float64]:
        shape = (int(ok.sum()), rounds.target.shape[1])
        if metric == "cost":
            known = rounds.known_cost[ok] if rounds.known_cost is not None else np.zeros(shape)
            return self._cost_model.predict(known)
        if isinstance(self._reward_model, LinearOutcomeModel) and rounds.features is not None:
            return self._reward_model.predict(rounds.features[ok])
        if isinstance(self._reward_model, MeanModel):
            return self._reward_model.predict(shape)
        return np.zeros(shape)

    def _learn(self, metric: str, rounds: JoinedRounds, ok: NDArray[np.bool_]) -> None:
        action = rounds.action[ok]
        if metric == "cost":
            shape = (int(ok.sum()), rounds.target.shape[1])
            known = rounds.known_cost[ok] if rounds.known_cost is not None else np.zeros(shape)
            self._cost_model.learn(known, action, rounds.cost[ok])
        elif isinstance(self._reward_model, LinearOutcomeModel):
            if rounds.features is not None:
                self._reward_model.learn(rounds.features[ok], action, rounds.reward[ok])
        else:
            self._reward_model.learn(rounds.reward[ok])

    def _update_support(
        self,
        rounds: JoinedRounds,
        usable: NDArray[np.bool_],
        target: NDArray[np.float64],
        baseline: NDArray[np.float64] | None,
    ) -> None:
        """Overlap diagnostics (support, ESS), whatever the outcome: IPS sums on zeros."""
        if not usable.any():
            return
        data = BanditData(
            reward=np.zeros(int(usable.sum())),
            action=rounds.action[usable],
            pscore=rounds.pscore[usable],
            action_dist=target,
        )
        self._support.update(data)
        if baseline is not None and self._baseline_support is not None:
            self._baseline_support.update(data.with_target(baseline))

    def update_decisions(self, candidate: Decisions, baseline: Decisions | None = None) -> None:
        """Fold in the candidate's (and a named baseline's) decisions: rates and latency."""
        self.n_decisions += candidate.n
        streams = _decision_streams("cand", candidate)
        if baseline is not None:
            streams |= _decision_streams("base", baseline)
        self._feed(streams)

    def observe_quality(self, counts: QualityCounts) -> None:
        """The data-quality counts as of now (replace, not add)."""
        self.quality = counts

    def observe_breaches(self, breaches: Sequence[str]) -> None:
        """Authority breaches Runtime's acted placements showed (online-bounded only)."""
        self.breaches.extend(breaches)

    def _feed(self, streams: Streams) -> None:
        for tracker in self.trackers.values():
            tracker.update(streams)

    # -- judgement ---------------------------------------------------------------------------

    def identification_failure(self) -> str | None:
        """Why the logs cannot identify the candidate's (or baseline's) value, or None."""
        for est in (self._support, self._baseline_support):
            if est is not None and est.n:
                result = est.estimate()
                if isinstance(result, NotIdentifiable):
                    return result.reason
        return None

    def evaluations(self, elapsed_s: float) -> tuple[Evaluation, ...]:
        """Every criterion judged now, then the experiment's built-in limits."""
        minimum = self.protocol.minimum_samples
        failure = self.identification_failure() if self.off_policy else None
        out: list[Evaluation] = []
        for spec in self.specs:
            if spec.role is Role.DATA_QUALITY:
                out.append(self._quality(spec))
            elif self.n_joined < minimum:
                note = f"{self.n_joined} of {minimum} joined decisions before any verdict"
                out.append(without_number(spec, Status.INSUFFICIENT, self.n_joined, note))
            elif spec.metric in self.off_policy and failure is not None:
                out.append(without_number(spec, Status.NOT_IDENTIFIABLE, self.n_joined, failure))
            else:
                tracker = self.trackers[spec.name]
                out.append(judge(spec, tracker.value, tracker.interval(), note=self._note(spec)))
        out.extend(self._limits(elapsed_s, failure))
        return tuple(out)

    def _note(self, spec: Spec) -> str:
        note = self.notes.get(spec.name, "")
        declared = self.protocol.analysis.estimator
        if spec.metric in self.off_policy and ADDITIVE[declared].value != declared.value:
            extra = (
                f"{declared.value} has no per-round terms: the sequence uses {self.estimator.value}"
            )
            note = f"{note}; {extra}" if note else extra
        return note

    def _quality(self, spec: Spec) -> Evaluation:
        q = self.quality
        counts = {
            "outcome_join_rate": (q.joined_due, q.requests_due),
            "missing_propensity_rate": (q.missing_propensity, q.production_decisions),
            "mirror_coverage": (
                None
                if q.mirrored is None or q.runtime_requests is None
                else (min(q.mirrored, q.runtime_requests), q.runtime_requests)
            ),
        }[spec.metric]
        if counts is None:
            note = "Runtime's request counts are not reported yet"
            return without_number(spec, Status.UNAVAILABLE, 0, note)
        successes, trials = counts
        if trials < self.protocol.minimum_samples:
            note = f"{trials} of {self.protocol.minimum_samples} samples before any verdict"
            return without_number(spec, Status.INSUFFICIENT, trials, note)
        value, interval = snapshot_proportion(successes, trials, spec.alpha)
        return judge(spec, value, interval, note="counts as of now")

    def _limits(self, elapsed_s: float, failure: str | None) -> list[Evaluation]:
        limit = self.protocol.max_duration_s
        out = [
            limit_evaluation(
                "max_duration", "elapsed_s", elapsed_s >= limit, elapsed_s, limit, self.n_joined
            )
        ]
        if self.off_policy:
            identified = failure is None or self.n_joined < self.protocol.minimum_samples
            out.append(
                limit_evaluation(
                    "identifiability",
                    "unsupported",
                    not identified,
                    None,
                    0.0,
                    self.n_joined,
                    failure or "",
                )
            )
        if self.protocol.mode is Mode.ONLINE_BOUNDED:
            note = "; ".join(self.breaches[:5])
            count = float(len(self.breaches))
            out.append(
                limit_evaluation(
                    "authority",
                    "breaches",
                    bool(self.breaches),
                    count,
                    0.0,
                    len(self.breaches),
                    note,
                    role=Role.ROLLBACK,
                )
            )
        return out


def _decision_streams(prefix: str, d: Decisions) -> dict[str, NDArray[np.float64]]:
    return {
        f"{prefix}:policy_error_rate": d.error.astype(float),
        f"{prefix}:timeout_rate": d.timeout.astype(float),
        f"{prefix}:infeasible_favourite_rate": d.raw_favourite_infeasible.astype(float),
        f"{prefix}:scoring_latency_ms": d.latency_ms,
    }
