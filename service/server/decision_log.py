"""The decision log as the scorer's sink (composition glue between pipeline and storage).

Implements `service.pipeline.scorer.DecisionSink` on `DecisionLogWriter`, so
the pipeline knows nothing of SQL and the storage layer nothing of scoring.
Policies are registered with their artifact hash on first sight, in the same
transaction as their first decisions.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping

import numpy as np

from service.contract import DEFER
from service.pipeline.feasibility_log import LoggedFeasibility
from service.pipeline.scorer import ScoredBatch, SinkResult
from service.pipeline.scoring import ScoredDecision
from service.policies.base import DecisionStatus
from service.policies.manifest import Manifest
from service.storage.log.convert import PROBABILITIES_DTYPE, SCORES_DTYPE, outcome_row, rows_from
from service.storage.log.rows import DecisionRow, LogBatch, PolicyRow, SnapshotRow
from service.storage.log.writer import DecisionLogWriter


def _optional(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


_STATUS_VALUES = {status: status.value for status in DecisionStatus}
"""`DecisionStatus.value` by member: a dict lookup, not an enum property, per logged row."""


def decision_row(d: ScoredDecision, scored_at: float) -> DecisionRow:
    """The log row of one scored decision; predictions kept for the chosen option.

    The one decision-row builder: `DecisionLogSink` calls it for every decision
    of a batch, and the storage tests build their rows with it.

    Runs once per request per policy on the scorer's thread, so each value is
    read once (a prediction is converted once, not once to test and once to keep).
    """
    chosen = d.chosen
    predicted = None
    if d.predictions and chosen != DEFER:
        predicted = {}
        for name, values in d.predictions.items():
            value = float(values[chosen])
            if math.isfinite(value):
                predicted[name] = value
    return DecisionRow(
        request_id=d.request_id,
        request_time=d.request_time,
        policy_name=d.policy,
        policy_version=d.policy_version,
        status=_STATUS_VALUES.get(d.status) or d.status.value,
        chosen_option=chosen,
        chosen_probability=_optional(d.chosen_probability),
        production_probability=_optional(d.production_probability),
        defer_probability=_optional(d.defer_probability),
        scores_f32=np.asarray(d.scores, dtype=SCORES_DTYPE).tobytes(),
        probabilities_f64=np.asarray(d.probabilities, dtype=PROBABILITIES_DTYPE).tobytes(),
        predicted=predicted,
        raw_favourite_infeasible=d.raw_favourite_infeasible,
        agrees_with_production=d.agrees_with_production,
        latency_us=round(d.latency_us),
        error=d.error,
        scored_at=scored_at,
    )


class DecisionLogSink:
    """`DecisionSink` over PostgreSQL."""

    def __init__(
        self,
        writer: DecisionLogWriter,
        manifests: Mapping[str, Manifest] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._writer = writer
        self._manifests = dict(manifests or {})
        self._clock = clock
        self._registered: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def _policy_rows(self, batch: ScoredBatch, now: float) -> list[PolicyRow]:
        rows = []
        for policy in batch.policies:
            key = (str(policy.name), str(policy.version))
            if key in self._registered:
                continue
            manifest = self._manifests.get(key[0])
            rows.append(
                PolicyRow(
                    name=key[0],
                    version=key[1],
                    kind=manifest.kind.value if manifest else "baseline",
                    sha256=manifest.model_sha256 if manifest else None,
                    feature_version=batch.feature_version,
                    feature_hash=batch.feature_hash,
                    registered_at=now,
                )
            )
        return rows

    def write(self, batch: ScoredBatch) -> SinkResult:
        """Commit the batch; `Unavailable` propagates and nothing is committed."""
        with self._lock:
            now = self._clock()
            requests = []
            snapshots: dict[bytes, SnapshotRow] = {}
            feasibility = batch.feasibility or LoggedFeasibility("", {})
            for logged in batch.requests:
                row, snapshot = rows_from(
                    logged.request,
                    logged.payload,
                    logged.seq,
                    logged.received_at,
                    batch.feature_version,
                    batch.feature_hash,
                    *feasibility.of(logged.key),
                    content_digest=logged.digest,
                )
                requests.append(row)
                if snapshot is not None:
                    snapshots[snapshot.snapshot_hash] = snapshot
            policies = self._policy_rows(batch, now)
            result = self._writer.write(
                LogBatch(
                    requests=requests,
                    snapshots=list(snapshots.values()),
                    decisions=[decision_row(d, now) for d in batch.decisions],
                    outcomes=[outcome_row(o.outcome, o.received_at, o.seq) for o in batch.outcomes],
                    policies=policies,
                )
            )
            self._registered |= {(p.name, p.version) for p in policies}
            oc = result.outcomes
            return SinkResult(
                requests_inserted=result.requests.inserted,
                decisions_inserted=result.decisions.inserted,
                outcomes_joined=oc.joined,
                outcomes_parked=oc.pending,
                outcomes_joined_from_parked=oc.joined_from_pending,
                duplicates=result.requests.duplicates + result.decisions.duplicates + oc.duplicates,
                outcome_delays_s=tuple(oc.outcome_delays_s),
                request_conflicts=result.request_conflicts,
            )
