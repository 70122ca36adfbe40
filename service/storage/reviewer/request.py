"""One request in full, for a safety reviewer: what it was, what every policy did, what came of it.

The request is decoded from the stored journal payload (the bytes Runtime
sent, cluster state put back), its feasibility and features recomputed by the
same functions the scorer runs (`check_feasibility`, the `FeatureFunction`),
and shown beside every logged decision, the per-option signal bits the scorer
logged (read with their own version's signal names), with its scores and probabilities
decoded, the joined (or still pending) outcome, and the protocol versions
that were running when it was received. Takes an open `Connection`, like
`service.storage.reviewer.reads`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import Connection, select

from service.contract import (
    Feasibility,
    FeatureFunction,
    MirrorRequest,
    NotFound,
    check_feasibility,
)
from service.storage.log import tables as t
from service.storage.log.convert import unpack_probabilities, unpack_scores
from service.storage.log.masks import LoggedMask, logged_mask
from service.storage.log.payload import decode_request, stored_payload
from service.storage.reads.log import LoggedDecision
from service.storage.reviewer.reads import (
    ExperimentItem,
    experiment_item,
    experiments_view,
    seconds,
)


@dataclass(frozen=True, slots=True)
class ReplayedFeatures:
    """The request's features recomputed now: float32, shape ``(n_options, len(names))``."""

    names: tuple[str, ...]
    version: str
    definition_hash: str
    logged_hash: str
    values: NDArray[np.float32]

    @property
    def same_definition(self) -> bool:
        """Whether the scorer used this very feature definition when it logged the request."""
        return self.definition_hash == self.logged_hash


@dataclass(frozen=True)
class RequestInFull:
    """Everything the log knows about one request (see module docstring)."""

    request_id: str
    request_time: float
    received_at: float
    journal_seq: int
    production_source: str | None
    request: MirrorRequest
    feasibility: Feasibility
    logged_feasibility: LoggedMask
    """The per-option signal bits the scorer logged (``not logged`` before migration 0010)."""
    features: ReplayedFeatures
    decisions: list[LoggedDecision]
    outcome: dict[str, Any] | None
    protocols: list[ExperimentItem]


def _outcome(conn: Connection, request_id: str, request_time: datetime) -> dict[str, Any] | None:
    o, p = t.outcomes, t.pending_outcomes
    fields = (
        "observed_at",
        "received_at",
        "queue_delay_s",
        "throughput",
        "completion_time_s",
        "slo_met",
        "failure",
        "production_option",
        "production_propensity",
    )
    row = conn.execute(
        select(*(o.c[f] for f in fields), o.c.join_state, o.c.joined_at).where(
            o.c.request_id == request_id, o.c.request_time == request_time
        )
    ).first()
    if row is None:
        row = conn.execute(
            select(*(p.c[f] for f in fields)).where(p.c.request_id == request_id)
        ).first()
        if row is None:
            return None
        found = dict(row._mapping) | {"join_state": "pending", "joined_at": None}
    else:
        found = dict(row._mapping)
    return {k: seconds(v) if isinstance(v, datetime) else v for k, v in found.items()}


def _decisions(conn: Connection, request_id: str, request_time: datetime) -> list[LoggedDecision]:
    d = t.decisions
    query = (
        select(d)
        .where(d.c.request_id == request_id, d.c.request_time == request_time)
        .order_by(d.c.policy_name, d.c.policy_version)
    )
    out = []
    for row in conn.execute(query):
        m = row._mapping
        out.append(
            LoggedDecision(
                **{
                    k: m[k]
                    for k in LoggedDecision.__dataclass_fields__
                    if k not in ("request_time", "scored_at", "scores", "probabilities")
                },
                request_time=m["request_time"].timestamp(),
                scored_at=m["scored_at"].timestamp(),
                scores=unpack_scores(m["scores_f32"]),
                probabilities=unpack_probabilities(m["probabilities_f64"]),
            )
        )
    return out


def request_in_full(conn: Connection, request_id: str, features: FeatureFunction) -> RequestInFull:
    """One request: its payload decoded, features replayed, decisions, outcome, protocols.

    If a request id was (wrongly) reused at different request times, the latest is shown.

    Raises:
        NotFound: no request with that id is logged.
    """
    r, s = t.requests, t.cluster_snapshots
    row = conn.execute(
        select(
            r.c.request_time,
            r.c.received_at,
            r.c.journal_seq,
            r.c.production_source,
            r.c.feature_hash,
            r.c.feasibility_version,
            r.c.feasibility_bits,
            r.c.payload_zstd,
            r.c.state_offset,
            s.c.state_zstd,
        )
        .select_from(r.outerjoin(s, s.c.snapshot_hash == r.c.snapshot_hash))
        .where(r.c.request_id == request_id)
        .order_by(r.c.request_time.desc())
        .limit(1)
    ).first()
    if row is None:
        raise NotFound(f"`request_id` {request_id!r} is not in the decision log")
    request = decode_request(stored_payload(row.payload_zstd, row.state_offset, row.state_zstd))
    replayed = ReplayedFeatures(
        names=features.names,
        version=features.version,
        definition_hash=features.definition_hash,
        logged_hash=row.feature_hash,
        values=features(request.state, request.workload, request.options),
    )
    v = experiments_view.c
    in_force = (
        select(experiments_view)
        .where(
            v.started_at <= row.received_at,
            (v.ended_at.is_(None)) | (v.ended_at > row.received_at),
        )
        .order_by(v.protocol_id, v.version)
    )
    return RequestInFull(
        request_id=request_id,
        request_time=row.request_time.timestamp(),
        received_at=row.received_at.timestamp(),
        journal_seq=row.journal_seq,
        production_source=row.production_source,
        request=request,
        feasibility=check_feasibility(
            request.state, request.workload, request.options, request.quota_remaining
        ),
        logged_feasibility=logged_mask(row.feasibility_version, row.feasibility_bits),
        features=replayed,
        decisions=_decisions(conn, request_id, row.request_time),
        outcome=_outcome(conn, request_id, row.request_time),
        protocols=[experiment_item(x) for x in conn.execute(in_force)],
    )
