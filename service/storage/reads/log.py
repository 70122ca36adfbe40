"""Reads of the decision log: counts, a request's decisions, its raw payload.

Plain dataclasses out, Unix seconds for times, numpy arrays for the score and
probability blobs, `Unavailable` when the database cannot be reached.
Outcome queries live in `service.storage.log.outcomes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import Engine, Float, cast, extract, func, select

from service.contract.errors import NotFound
from service.storage.engine import unavailable_on_failure
from service.storage.log import tables as t
from service.storage.log.convert import unpack_probabilities, unpack_scores
from service.storage.log.payload import stored_payload


@dataclass(frozen=True, eq=False)
class LoggedDecision:
    """One decision as logged (see `service.storage.log.rows.DecisionRow` for the fields).

    ``scores`` is float32 and ``probabilities`` float64, shape ``(n_options,)``.
    """

    request_id: str
    request_time: float
    policy_name: str
    policy_version: str
    status: str
    chosen_option: int
    chosen_probability: float | None
    production_probability: float | None
    defer_probability: float | None
    scores: NDArray[np.float32]
    probabilities: NDArray[np.float64]
    predicted: dict[str, float] | None
    raw_favourite_infeasible: bool
    agrees_with_production: bool | None
    latency_us: int
    error: str | None
    scored_at: float


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    """A logged request's indexed columns (the payload: `load_raw_request`)."""

    request_id: str
    request_time: float
    received_at: float
    journal_seq: int
    workload_id: str
    workload_kind: str
    tenant: str
    n_options: int
    feature_version: str
    feature_hash: str
    production_option: int | None
    production_propensity: float | None
    production_source: str | None
    feasibility_version: str | None = None
    """``requests.feasibility_version``; None before migration 0010 (read: `logged_mask`)."""
    feasibility_bits: bytes | None = None
    """``requests.feasibility_bits``: uint16 LE per option; None when not logged."""


def _epoch(column: Any) -> Any:
    return cast(extract("epoch", column), Float)


def count_requests(engine: Engine) -> int:
    """Logged requests (rows, across every partition)."""
    with unavailable_on_failure("counting requests"), engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(t.requests)).scalar_one())


def logged_request(engine: Engine, request_id: str) -> LoggedRequest:
    """The logged request `request_id` (the latest, if an id was reused).

    Raises:
        NotFound: no request with that id is logged.
        Unavailable: the database cannot be reached.
    """
    r = t.requests
    query = (
        select(
            r.c.request_id,
            _epoch(r.c.request_time),
            _epoch(r.c.received_at),
            r.c.journal_seq,
            r.c.workload_id,
            r.c.workload_kind,
            r.c.tenant,
            r.c.n_options,
            r.c.feature_version,
            r.c.feature_hash,
            r.c.production_option,
            r.c.production_propensity,
            r.c.production_source,
            r.c.feasibility_version,
            r.c.feasibility_bits,
        )
        .where(r.c.request_id == request_id)
        .order_by(r.c.request_time.desc())
        .limit(1)
    )
    with unavailable_on_failure("reading a request"), engine.connect() as conn:
        row = conn.execute(query).first()
    if row is None:
        raise NotFound(f"`request_id` {request_id!r} is not in the decision log")
    return LoggedRequest(
        request_id=row[0],
        request_time=row[1],
        received_at=row[2],
        journal_seq=row[3],
        workload_id=row[4],
        workload_kind=row[5],
        tenant=row[6],
        n_options=row[7],
        feature_version=row[8],
        feature_hash=row[9],
        production_option=row[10],
        production_propensity=row[11],
        production_source=row[12],
        feasibility_version=row[13],
        feasibility_bits=bytes(row[14]) if row[14] is not None else None,
    )


def count_decisions(engine: Engine, policy: str | None = None, *, status: str | None = None) -> int:
    """Logged decisions, optionally of one policy (any version) and one status."""
    d = t.decisions
    query = select(func.count()).select_from(d)
    if policy is not None:
        query = query.where(d.c.policy_name == policy)
    if status is not None:
        query = query.where(d.c.status == status)
    with unavailable_on_failure("counting decisions"), engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


def decisions_for(engine: Engine, request_id: str) -> list[LoggedDecision]:
    """Every logged decision on `request_id`, ordered by policy name and version."""
    d = t.decisions
    query = (
        select(
            d.c.request_id,
            _epoch(d.c.request_time),
            d.c.policy_name,
            d.c.policy_version,
            d.c.status,
            d.c.chosen_option,
            d.c.chosen_probability,
            d.c.production_probability,
            d.c.defer_probability,
            d.c.scores_f32,
            d.c.probabilities_f64,
            d.c.predicted,
            d.c.raw_favourite_infeasible,
            d.c.agrees_with_production,
            d.c.latency_us,
            d.c.error,
            _epoch(d.c.scored_at),
        )
        .where(d.c.request_id == request_id)
        .order_by(d.c.policy_name, d.c.policy_version, d.c.request_time)
    )
    with unavailable_on_failure("reading decisions"), engine.connect() as conn:
        rows = conn.execute(query).all()
    return [
        LoggedDecision(
            *row[:9],
            scores=unpack_scores(row[9]),
            probabilities=unpack_probabilities(row[10]),
            predicted=row[11],
            raw_favourite_infeasible=row[12],
            agrees_with_production=row[13],
            latency_us=row[14],
            error=row[15],
            scored_at=row[16],
        )
        for row in rows
    ]


def load_raw_request(engine: Engine, request_id: str) -> bytes:
    """The journal payload of `request_id` exactly as received (for ``understudy replay``).

    Decompresses the stored payload and puts its cluster-state snapshot back
    in place. If a request id was (wrongly) reused at different request
    times, the latest is returned.

    Raises:
        NotFound: no request with that id is logged.
        Unavailable: the database cannot be reached.
    """
    r, s = t.requests, t.cluster_snapshots
    query = (
        select(r.c.payload_zstd, r.c.state_offset, s.c.state_zstd)
        .select_from(r.outerjoin(s, s.c.snapshot_hash == r.c.snapshot_hash))
        .where(r.c.request_id == request_id)
        .order_by(r.c.request_time.desc())
        .limit(1)
    )
    with unavailable_on_failure("reading a raw request"), engine.connect() as conn:
        row = conn.execute(query).first()
    if row is None:
        raise NotFound(f"`request_id` {request_id!r} is not in the decision log")
    payload_zstd, offset, state_zstd = row
    if offset is not None and state_zstd is None:
        raise NotFound(f"cluster-state snapshot of request {request_id!r} is missing")
    return stored_payload(payload_zstd, offset, state_zstd)


def reused_request_ids(engine: Engine, *, limit: int = 100) -> list[tuple[str, int]]:
    """Request ids logged more than once with different request times, with counts.

    Uniqueness is on ``(request_id, request_time)`` because the partition key
    must be in every unique key; Runtime's ids are unique by contract, so any
    row here is a Runtime bug worth a look.
    """
    r = t.requests
    query = (
        select(r.c.request_id, func.count())
        .group_by(r.c.request_id)
        .having(func.count() > 1)
        .order_by(r.c.request_id)
        .limit(limit)
    )
    with unavailable_on_failure("checking request ids"), engine.connect() as conn:
        return [(str(a), int(b)) for a, b in conn.execute(query)]
