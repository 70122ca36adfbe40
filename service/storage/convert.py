"""Build decision-log rows from contract objects and policy outputs.

The scorer calls these once per request (``rows_from``), once per policy per
micro-batch (``decision_rows``) and once per outcome (``outcome_row``); they
do the per-row work (payload split, hashing, compression, blob packing) off
the database transaction so the transaction itself is only COPY and SQL.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from service.contract import DEFER, MirrorRequest, Outcome
from service.policies.base import PolicyDecisions
from service.storage.payload import compress, snapshot_hash, split_state
from service.storage.rows import DecisionRow, OutcomeRow, RequestRow, SnapshotRow

SCORES_DTYPE = np.dtype("<f4")
"""Layout of ``decisions.scores_f32``."""
PROBABILITIES_DTYPE = np.dtype("<f8")
"""Layout of ``decisions.probabilities_f64``."""


def rows_from(
    request: MirrorRequest,
    payload: bytes,
    journal_seq: int,
    received_at: float,
    feature_version: str,
    feature_hash: str,
) -> tuple[RequestRow, SnapshotRow | None]:
    """The request row and its cluster-state snapshot row for one journaled mirror.

    Args:
        request: the decoded request (for the indexed columns).
        payload: the journal payload, a serialized ``understudy.v1.MirrorRequest``;
            stored compressed, with the state cut out into the snapshot.
        journal_seq: the journal sequence number of the record.
        received_at: when ingest accepted it, Unix seconds.
        feature_version, feature_hash: the feature definition used to score it.

    Returns:
        ``(request_row, snapshot_row)``; the snapshot is None when the payload
        could not be split (it is then stored whole, see `split_state`).
    """
    split = split_state(payload)
    snapshot: SnapshotRow | None = None
    digest: bytes | None = None
    if split.state is not None:
        digest = snapshot_hash(split.state)
        snapshot = SnapshotRow(
            snapshot_hash=digest,
            state_zstd=compress(split.state),
            n_nodes=request.state.n_nodes,
            raw_bytes=len(split.state),
        )
    production = request.production
    workload = request.workload
    row = RequestRow(
        request_id=request.request_id,
        request_time=request.request_time,
        received_at=received_at,
        journal_seq=journal_seq,
        schema_version=request.schema_version,
        workload_id=workload.workload_id,
        workload_kind=workload.kind.value,
        tenant=workload.tenant,
        model_family=workload.model_family,
        accelerators_requested=workload.accelerators,
        priority=workload.priority,
        n_options=request.options.n_options,
        n_nodes=request.state.n_nodes,
        snapshot_hash=digest,
        state_offset=split.offset,
        payload_zstd=compress(split.rest),
        feature_version=feature_version,
        feature_hash=feature_hash,
        production_option=production.option if production is not None else None,
        production_propensity=production.propensity if production is not None else None,
    )
    return row, snapshot


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _probability_of(
    option: int, start: int, n_options: int, probs: NDArray[np.float64], defer: float
) -> float | None:
    if option == DEFER:
        return _finite(defer)
    if 0 <= option < n_options:
        return _finite(float(probs[start + option]))
    return None


def decision_rows(
    requests: Sequence[MirrorRequest],
    offsets: NDArray[np.int64],
    decisions: PolicyDecisions,
    *,
    policy_name: str,
    policy_version: str,
    latency_us: int | Sequence[int],
    scored_at: float,
    errors: Sequence[str | None] | None = None,
) -> list[DecisionRow]:
    """One `DecisionRow` per request of a scored micro-batch.

    Args:
        requests: the batch's requests, in batch order.
        offsets: int64, shape ``(n_requests + 1,)``: request ``r`` owns option
            rows ``offsets[r]:offsets[r + 1]`` of the decision arrays.
        decisions: the policy's output for the batch.
        policy_name, policy_version: the policy's registry identity.
        latency_us: one latency for every row, or one per request.
        scored_at: Unix seconds.
        errors: optional message per request (for error / timeout statuses).

    Non-finite scalar probabilities are stored as NULL; the blobs keep the
    arrays exactly as the policy returned them.
    """
    n = len(requests)
    if len(offsets) != n + 1:
        raise ValueError(
            f"`offsets` must have n_requests + 1 ({n + 1}) entries, got {len(offsets)}"
        )
    latencies = [latency_us] * n if isinstance(latency_us, int) else list(latency_us)
    if len(latencies) != n:
        raise ValueError(f"`latency_us` must have {n} entries, got {len(latencies)}")
    scores = np.asarray(decisions.scores, dtype=SCORES_DTYPE)
    probs = np.asarray(decisions.probabilities, dtype=PROBABILITIES_DTYPE)
    rows: list[DecisionRow] = []
    for r, request in enumerate(requests):
        start, end = int(offsets[r]), int(offsets[r + 1])
        n_options = end - start
        chosen = int(decisions.chosen[r])
        defer = float(decisions.defer_probability[r])
        production = request.production
        predicted: dict[str, float] | None = None
        if decisions.predictions and 0 <= chosen < n_options:
            predicted = {
                name: float(values[start + chosen])
                for name, values in decisions.predictions.items()
                if math.isfinite(float(values[start + chosen]))
            }
        rows.append(
            DecisionRow(
                request_id=request.request_id,
                request_time=request.request_time,
                policy_name=policy_name,
                policy_version=policy_version,
                status=str(decisions.status[r]),
                chosen_option=chosen,
                chosen_probability=_probability_of(chosen, start, n_options, probs, defer),
                production_probability=(
                    _probability_of(production.option, start, n_options, probs, defer)
                    if production is not None
                    else None
                ),
                defer_probability=_finite(defer),
                scores_f32=scores[start:end].tobytes(),
                probabilities_f64=probs[start:end].tobytes(),
                predicted=predicted,
                raw_favourite_infeasible=bool(decisions.raw_favourite_infeasible[r]),
                agrees_with_production=(
                    chosen == production.option if production is not None else None
                ),
                latency_us=int(latencies[r]),
                error=errors[r] if errors is not None else None,
                scored_at=scored_at,
            )
        )
    return rows


def outcome_row(outcome: Outcome, received_at: float, journal_seq: int | None = None) -> OutcomeRow:
    """The row for one reported outcome (production's decision included, if sent)."""
    production = outcome.production
    return OutcomeRow(
        request_id=outcome.request_id,
        observed_at=outcome.observed_at,
        received_at=received_at,
        queue_delay_s=outcome.queue_delay_s,
        throughput=outcome.throughput,
        completion_time_s=outcome.completion_time_s,
        slo_met=outcome.slo_met,
        failure=outcome.failure.value,
        production_option=production.option if production is not None else None,
        production_propensity=production.propensity if production is not None else None,
        journal_seq=journal_seq,
    )


def unpack_scores(blob: bytes) -> NDArray[np.float32]:
    """Decode ``decisions.scores_f32``."""
    return np.frombuffer(blob, dtype=SCORES_DTYPE).astype(np.float32)


def unpack_probabilities(blob: bytes) -> NDArray[np.float64]:
    """Decode ``decisions.probabilities_f64``."""
    return np.frombuffer(blob, dtype=PROBABILITIES_DTYPE).astype(np.float64)
