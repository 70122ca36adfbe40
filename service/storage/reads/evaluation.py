"""Reads of the decision log for the evaluator: joined rounds, decisions, data-quality counts.

An experiment's rows are the requests received since it started. Rows
arrive late and out of order (outcomes join days later; several writers
commit concurrently), so the incremental reads take a time cursor and an
overlap: ``ts > since - overlap`` by the row's own time (``outcomes.joined_at``
for rounds, ``decisions.scored_at`` for decisions), and the caller drops the
ids it has already seen (``service.evaluator.loop.Cursor``). Every read is
bounded by `limit`, oldest first, so a long backlog is consumed over several
ticks. `Unavailable` when the database cannot be reached.

The experiment's window is by `received_at` (Understudy's clock), not by
`request_time` (Runtime's, which may be anything — the simulator's starts at
zero), so these reads do not prune day partitions: a known cost for very
long experiments (docs/evaluator.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import Engine, Float, and_, cast, extract, func, literal, or_, select

from service.protocols.rounds import QualityCounts
from service.storage.engine import unavailable_on_failure
from service.storage.log import tables as t
from service.storage.log.convert import unpack_probabilities
from service.storage.log.payload import stored_payload


@dataclass(frozen=True, eq=False)
class PolicyChoice:
    """A policy's logged decision: status and its distribution over (options..., DEFER)."""

    status: str
    probabilities: NDArray[np.float64]
    defer_probability: float | None


@dataclass(frozen=True, eq=False)
class JoinedRound:
    """One request of the experiment with its joined outcome (Unix seconds for times).

    `payload` is the raw request (journal bytes, state put back) when asked for.
    """

    request_id: str
    joined_at: float
    n_options: int
    production_option: int | None
    production_propensity: float | None
    candidate: PolicyChoice | None
    baseline: PolicyChoice | None
    queue_delay_s: float | None
    throughput: float | None
    completion_time_s: float | None
    slo_met: bool | None
    failure: str
    payload: bytes | None


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One logged decision of a watched policy."""

    request_id: str
    scored_at: float
    policy_name: str
    policy_version: str
    status: str
    raw_favourite_infeasible: bool
    latency_us: int


def _epoch(column: Any) -> Any:
    return cast(extract("epoch", column), Float)


def _choice(status: str | None, blob: bytes | None, defer: float | None) -> PolicyChoice | None:
    if status is None or blob is None:
        return None
    return PolicyChoice(status, unpack_probabilities(blob), defer)


def joined_rounds(
    engine: Engine,
    *,
    candidate: tuple[str, str],
    baseline: tuple[str, str] | None,
    started_at: float,
    since: float,
    limit: int,
    with_payload: bool,
) -> list[JoinedRound]:
    """Experiment requests whose outcome joined after `since`, oldest join first."""
    o, r, s = t.outcomes, t.requests, t.cluster_snapshots
    cand, base = t.decisions.alias("cand"), t.decisions.alias("base")

    def on(d: Any, policy: tuple[str, str]) -> Any:
        name, version = policy
        return and_(
            d.c.request_id == r.c.request_id,
            d.c.request_time == r.c.request_time,
            d.c.policy_name == name,
            d.c.policy_version == version,
        )

    payload = (
        (r.c.payload_zstd, r.c.state_offset, s.c.state_zstd)
        if with_payload
        else (literal(None), literal(None), literal(None))
    )
    source = o.join(
        r, and_(r.c.request_id == o.c.request_id, r.c.request_time == o.c.request_time)
    ).outerjoin(cand, on(cand, candidate))
    theirs: tuple[Any, ...] = (literal(None), literal(None), literal(None))
    if baseline is not None:
        source = source.outerjoin(base, on(base, baseline))
        theirs = (base.c.status, base.c.probabilities_f64, base.c.defer_probability)
    if with_payload:
        source = source.outerjoin(s, s.c.snapshot_hash == r.c.snapshot_hash)
    query = (
        select(
            r.c.request_id,
            _epoch(o.c.joined_at),
            r.c.n_options,
            r.c.production_option,
            r.c.production_propensity,
            cand.c.status,
            cand.c.probabilities_f64,
            cand.c.defer_probability,
            *theirs,
            o.c.queue_delay_s,
            o.c.throughput,
            o.c.completion_time_s,
            o.c.slo_met,
            o.c.failure,
            *payload,
        )
        .select_from(source)
        .where(
            r.c.received_at >= func.to_timestamp(started_at),
            o.c.joined_at > func.to_timestamp(since),
        )
        .order_by(o.c.joined_at, r.c.request_id)
        .limit(limit)
    )
    with unavailable_on_failure("reading joined rounds"), engine.connect() as conn:
        rows = conn.execute(query).all()
    out = []
    for row in rows:
        raw = None
        if with_payload and row[16] is not None:
            raw = stored_payload(row[16], row[17], row[18])
        out.append(
            JoinedRound(
                request_id=row[0],
                joined_at=float(row[1]),
                n_options=int(row[2]),
                production_option=row[3],
                production_propensity=row[4],
                candidate=_choice(row[5], row[6], row[7]),
                baseline=_choice(row[8], row[9], row[10]),
                queue_delay_s=row[11],
                throughput=row[12],
                completion_time_s=row[13],
                slo_met=row[14],
                failure=row[15],
                payload=raw,
            )
        )
    return out


def decision_records(
    engine: Engine,
    *,
    policies: list[tuple[str, str]],
    started_at: float,
    since: float,
    limit: int,
) -> list[DecisionRecord]:
    """Decisions of `policies` on experiment requests, scored after `since`, oldest first."""
    d, r = t.decisions, t.requests
    wanted = [and_(d.c.policy_name == n, d.c.policy_version == v) for n, v in policies]
    if not wanted:
        return []
    query = (
        select(
            d.c.request_id,
            _epoch(d.c.scored_at),
            d.c.policy_name,
            d.c.policy_version,
            d.c.status,
            d.c.raw_favourite_infeasible,
            d.c.latency_us,
        )
        .select_from(
            d.join(r, and_(r.c.request_id == d.c.request_id, r.c.request_time == d.c.request_time))
        )
        .where(
            or_(*wanted),
            r.c.received_at >= func.to_timestamp(started_at),
            d.c.scored_at > func.to_timestamp(since),
        )
        .order_by(d.c.scored_at, d.c.request_id)
        .limit(limit)
    )
    with unavailable_on_failure("reading decisions"), engine.connect() as conn:
        return [
            DecisionRecord(a, float(b), c, v, s, bool(f), int(lat))
            for a, b, c, v, s, f, lat in conn.execute(query)
        ]


def quality_counts(engine: Engine, *, started_at: float, join_grace_s: float) -> QualityCounts:
    """Data-quality counts over the experiment's requests, as of now.

    An outcome is due for requests received more than `join_grace_s` ago.
    Mirror coverage needs Runtime's request counts, not stored yet: None.
    """
    r, o = t.requests, t.outcomes
    due = r.c.received_at <= func.now() - func.make_interval(0, 0, 0, 0, 0, 0, join_grace_s)
    decided = r.c.production_option.is_not(None)
    query = (
        select(
            func.count(),
            func.count().filter(due),
            func.count(o.c.request_id).filter(due),
            func.count().filter(decided),
            func.count().filter(and_(decided, r.c.production_propensity.is_(None))),
        )
        .select_from(
            r.outerjoin(
                o, and_(o.c.request_id == r.c.request_id, o.c.request_time == r.c.request_time)
            )
        )
        .where(
            r.c.received_at >= func.to_timestamp(started_at),
        )
    )
    with unavailable_on_failure("counting data quality"), engine.connect() as conn:
        mirrored, requests_due, joined_due, decisions, missing = conn.execute(query).one()
    return QualityCounts(
        requests_due=int(requests_due),
        joined_due=int(joined_due),
        production_decisions=int(decisions),
        missing_propensity=int(missing),
        mirrored=int(mirrored),
        runtime_requests=None,
    )
