"""Recorded protocols and their events in PostgreSQL: `ProtocolStore`.

Implements `service.protocols.ProtocolRecords` for the protocol desk. The
tables come from migration 0002 (the source of truth, with the triggers that
make events append-only and recorded content immutable); the Core `Table`s
below mirror it on the decision log's `metadata`, so the schema comparison in
``tests/storage`` covers them too.

A transition is one transaction: insert the event with the next sequence
number, then move the state only if it is still the state and sequence number
the caller read (compare-and-set). Two racing callers both try the same
sequence number; one commits and the other gets `Conflict` — never two events
for one step. Unreachable database: `Unavailable`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy import (
    Column,
    DateTime,
    Engine,
    ForeignKeyConstraint,
    Index,
    Integer,
    PrimaryKeyConstraint,
    Row,
    Table,
    Text,
    and_,
    exc,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert

from service.contract.errors import Conflict
from service.protocols import (
    Action,
    LoggingProfile,
    Mode,
    NewEvent,
    Protocol,
    ProtocolEvent,
    RecordedProtocol,
    State,
)
from service.protocols.check import DETERMINISTIC_PROPENSITY
from service.storage.engine import unavailable_on_failure
from service.storage.log import tables as t

TS = DateTime(timezone=True)

protocols = Table(
    "protocols",
    t.metadata,
    Column("protocol_id", Text, nullable=False),
    Column("first_recorded_at", TS, nullable=False, server_default=func.now()),
    Column("first_recorded_by", Text, nullable=False),
    PrimaryKeyConstraint("protocol_id", name="protocols_pkey"),
)

protocol_versions = Table(
    "protocol_versions",
    t.metadata,
    Column("protocol_id", Text, nullable=False),
    Column("version", Integer, nullable=False),
    Column("content_sha256", Text, nullable=False),
    Column("document", JSONB, nullable=False),
    Column("mode", Text, nullable=False),
    Column("owners", ARRAY(Text), nullable=False),
    Column("candidate_policy", Text, nullable=False),
    Column("candidate_version", Text, nullable=False),
    Column("candidate_sha256", Text),
    Column("submitted_by", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("recorded_at", TS, nullable=False, server_default=func.now()),
    Column("updated_at", TS, nullable=False, server_default=func.now()),
    Column("started_at", TS),
    PrimaryKeyConstraint("protocol_id", "version", name="protocol_versions_pkey"),
    ForeignKeyConstraint(
        ["protocol_id"], ["protocols.protocol_id"], name="protocol_versions_protocol_fkey"
    ),
    Index("protocol_versions_by_state", "state"),
)

protocol_events = Table(
    "protocol_events",
    t.metadata,
    Column("protocol_id", Text, nullable=False),
    Column("version", Integer, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("action", Text, nullable=False),
    Column("from_state", Text),
    Column("to_state", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("actor_role", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("evidence", JSONB, nullable=False),
    Column("criterion", Text),
    Column("content_sha256", Text, nullable=False),
    Column("at", TS, nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("protocol_id", "version", "seq", name="protocol_events_pkey"),
    ForeignKeyConstraint(
        ["protocol_id", "version"],
        ["protocol_versions.protocol_id", "protocol_versions.version"],
        name="protocol_events_version_fkey",
    ),
    Index("protocol_events_at", "at"),
)

PROFILE_WINDOW_DAYS = 7
PROFILE_LIMIT = 10_000
"""`logging_profile` looks at the latest this-many production decisions of the window."""


def _seconds(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _record(row: Row[Any]) -> RecordedProtocol:
    return RecordedProtocol(
        protocol_id=row.protocol_id,
        version=row.version,
        content_sha256=row.content_sha256,
        document=row.document,
        mode=Mode(row.mode),
        owners=tuple(row.owners),
        submitted_by=row.submitted_by,
        state=State(row.state),
        seq=row.seq,
        recorded_at=row.recorded_at.timestamp(),
        updated_at=row.updated_at.timestamp(),
        started_at=_seconds(row.started_at),
    )


def event_from_row(row: Row[Any]) -> ProtocolEvent:
    """A `ProtocolEvent` from a ``protocol_events`` row (the one converter every read uses)."""
    return ProtocolEvent(
        protocol_id=row.protocol_id,
        version=row.version,
        seq=row.seq,
        action=Action(row.action),
        from_state=None if row.from_state is None else State(row.from_state),
        to_state=State(row.to_state),
        actor=row.actor,
        actor_role=row.actor_role,
        reason=row.reason,
        evidence=row.evidence,
        criterion=row.criterion,
        content_sha256=row.content_sha256,
        at=row.at.timestamp(),
    )


def _event_values(
    protocol_id: str, version: int, seq: int, sha: str, event: NewEvent
) -> dict[str, Any]:
    return {
        "protocol_id": protocol_id,
        "version": version,
        "seq": seq,
        "action": event.action.value,
        "from_state": None if event.from_state is None else event.from_state.value,
        "to_state": event.to_state.value,
        "actor": event.actor.principal,
        "actor_role": event.actor.role.value,
        "reason": event.reason,
        "evidence": dict(event.evidence),
        "criterion": event.criterion,
        "content_sha256": sha,
    }


class ProtocolStore:
    """`ProtocolRecords` on PostgreSQL (see the module docstring for the guarantees)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def find(self, protocol_id: str, version: int) -> RecordedProtocol | None:
        """The recorded version, or None."""
        query = select(protocol_versions).where(
            protocol_versions.c.protocol_id == protocol_id, protocol_versions.c.version == version
        )
        with unavailable_on_failure("reading a protocol"), self.engine.connect() as conn:
            row = conn.execute(query).one_or_none()
        return None if row is None else _record(row)

    def create(
        self, protocol: Protocol, document: Mapping[str, Any], content_sha256: str, event: NewEvent
    ) -> RecordedProtocol:
        """Record a new version in `event.to_state` with its first event.

        Raises:
            Conflict: the id and version are already recorded.
        """
        who = event.actor.principal
        values = {
            "protocol_id": protocol.id,
            "version": protocol.version,
            "content_sha256": content_sha256,
            "document": dict(document),
            "mode": protocol.mode.value,
            "owners": list(protocol.owners),
            "candidate_policy": protocol.candidate.name,
            "candidate_version": protocol.candidate.version,
            "candidate_sha256": protocol.candidate.sha256,
            "submitted_by": who,
            "state": event.to_state.value,
            "seq": 1,
        }
        with unavailable_on_failure("recording a protocol"), self.engine.begin() as conn:
            conn.execute(
                pg_insert(protocols)
                .values(protocol_id=protocol.id, first_recorded_by=who)
                .on_conflict_do_nothing()
            )
            row = conn.execute(
                pg_insert(protocol_versions)
                .values(values)
                .on_conflict_do_nothing()
                .returning(*protocol_versions.c)
            ).one_or_none()
            if row is None:
                raise Conflict(
                    f"protocol `{protocol.id}` version {protocol.version} is already recorded"
                )
            conn.execute(
                insert(protocol_events).values(
                    _event_values(protocol.id, protocol.version, 1, content_sha256, event)
                )
            )
        return _record(row)

    def transition(
        self, protocol_id: str, version: int, expected_seq: int, event: NewEvent
    ) -> RecordedProtocol:
        """Move from `event.from_state` at `expected_seq` and write the event, atomically.

        Raises:
            Conflict: the version moved since it was read (or is not recorded).
        """
        v = protocol_versions.c
        seq = expected_seq + 1
        changes: dict[str, Any] = {
            "state": event.to_state.value,
            "seq": seq,
            "updated_at": func.now(),
        }
        if event.action is Action.START:
            changes["started_at"] = func.now()
        moved = (
            update(protocol_versions)
            .where(
                v.protocol_id == protocol_id,
                v.version == version,
                v.state == (event.from_state.value if event.from_state else None),
                v.seq == expected_seq,
            )
            .values(changes)
            .returning(*protocol_versions.c)
        )
        sha = select(v.content_sha256).where(v.protocol_id == protocol_id, v.version == version)
        try:
            with unavailable_on_failure("moving a protocol"), self.engine.begin() as conn:
                digest = conn.execute(sha).scalar_one_or_none()
                if digest is None:
                    raise Conflict(f"protocol `{protocol_id}` version {version} is not recorded")
                conn.execute(
                    insert(protocol_events).values(
                        _event_values(protocol_id, version, seq, digest, event)
                    )
                )
                row = conn.execute(moved).one_or_none()
                if row is None:
                    raise _moved(protocol_id, version, expected_seq, event)
        except exc.IntegrityError as err:
            if not isinstance(err.orig, psycopg.errors.UniqueViolation):
                raise
            # A racing caller committed event `seq` first.
            raise _moved(protocol_id, version, expected_seq, event) from err
        return _record(row)

    def events(self, protocol_id: str, version: int) -> list[ProtocolEvent]:
        """Every event of a version, oldest first."""
        e = protocol_events.c
        query = (
            select(protocol_events)
            .where(e.protocol_id == protocol_id, e.version == version)
            .order_by(e.seq)
        )
        with unavailable_on_failure("reading protocol events"), self.engine.connect() as conn:
            return [event_from_row(r) for r in conn.execute(query)]

    def recorded(self, states: Collection[State] | None = None) -> list[RecordedProtocol]:
        """Recorded versions (optionally only those in `states`), by id and version."""
        v = protocol_versions.c
        query = select(protocol_versions).order_by(v.protocol_id, v.version)
        if states is not None:
            query = query.where(v.state.in_([s.value for s in states]))
        with unavailable_on_failure("listing protocols"), self.engine.connect() as conn:
            return [_record(r) for r in conn.execute(query)]

    def logging_profile(
        self, window_days: int = PROFILE_WINDOW_DAYS, limit: int = PROFILE_LIMIT
    ) -> LoggingProfile:
        """How production logged its recent decisions: with propensities? deterministic?

        Reads the newest `limit` requests of the last `window_days` that carry a
        production decision (the ``requests_time`` index bounds the cost).
        """
        r = t.requests.c
        recent = (
            select(r.production_propensity.label("p"))
            .where(
                and_(
                    r.production_option.is_not(None),
                    r.request_time >= func.now() - func.make_interval(0, 0, 0, window_days),
                )
            )
            .order_by(r.request_time.desc())
            .limit(limit)
            .subquery()
        )
        query = select(
            func.count(),
            func.count(recent.c.p),
            func.count().filter(recent.c.p >= DETERMINISTIC_PROPENSITY),
        )
        with unavailable_on_failure("profiling production's logs"), self.engine.connect() as conn:
            decisions, with_propensity, deterministic = conn.execute(
                query.select_from(recent)
            ).one()
        return LoggingProfile(
            int(decisions),
            int(with_propensity),
            int(deterministic),
            f"newest {limit} production decisions of the last {window_days} days",
        )


def _moved(protocol_id: str, version: int, expected_seq: int, event: NewEvent) -> Conflict:
    was = event.from_state.value if event.from_state else "unrecorded"
    return Conflict(
        f"protocol `{protocol_id}` version {version} changed since it was read (expected"
        f" {was} at event {expected_seq}); read its status and retry"
    )
