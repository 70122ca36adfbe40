"""What a safety reviewer reads: decisions by filter, one request in full, experiments, events.

One request in full is `service.storage.reviewer.request`. Each function
takes an open `Connection` so the caller decides the transaction:
`service.storage.reviewer.audit` runs them as the read-only
``understudy_reviewer`` role, in the same transaction that writes the access
log row. Every value is a bound parameter of a SQLAlchemy Core statement
(filters were checked by `service.storage.reviewer.query` before any SQL).

Times are Unix seconds. The ``hardware_class`` filter needs the stored
payload (the class of the chosen option's nodes is not a column), so it is
applied after decoding, within a bounded scan (`HARDWARE_SCAN_FACTOR`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Select, and_, column, false, select, table, tuple_
from sqlalchemy.types import DateTime, Integer, Text

from service.contract import (
    DEFER,
    MirrorRequest,
    NotFound,
)
from service.protocols import ProtocolEvent
from service.storage.log import tables as t
from service.storage.log.payload import decode_request, stored_payload
from service.storage.reviewer.query import DecisionFilter, DecisionKey, DecisionQuery, microseconds
from service.storage.stores.protocol import event_from_row, protocol_events, protocol_versions

HARDWARE_SCAN_FACTOR = 10
"""With a ``hardware_class`` filter, a page scans up to this many rows per row asked for
(the class is inside the stored payload, not a column); a short page still carries a
cursor when rows remain."""
MAX_SCAN = 5000

_TS = DateTime(timezone=True)
experiments_view = table(
    "reviewer_experiments",
    *(column(n, Text) for n in ("protocol_id", "state", "mode", "candidate_policy")),
    *(column(n, Text) for n in ("candidate_version", "candidate_sha256", "content_sha256")),
    column("owners"),
    column("submitted_by", Text),
    column("approved_by", Text),
    column("version", Integer),
    column("n_events", Integer),
    *(column(n, _TS) for n in ("recorded_at", "started_at", "ended_at", "approved_at")),
    column("updated_at", _TS),
)
"""The ``reviewer_experiments`` view of migration 0004 (not on `metadata`: views are
not compared with the schema)."""


@dataclass(frozen=True, slots=True)
class DecisionItem:
    """One decision with its request's indexed columns and its joined outcome, if any."""

    request_id: str
    request_time: float
    received_at: float
    policy_name: str
    policy_version: str
    status: str
    chosen_option: int
    deferred: bool
    chosen_probability: float | None
    defer_probability: float | None
    production_option: int | None
    production_propensity: float | None
    production_probability: float | None
    agrees_with_production: bool | None
    raw_favourite_infeasible: bool
    latency_us: int
    error: str | None
    scored_at: float
    workload_id: str
    workload_kind: str
    tenant: str
    model_family: str
    n_options: int
    feature_hash: str
    outcome_joined: bool
    slo_met: bool | None
    queue_delay_s: float | None
    throughput: float | None
    completion_time_s: float | None
    failure: str | None


@dataclass(frozen=True, slots=True)
class DecisionPage:
    """A page of decisions; `next_cursor_key` (where the next page starts after) is None
    once nothing follows; `scanned` counts the rows looked at (more than returned only
    with a ``hardware_class`` filter)."""

    items: list[DecisionItem]
    next_cursor_key: DecisionKey | None
    scanned: int


@dataclass(frozen=True, slots=True)
class ExperimentItem:
    """A recorded protocol version with its window (``started_at`` to ``ended_at``)."""

    protocol_id: str
    version: int
    state: str
    mode: str
    candidate_policy: str
    candidate_version: str
    candidate_sha256: str | None
    content_sha256: str
    owners: list[str]
    submitted_by: str
    recorded_at: float
    started_at: float | None
    ended_at: float | None
    approved_by: str | None
    approved_at: float | None
    n_events: int
    updated_at: float


def seconds(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def experiment_item(row: Any) -> ExperimentItem:
    """An `ExperimentItem` from a ``reviewer_experiments`` row."""
    m = row._mapping
    return ExperimentItem(
        protocol_id=m["protocol_id"],
        version=m["version"],
        state=m["state"],
        mode=m["mode"],
        candidate_policy=m["candidate_policy"],
        candidate_version=m["candidate_version"],
        candidate_sha256=m["candidate_sha256"],
        content_sha256=m["content_sha256"],
        owners=list(m["owners"]),
        submitted_by=m["submitted_by"],
        recorded_at=m["recorded_at"].timestamp(),
        started_at=seconds(m["started_at"]),
        ended_at=seconds(m["ended_at"]),
        approved_by=m["approved_by"],
        approved_at=seconds(m["approved_at"]),
        n_events=m["n_events"],
        updated_at=m["updated_at"].timestamp(),
    )


def experiments(conn: Connection, protocol_id: str | None = None) -> list[ExperimentItem]:
    """Recorded protocol versions (optionally of one protocol), by id and version."""
    v = experiments_view.c
    query = select(experiments_view).order_by(v.protocol_id, v.version)
    if protocol_id is not None:
        query = query.where(v.protocol_id == protocol_id)
    return [experiment_item(r) for r in conn.execute(query)]


def _decision_query(conn: Connection, query: DecisionQuery, with_payload: bool) -> Select[Any]:
    d, r, o, s = t.decisions, t.requests, t.outcomes, t.cluster_snapshots
    f: DecisionFilter = query.filter
    cols = [
        d.c.request_id,
        d.c.request_time,
        r.c.received_at,
        d.c.policy_name,
        d.c.policy_version,
        d.c.status,
        d.c.chosen_option,
        d.c.chosen_probability,
        d.c.defer_probability,
        r.c.production_option,
        r.c.production_propensity,
        d.c.production_probability,
        d.c.agrees_with_production,
        d.c.raw_favourite_infeasible,
        d.c.latency_us,
        d.c.error,
        d.c.scored_at,
        r.c.workload_id,
        r.c.workload_kind,
        r.c.tenant,
        r.c.model_family,
        r.c.n_options,
        r.c.feature_hash,
        o.c.request_id.label("outcome_id"),
        o.c.slo_met,
        o.c.queue_delay_s,
        o.c.throughput,
        o.c.completion_time_s,
        o.c.failure,
    ]
    source = d.join(
        r, and_(r.c.request_id == d.c.request_id, r.c.request_time == d.c.request_time)
    ).outerjoin(o, and_(o.c.request_id == d.c.request_id, o.c.request_time == d.c.request_time))
    if with_payload:
        cols += [r.c.payload_zstd, r.c.state_offset, s.c.state_zstd]
        source = source.outerjoin(s, s.c.snapshot_hash == r.c.snapshot_hash)
    key = (d.c.request_time, d.c.request_id, d.c.policy_name, d.c.policy_version)
    stmt = select(*cols).select_from(source)
    if f.since is not None:
        stmt = stmt.where(d.c.request_time >= f.since)
    if f.until is not None:
        stmt = stmt.where(d.c.request_time < f.until)
    if f.policy is not None:
        stmt = stmt.where(d.c.policy_name == f.policy)
    if f.policy_version is not None:
        stmt = stmt.where(d.c.policy_version == f.policy_version)
    if f.workload_kind is not None:
        stmt = stmt.where(r.c.workload_kind == f.workload_kind)
    if f.status is not None:
        stmt = stmt.where(d.c.status == f.status)
    if f.disagreement is not None:
        stmt = stmt.where(d.c.agrees_with_production.is_(not f.disagreement))
    if f.experiment is not None:
        stmt = _within_experiment(conn, stmt, f.experiment, f.experiment_version)
    if query.after is not None:
        a = query.after
        bound = tuple_(*key)
        after = tuple_(a.request_time, a.request_id, a.policy_name, a.policy_version)
        stmt = stmt.where(bound > after if query.order == "asc" else bound < after)
    order = [c.asc() if query.order == "asc" else c.desc() for c in key]
    return stmt.order_by(*order)


def _within_experiment(
    conn: Connection, stmt: Select[Any], protocol_id: str, version: int | None
) -> Select[Any]:
    """The candidate's decisions on requests received while the version ran."""
    v = experiments_view.c
    found = select(v.candidate_policy, v.candidate_version, v.started_at, v.ended_at).where(
        v.protocol_id == protocol_id
    )
    if version is not None:
        found = found.where(v.version == version)
    row = conn.execute(found.order_by(v.version.desc()).limit(1)).first()
    if row is None:
        which = f"`{protocol_id}`" + (f" version {version}" if version is not None else "")
        raise NotFound(f"`experiment` {which} is not recorded")
    d, r = t.decisions.c, t.requests.c
    if row.started_at is None:  # never ran: no decision belongs to it
        return stmt.where(false())
    stmt = stmt.where(
        d.policy_name == row.candidate_policy,
        d.policy_version == row.candidate_version,
        r.received_at >= row.started_at,
    )
    return stmt if row.ended_at is None else stmt.where(r.received_at < row.ended_at)


def _item(m: Any) -> DecisionItem:
    return DecisionItem(
        **{
            k: m[k]
            for k in DecisionItem.__slots__
            if k not in ("request_time", "received_at", "scored_at", "deferred", "outcome_joined")
        },
        request_time=m["request_time"].timestamp(),
        received_at=m["received_at"].timestamp(),
        scored_at=m["scored_at"].timestamp(),
        deferred=m["chosen_option"] == DEFER,
        outcome_joined=m["outcome_id"] is not None,
    )


def _key(m: Any) -> DecisionKey:
    return DecisionKey(
        microseconds(m["request_time"]), m["request_id"], m["policy_name"], m["policy_version"]
    )


def chosen_hardware(request: MirrorRequest, option: int) -> set[str]:
    """Hardware class names of the nodes of `option` (empty for `DEFER` or out of range)."""
    if not 0 <= option < request.options.n_options:
        return set()
    state = request.state
    return {state.hardware_of(int(n)).name for n in request.options.nodes_of(option)}


def decision_page(conn: Connection, query: DecisionQuery) -> DecisionPage:
    """One page of decisions in key order, continuing after ``query.after``."""
    wanted = query.filter.hardware_class
    if wanted is None:
        rows = conn.execute(_decision_query(conn, query, False).limit(query.limit + 1)).all()
        page = [r._mapping for r in rows[: query.limit]]
        more = len(rows) > query.limit
        return DecisionPage([_item(m) for m in page], _key(page[-1]) if more else None, len(page))
    scan = min(query.limit * HARDWARE_SCAN_FACTOR, MAX_SCAN)
    rows = conn.execute(_decision_query(conn, query, True).limit(scan)).all()
    decoded: dict[tuple[str, datetime], MirrorRequest] = {}
    items: list[DecisionItem] = []
    scanned = 0
    for row in rows:
        m = row._mapping
        scanned += 1
        ident = (m["request_id"], m["request_time"])
        if ident not in decoded:
            raw = stored_payload(m["payload_zstd"], m["state_offset"], m["state_zstd"])
            decoded[ident] = decode_request(raw)
        if wanted in chosen_hardware(decoded[ident], m["chosen_option"]):
            items.append(_item(m))
            if len(items) == query.limit:
                break
    # More may follow when the page filled up or the scan budget ran out.
    more = len(items) == query.limit or len(rows) == scan
    last = rows[scanned - 1]._mapping if scanned else None
    return DecisionPage(items, _key(last) if more and last is not None else None, scanned)


def events(conn: Connection, protocol_id: str, version: int) -> list[ProtocolEvent]:
    """Every event of a recorded version, oldest first.

    Raises:
        NotFound: the version is not recorded.
    """
    e, v = protocol_events.c, protocol_versions.c
    known = select(v.seq).where(v.protocol_id == protocol_id, v.version == version)
    if conn.execute(known).first() is None:
        raise NotFound(f"protocol `{protocol_id}` version {version} is not recorded")
    query = (
        select(protocol_events)
        .where(e.protocol_id == protocol_id, e.version == version)
        .order_by(e.seq)
    )
    return [event_from_row(row) for row in conn.execute(query)]
