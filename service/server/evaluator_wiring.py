"""The evaluator plugged into the running service: decision-log reads, evidence, wiring.

Composition glue, like ``service/server/decision_log.py``: the pipeline's evaluator
knows only its small interfaces (`RoundSource`, `EvaluationRecords`,
`EvidenceRecorder`, `LeaseStore`); this module implements them on
PostgreSQL and the contract, and `wire_evaluator` assembles one evaluator
for a built `Service`. The composition root calls it; tests call it too, so
they run the same wiring as production.

Reading rounds decodes each joined request once (journal bytes ->
`MirrorRequest`), to compute the option features the reward model reads,
the feasibility of every option (the cost's constraint signals, whether
production's choice was infeasible) with the same versioned functions the
scorer uses.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
from google.protobuf.message import DecodeError
from numpy.typing import NDArray

from service.contract import DEFAULT_FEATURES, N_FEATURES, InvalidInput
from service.contract.feasibility import check_feasibility
from service.contract.reward import REWARD_FIELDS
from service.evaluator.calibration_monitor import (
    MAX_WINDOW_ROWS,
    CalibrationMonitor,
    CalibrationStep,
    predictor_policies,
)
from service.evaluator.candidate_gate import CandidateGate
from service.evaluator.leader import Lease, holder_id
from service.evaluator.loop import (
    BeforeApply,
    Cursor,
    Evaluator,
    EvaluatorConfig,
    EvaluatorObserver,
    Watched,
)
from service.evaluator.metrics import EvaluatorMetrics
from service.evaluator.outcome_drift_monitor import MAX_WINDOW_OUTCOMES, OutcomeDriftMonitor
from service.protocols import ProtocolDesk, ProtocolRecords, RecordedProtocol
from service.protocols.rounds import Decisions, JoinedRounds, QualityCounts
from service.reports.protocol import build_package
from service.server.policy_refs import policy_refs
from service.server.runtime import Service
from service.storage import ProtocolStore
from service.storage.log.payload import decode_request
from service.storage.reads.calibration import read_calibration
from service.storage.reads.evaluation import (
    DecisionRecord,
    JoinedRound,
    PolicyChoice,
    decision_records,
    joined_rounds,
    quality_counts,
)
from service.storage.reads.ope import OpeFilter
from service.storage.reads.outcome_drift import read_placed_outcomes
from service.storage.stores.evaluation import (
    EvaluationStore,
    EvidenceSnapshot,
    FencedProtocolRecords,
)

log = logging.getLogger(__name__)

USABLE_STATUSES = frozenset({"ok", "timeout", "all_infeasible", "infeasible_choice"})
"""Decision statuses that carry a distribution (an `error` has none)."""
SUM_TOLERANCE = 1e-6


def _target(choice: PolicyChoice | None, n_options: int, width: int) -> NDArray[np.float64]:
    """A logged decision as a row over (options..., DEFER); zeros when it has no distribution."""
    row = np.zeros(width)
    if choice is None or choice.status not in USABLE_STATUSES:
        return row
    if len(choice.probabilities) != n_options:
        return row
    row[:n_options] = choice.probabilities
    row[-1] = choice.defer_probability or 0.0
    return row if abs(row.sum() - 1.0) <= SUM_TOLERANCE else np.zeros(width)


class DecisionLogRounds:
    """`RoundSource` on the decision log (module docstring)."""

    n_features: int | None = N_FEATURES

    def __init__(self, store: EvaluationStore, config: EvaluatorConfig) -> None:
        self.engine = store.engine
        self.config = config

    def joined(self, watched: Watched, cursor: Cursor) -> JoinedRounds | None:
        """New joined rounds as arrays (see `service.protocols.rounds.JoinedRounds`)."""
        p = watched.protocol
        baseline = None if p.baseline.policy is None else p.baseline.policy
        rows = joined_rounds(
            self.engine,
            candidate=(p.candidate.name, p.candidate.version),
            baseline=None if baseline is None else (baseline.name, baseline.version),
            started_at=watched.started_at,
            since=cursor.window(),
            limit=self.config.max_rows,
            with_payload=True,
        )
        keep = cursor.admit([r.request_id for r in rows], [r.joined_at for r in rows])
        rows = [r for r, k in zip(rows, keep, strict=True) if k]
        return _rounds(watched, rows) if rows else None

    def decisions(self, watched: Watched, cursor: Cursor) -> tuple[Decisions, Decisions | None]:
        """New decisions of the candidate and of a named baseline."""
        p = watched.protocol
        cand = (p.candidate.name, p.candidate.version)
        base = (
            None
            if p.baseline.policy is None
            else (p.baseline.policy.name, p.baseline.policy.version)
        )
        records = decision_records(
            self.engine,
            policies=[cand] + ([base] if base else []),
            started_at=watched.started_at,
            since=cursor.window(),
            limit=self.config.max_rows,
        )
        keep = cursor.admit(
            [f"{r.policy_name}@{r.policy_version}:{r.request_id}" for r in records],
            [r.scored_at for r in records],
        )
        records = [r for r, k in zip(records, keep, strict=True) if k]
        mine = _decisions([r for r in records if (r.policy_name, r.policy_version) == cand])
        theirs = (
            None
            if base is None
            else _decisions([r for r in records if (r.policy_name, r.policy_version) == base])
        )
        return mine, theirs

    def quality(self, watched: Watched) -> QualityCounts:
        """Data-quality counts now."""
        return quality_counts(
            self.engine, started_at=watched.started_at, join_grace_s=self.config.join_grace_s
        )

    def breaches(self, watched: Watched, cursor: Cursor) -> list[str]:
        """Runtime's acted placements are not stored yet (their RPC is not wired): none."""
        return []


def _decisions(records: Sequence[DecisionRecord]) -> Decisions:
    if not records:
        return Decisions.empty()
    status = np.array([r.status for r in records])
    return Decisions(
        error=status == "error",
        timeout=status == "timeout",
        raw_favourite_infeasible=np.array([r.raw_favourite_infeasible for r in records]),
        latency_ms=np.array([r.latency_us / 1e3 for r in records], dtype=np.float64),
    )


def _decoded(
    payload: bytes | None,
) -> tuple[NDArray[np.float32], NDArray[np.bool_], NDArray[np.bool_]] | None:
    """Option features, feasibility mask and violations of a logged request, or None."""
    if payload is None:
        return None
    try:
        request = decode_request(payload)
    except (DecodeError, InvalidInput) as err:
        log.warning("logged request could not be decoded for evaluation: %s", err)
        return None
    features = DEFAULT_FEATURES(request.state, request.workload, request.options)
    feasibility = check_feasibility(
        request.state, request.workload, request.options, request.quota_remaining
    )
    return np.asarray(features, np.float32), feasibility.mask, feasibility.violations


def _rounds(watched: Watched, rows: Sequence[JoinedRound]) -> JoinedRounds:
    p = watched.protocol
    n = len(rows)
    width = max(r.n_options for r in rows) + 1
    defer = width - 1
    action = np.full(n, defer, dtype=np.int64)
    pscore = np.full(n, np.nan)
    features = np.zeros((n, width - 1, N_FEATURES), dtype=np.float32)
    known_cost = np.zeros((n, width))
    infeasible = np.zeros(n, dtype=bool)
    for i, r in enumerate(rows):
        if r.production_option is not None and r.production_propensity is not None:
            action[i] = defer if r.production_option < 0 else r.production_option
            pscore[i] = r.production_propensity
        decoded = _decoded(r.payload)
        if decoded is None:
            continue
        f, mask, violations = decoded
        k = len(mask)
        features[i, :k] = f
        known_cost[i, :k] = p.cost.signal_cost(violations)  # the capacity group weighed once
        infeasible[i] = action[i] < k and not mask[action[i]]
    columns: dict[str, NDArray[np.float64]] = {
        name: np.array([_float(getattr(r, name)) for r in rows]) for name in REWARD_FIELDS
    }
    failures = np.array([p.cost.failure_weights.get(r.failure, 0.0) for r in rows])
    return JoinedRounds(
        reward=p.reward.evaluate(columns),
        cost=known_cost[np.arange(n), action] + failures,
        action=action,
        pscore=pscore,
        target=np.stack([_target(r.candidate, r.n_options, width) for r in rows]),
        baseline_target=None
        if p.baseline.is_production
        else np.stack([_target(r.baseline, r.n_options, width) for r in rows]),
        features=features,
        known_cost=known_cost,
        production_infeasible=infeasible,
    )


def _float(value: float | bool | None) -> float:
    return np.nan if value is None else float(value)


class StoredEvidence:
    """`EvidenceRecorder`: builds the package from the store and keeps a snapshot of it."""

    def __init__(self, store: EvaluationStore, records: ProtocolRecords) -> None:
        self.store = store
        self.records = records

    def snapshot(self, record: RecordedProtocol, holder: str, generation: int) -> None:
        """Package `record` as of its newest event and store it under that event."""
        events = self.records.events(record.protocol_id, record.version)
        history = self.store.history(record.protocol_id, record.version)
        package = build_package(record, events, history)
        self.store.store_evidence(
            EvidenceSnapshot(
                protocol_id=record.protocol_id,
                version=record.version,
                seq=record.seq,
                content_sha256=record.content_sha256,
                state=record.state.value,
                summary=package.summary,
                markdown=package.markdown,
                html=package.html,
                created_at=0.0,
                holder=holder,
                generation=generation,
            )
        )


def candidate_gate(service: Service, refresh_s: float = 2.0) -> CandidateGate:
    """The scorer's gate on this service's database (halted candidates are not scored)."""
    if service.engine is None:
        raise RuntimeError("the candidate gate needs the decision log (scoring_enabled)")
    return CandidateGate(EvaluationStore(service.engine).halted_candidates, refresh_s)


def calibration_monitor(service: Service) -> CalibrationMonitor | None:
    """The live calibration check of `service`'s predictor policies (None: there are none)."""
    engine, registry = service.engine, service.policies
    if engine is None or registry is None or not (names := predictor_policies(registry)):
        return None
    return CalibrationMonitor(
        names,
        lambda since: [
            rows
            for name in names
            for rows in read_calibration(
                engine, OpeFilter(policies=(name,)), outcomes_since=since, limit=MAX_WINDOW_ROWS
            )
        ],
        service.metrics,
        window_s=service.settings.calibration_window_s,
        interval_s=service.settings.calibration_interval_s,
    )


def outcome_drift_monitor(service: Service) -> OutcomeDriftMonitor | None:
    """The live outcome-drift check of `service`'s policies with an outcome reference
    (None: there are none); same window and interval as the calibration check."""
    engine, registry = service.engine, service.policies
    if engine is None or registry is None:
        return None
    summaries = {
        name: s.outcome
        for name, s in sorted(registry.training_summaries.items())
        if s.outcome is not None
    }
    if not summaries:
        return None
    return OutcomeDriftMonitor(
        summaries,
        lambda since: read_placed_outcomes(engine, outcomes_since=since, limit=MAX_WINDOW_OUTCOMES),
        service.metrics,
        window_s=service.settings.calibration_window_s,
        interval_s=service.settings.calibration_interval_s,
    )


def wire_evaluator(
    service: Service,
    config: EvaluatorConfig | None = None,
    *,
    gate: CandidateGate | None = None,
    before_apply: BeforeApply | None = None,
    holder: str | None = None,
) -> Evaluator:
    """Build the evaluator of `service` (not started: call `start()` after the service's).

    Args:
        service: a built service with its decision log (`service.engine`).
        config: loop tuning; defaults to `EvaluatorConfig()`.
        gate: the scorer's candidate gate, so a stop halts scoring at once here.
        before_apply: a test seam called just before a verdict is applied.
        holder: this replica's lease id (default: host, pid and a random suffix).
    """
    if service.engine is None:
        raise RuntimeError("the evaluator needs the decision log (scoring_enabled)")
    config = config or EvaluatorConfig()
    store = EvaluationStore(service.engine)
    protocols = ProtocolStore(service.engine)
    records = FencedProtocolRecords(protocols)
    loaded = service.policies
    desk = ProtocolDesk(
        records,
        policies=lambda: None if loaded is None else policy_refs(loaded),
        logging=protocols.logging_profile,
    )
    lease = Lease(store, config.lease_name, holder or holder_id(), config.lease_ttl_s)
    observer: EvaluatorObserver = EvaluatorMetrics(service.metrics)
    calibration = calibration_monitor(service)
    if calibration is not None:  # a step after each tick (docs/calibration.md)
        observer = CalibrationStep(observer, calibration)
    outcome_drift = outcome_drift_monitor(service)
    if outcome_drift is not None:  # the same kind of step (docs/drift.md, "Outcome drift")
        observer = CalibrationStep(observer, outcome_drift)
    return Evaluator(
        desk,
        store,
        DecisionLogRounds(store, config),
        lease,
        observer,
        StoredEvidence(store, records),
        config,
        gate,
        before_apply,
    )
