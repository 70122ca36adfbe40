"""The evaluator's tables as SQLAlchemy Core, mirroring migration 0003.

The migration is the source of truth (with the fencing and append-only
triggers); these `Table`s live on the decision log's `metadata` so queries
are typed and the schema comparison in the tests covers them.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Double,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    PrimaryKeyConstraint,
    Table,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB

from service.storage.log import tables as t

TS = DateTime(timezone=True)
evaluator_leases = Table(
    "evaluator_leases",
    t.metadata,
    Column("name", Text, nullable=False),
    Column("holder", Text, nullable=False),
    Column("generation", BigInteger, nullable=False),
    Column("acquired_at", TS, nullable=False),
    Column("renewed_at", TS, nullable=False),
    Column("expires_at", TS, nullable=False),
    PrimaryKeyConstraint("name", name="evaluator_leases_pkey"),
)

evaluations = Table(
    "evaluations",
    t.metadata,
    Column("evaluation_id", BigInteger, Identity(always=True), nullable=False),
    Column("protocol_id", Text, nullable=False),
    Column("version", Integer, nullable=False),
    Column("criterion", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("metric", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("value", Double),
    Column("bound", Double),
    Column("threshold", Double, nullable=False),
    Column("lower_bound", Double),
    Column("upper_bound", Double),
    Column("n", BigInteger, nullable=False),
    Column("alpha", Double, nullable=False),
    Column("method", Text, nullable=False),
    Column("note", Text, nullable=False),
    Column("evaluated_at", TS, nullable=False, server_default=func.now()),
    Column("holder", Text, nullable=False),
    Column("generation", BigInteger, nullable=False),
    PrimaryKeyConstraint("evaluation_id", name="evaluations_pkey"),
    ForeignKeyConstraint(
        ["protocol_id", "version"],
        ["protocol_versions.protocol_id", "protocol_versions.version"],
        name="evaluations_version_fkey",
    ),
    Index("evaluations_by_experiment", "protocol_id", "version", "evaluated_at"),
)

evidence_snapshots = Table(
    "evidence_snapshots",
    t.metadata,
    Column("protocol_id", Text, nullable=False),
    Column("version", Integer, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("content_sha256", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("summary", JSONB, nullable=False),
    Column("markdown", Text, nullable=False),
    Column("html", Text, nullable=False),
    Column("created_at", TS, nullable=False, server_default=func.now()),
    Column("holder", Text, nullable=False),
    Column("generation", BigInteger, nullable=False),
    PrimaryKeyConstraint("protocol_id", "version", "seq", name="evidence_snapshots_pkey"),
    ForeignKeyConstraint(
        ["protocol_id", "version", "seq"],
        ["protocol_events.protocol_id", "protocol_events.version", "protocol_events.seq"],
        name="evidence_snapshots_event_fkey",
    ),
)
