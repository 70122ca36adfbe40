"""Outcome join: by ``request_id``, late, early, twice, or for a request never seen.

Where an outcome lives depends on whether its request is logged:

* ``outcomes`` (partitioned by the request's ``request_time``): joined
  outcomes, ``join_state`` = ``after_request`` (its request was logged when it
  arrived) or ``before_request`` (it waited in ``pending_outcomes``).
* ``pending_outcomes`` (keyed by ``request_id``): outcomes whose request has
  not been logged. When the request arrives, the writer moves its outcome to
  ``outcomes`` in the same transaction. One that never gets its request stays
  here: a *dangling* outcome, counted by `count_dangling_outcomes`.

An outcome for a request that already has one is a duplicate: **the first
wins**, so replaying the journal is a no-op. A duplicate whose content
(observation time, measurements, failure, production decision) differs is a
*conflict*, recorded in ``conflicts`` — never applied, never lost.
Production's decision carried by an outcome fills the request's
``production_option``/``production_propensity`` when those are empty
(``production_source = 'outcome'``); a contradicting value is recorded in
``conflicts`` instead of overwriting. docs/storage.md has the full table.

The write half is `service.storage.log.outcome_join` (inside
`DecisionLogWriter.write`'s transaction); the queries here return plain
dataclasses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Float, cast, extract, func, select

from service.contract import FailureKind
from service.storage.engine import unavailable_on_failure
from service.storage.log import tables as t
from service.storage.log.outcome_join import apply_production, join_pending
from service.storage.log.staging import staging_cursor


@dataclass(frozen=True, slots=True)
class JoinedOutcome:
    """An outcome joined to its request, with production's decision as now recorded.

    ``production_*`` come from the request (filled from the outcome when
    Runtime mirrored before deciding); ``outcome_production_*`` are what the
    outcome itself carried.
    """

    request_id: str
    request_time: float
    observed_at: float
    received_at: float
    queue_delay_s: float | None
    throughput: float | None
    completion_time_s: float | None
    slo_met: bool | None
    failure: FailureKind
    production_option: int | None
    production_propensity: float | None
    production_source: str | None
    outcome_production_option: int | None
    outcome_production_propensity: float | None
    join_state: str


@dataclass(frozen=True, slots=True)
class PendingOutcome:
    """An outcome waiting for its request (dangling if the request never comes)."""

    request_id: str
    observed_at: float
    received_at: float
    failure: FailureKind
    production_option: int | None
    production_propensity: float | None


@dataclass(frozen=True, slots=True)
class ConflictRecord:
    """A value that contradicted what was already recorded, kept for review."""

    request_id: str
    kind: str
    existing: dict[str, Any]
    incoming: dict[str, Any]


def _epoch(column: Any) -> Any:
    return cast(extract("epoch", column), Float)


def joined_outcomes(
    engine: Engine,
    *,
    since: float | None = None,
    until: float | None = None,
    request_ids: Sequence[str] | None = None,
) -> list[JoinedOutcome]:
    """Joined outcomes with ``since <= request_time < until`` (Unix seconds), oldest first."""
    o, r = t.outcomes, t.requests
    query = (
        select(
            o.c.request_id,
            _epoch(o.c.request_time),
            _epoch(o.c.observed_at),
            _epoch(o.c.received_at),
            o.c.queue_delay_s,
            o.c.throughput,
            o.c.completion_time_s,
            o.c.slo_met,
            o.c.failure,
            r.c.production_option,
            r.c.production_propensity,
            r.c.production_source,
            o.c.production_option,
            o.c.production_propensity,
            o.c.join_state,
        )
        .join(r, (r.c.request_id == o.c.request_id) & (r.c.request_time == o.c.request_time))
        .order_by(o.c.request_time, o.c.request_id)
    )
    if since is not None:
        query = query.where(o.c.request_time >= func.to_timestamp(since))
    if until is not None:
        query = query.where(o.c.request_time < func.to_timestamp(until))
    if request_ids is not None:
        query = query.where(o.c.request_id.in_(list(request_ids)))
    with unavailable_on_failure("reading outcomes"), engine.connect() as conn:
        rows = conn.execute(query).all()
    return [
        JoinedOutcome(
            request_id=row[0],
            request_time=row[1],
            observed_at=row[2],
            received_at=row[3],
            queue_delay_s=row[4],
            throughput=row[5],
            completion_time_s=row[6],
            slo_met=row[7],
            failure=FailureKind(row[8]),
            production_option=row[9],
            production_propensity=row[10],
            production_source=row[11],
            outcome_production_option=row[12],
            outcome_production_propensity=row[13],
            join_state=row[14],
        )
        for row in rows
    ]


def pending_outcomes(engine: Engine, *, limit: int = 1000) -> list[PendingOutcome]:
    """Outcomes still waiting for their request, oldest received first."""
    p = t.pending_outcomes
    query = (
        select(
            p.c.request_id,
            _epoch(p.c.observed_at),
            _epoch(p.c.received_at),
            p.c.failure,
            p.c.production_option,
            p.c.production_propensity,
        )
        .order_by(p.c.received_at)
        .limit(limit)
    )
    with unavailable_on_failure("reading pending outcomes"), engine.connect() as conn:
        return [
            PendingOutcome(row[0], row[1], row[2], FailureKind(row[3]), row[4], row[5])
            for row in conn.execute(query)
        ]


def count_dangling_outcomes(engine: Engine, *, older_than_s: float = 0.0) -> int:
    """Outcomes without a logged request, received more than `older_than_s` ago.

    With the default 0 this counts every pending outcome; a grace period
    (say, the journal's expected lag) separates "early" from "dangling".
    """
    p = t.pending_outcomes
    query = select(func.count()).select_from(p)
    if older_than_s > 0:
        cutoff = func.now() - func.make_interval(0, 0, 0, 0, 0, 0, older_than_s)
        query = query.where(p.c.received_at < cutoff)
    with unavailable_on_failure("counting dangling outcomes"), engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


def count_joined_outcomes(engine: Engine) -> int:
    """Outcomes joined to a logged request."""
    with unavailable_on_failure("counting outcomes"), engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(t.outcomes)).scalar_one())


def conflicts(engine: Engine, *, request_id: str | None = None) -> list[ConflictRecord]:
    """Recorded conflicts (optionally for one request), in the order they were recorded."""
    c = t.conflicts
    query = select(c.c.request_id, c.c.kind, c.c.existing, c.c.incoming).order_by(c.c.conflict_id)
    if request_id is not None:
        query = query.where(c.c.request_id == request_id)
    with unavailable_on_failure("reading conflicts"), engine.connect() as conn:
        return [
            ConflictRecord(request_id=a, kind=b, existing=c, incoming=d)
            for a, b, c, d in conn.execute(query)
        ]


def rejoin_pending(engine: Engine, *, received_within_s: float = 3600.0) -> int:
    """Join pending outcomes whose request is logged now; returns how many.

    With several writers (replicas), an outcome can be committed as pending by
    one writer while another is committing its request: neither sees the
    other's rows. Running this now and then (it only looks at outcomes received
    within `received_within_s`) closes that gap. One writer never needs it.
    """
    with (
        unavailable_on_failure("rejoining pending outcomes"),
        engine.begin() as conn,
        staging_cursor(conn) as cur,
    ):
        cur.execute(
            """
            INSERT INTO stage_new_requests
            SELECT p.request_id, (SELECT r.request_time FROM requests r
                                    WHERE r.request_id = p.request_id
                                    ORDER BY r.request_time DESC LIMIT 1) AS rt
              FROM pending_outcomes p
             WHERE p.received_at >= now() - make_interval(secs => %(s)s)
            """,
            {"s": received_within_s},
        )
        cur.execute("DELETE FROM stage_new_requests WHERE request_time IS NULL")
        n = join_pending(cur)
        apply_production(cur)
        return n
