"""Build decision-log rows from contract objects and policy outputs.

The decision-log sink calls these once per request (``rows_from``) and once
per outcome (``outcome_row``); they do the per-row work (payload split,
hashing, compression) off the database transaction so the transaction itself
is only COPY and SQL. Decision rows are built in one place,
`service.server.decision_log.decision_row`, from the scorer's decisions; the blob
layouts it packs are named here, beside their readers.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from service.contract import MirrorRequest, Outcome, ProductionDecision
from service.contract.identity import content_sha256
from service.contract.production import defer_of, effective_propensity
from service.storage.log.payload import compress, snapshot_hash, split_state
from service.storage.log.rows import OutcomeRow, RequestRow, SnapshotRow

SCORES_DTYPE = np.dtype("<f4")
"""Layout of ``decisions.scores_f32``."""
PROBABILITIES_DTYPE = np.dtype("<f8")
"""Layout of ``decisions.probabilities_f64`` and ``requests.production_probabilities_f64``."""


def pack_production_distribution(production: ProductionDecision | None) -> bytes | None:
    """``requests.production_probabilities_f64``: production's probabilities over the
    options, then its defer probability (absent = 0), float64 LE; None when not sent."""
    if production is None or production.probabilities is None:
        return None
    values = [*production.probabilities, defer_of(production)]
    return np.asarray(values, dtype=PROBABILITIES_DTYPE).tobytes()


def rows_from(
    request: MirrorRequest,
    payload: bytes,
    journal_seq: int,
    received_at: float,
    feature_version: str,
    feature_hash: str,
    feasibility_version: str | None = None,
    feasibility_bits: bytes | None = None,
    *,
    content_digest: bytes | None = None,
) -> tuple[RequestRow, SnapshotRow | None]:
    """The request row and its cluster-state snapshot row for one journaled mirror.

    Args:
        request: the decoded request (for the indexed columns).
        payload: the journal payload, a serialized ``understudy.v1.MirrorRequest``;
            stored compressed, with the state cut out into the snapshot.
        journal_seq: the journal sequence number of the record.
        received_at: when ingest accepted it, Unix seconds.
        feature_version, feature_hash: the feature definition used to score it.
        feasibility_version, feasibility_bits: the per-option signal bits of the
            scoring pass (`service.pipeline.feasibility_log`); None: not known.
        content_digest: `content_sha256` of `request` when already known (ingest computed it
            for a batch record's request); None: computed here.

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
        workload_kind=str(workload.kind),
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
        # a decision sent with its whole distribution but no propensity logs the
        # chosen action's probability in it (service.contract.production)
        production_propensity=effective_propensity(production) if production is not None else None,
        production_probabilities_f64=pack_production_distribution(production),
        content_sha256=(content_digest if content_digest is not None else content_sha256(request)),
        feasibility_version=feasibility_version if feasibility_bits is not None else None,
        feasibility_bits=feasibility_bits,
        qos_class=workload.qos_class,
    )
    return row, snapshot


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
        production_propensity=effective_propensity(production) if production is not None else None,
        journal_seq=journal_seq,
    )


def unpack_scores(blob: bytes) -> NDArray[np.float32]:
    """Decode ``decisions.scores_f32``."""
    return np.frombuffer(blob, dtype=SCORES_DTYPE).astype(np.float32)


def unpack_probabilities(blob: bytes) -> NDArray[np.float64]:
    """Decode ``decisions.probabilities_f64`` (and ``requests.production_probabilities_f64``:
    the options, then defer last)."""
    return np.frombuffer(blob, dtype=PROBABILITIES_DTYPE).astype(np.float64)
