"""Reads for the live outcome-drift check: joined outcomes with their decoded requests.

The check (`service.checks.outcome_drift`) needs, per outcome, production's
option's hardware class and the request's model family and accelerators:
all in the stored request, so the request payload is read and decoded, and
production's option is taken from the log (``requests.production_option``,
which also holds it when Runtime mirrored before deciding and reported it
with the outcome). Only outcomes with a positive throughput are read.
`Unavailable` when the database cannot be reached.
"""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import Engine, and_, func, select

from service.contract import MirrorRequest, Outcome, ProductionDecision
from service.storage.engine import unavailable_on_failure
from service.storage.log import tables as t
from service.storage.log.payload import decode_request, stored_payload
from service.storage.reads.ope import OpeFilter, filter_conditions


def read_placed_outcomes(
    engine: Engine,
    *,
    outcomes_since: float | None = None,
    limit: int | None = None,
    where: OpeFilter | None = None,
) -> tuple[list[MirrorRequest], dict[str, Outcome]]:
    """Requests with a joined outcome, oldest first, and their outcomes by request id.

    `outcomes_since` (Unix seconds) keeps outcomes *received* since then (the live
    window); `limit` the newest that many; `where` filters the requests as OPE does
    (time range on ``received_at``, workload kind, tenant, model family; its
    `policies` are ignored: outcomes are production's, not a policy's).
    """
    r, o, s = t.requests, t.outcomes, t.cluster_snapshots
    conditions = [o.c.throughput > 0, r.c.production_option >= 0]
    if outcomes_since is not None:
        conditions.append(o.c.received_at >= func.to_timestamp(outcomes_since))
    if where is not None:
        conditions += filter_conditions(replace(where, policies=()))
    newest = (
        select(
            r.c.request_id,
            r.c.received_at,
            r.c.production_option,
            r.c.payload_zstd,
            r.c.state_offset,
            s.c.state_zstd,
            o.c.throughput,
        )
        .select_from(
            o.join(
                r, and_(r.c.request_id == o.c.request_id, r.c.request_time == o.c.request_time)
            ).outerjoin(s, s.c.snapshot_hash == r.c.snapshot_hash)
        )
        .where(*conditions)
        .order_by(o.c.received_at.desc())
        .limit(limit)
        .subquery()
    )
    query = select(newest).order_by(newest.c.received_at, newest.c.request_id)
    requests: list[MirrorRequest] = []
    outcomes: dict[str, Outcome] = {}
    with unavailable_on_failure("reading outcomes for drift"), engine.connect() as conn:
        for row in conn.execute(query):
            payload = stored_payload(row.payload_zstd, row.state_offset, row.state_zstd)
            request = decode_request(payload)
            requests.append(request)
            outcomes[request.request_id] = Outcome(
                request_id=request.request_id,
                observed_at=0.0,
                throughput=float(row.throughput),
                production=ProductionDecision(int(row.production_option), None),
            )
    return requests, outcomes
