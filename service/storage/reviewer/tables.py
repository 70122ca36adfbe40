"""The reviewer access log as SQLAlchemy Core, mirroring migrations 0004 and 0008.

The migration is the source of truth (with the append-only triggers, the
``understudy_reviewer`` role and the documented views); this `Table` lives on
the decision log's `metadata` so writes are typed and the schema comparison
in ``tests/storage`` covers it.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Identity,
    Index,
    Integer,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB

from service.storage.log import tables as t

REVIEWER_ROLE = "understudy_reviewer"
"""The read-only database role migration 0004 creates."""

REVIEWER_VIEWS: tuple[str, ...] = (
    "reviewer_decisions",
    "reviewer_disagreements",
    "reviewer_experiments",
    "reviewer_protocol_events",
    "reviewer_option_feasibility",
)
"""The documented views (docs/reviewer.md)."""

ACCESS_OUTCOMES: tuple[str, ...] = (
    "ok",
    "rejected",
    "not_found",
    "denied",
    "error",
    "timeout",
    "failed",
)
"""How a logged reviewer query ended: ``error`` = the database unavailable,
``timeout`` = past the statement timeout, ``failed`` = an unexpected error (a 500)."""

TS = DateTime(timezone=True)

reviewer_access_log = Table(
    "reviewer_access_log",
    t.metadata,
    Column("access_id", BigInteger, Identity(always=True), nullable=False),
    Column("at", TS, nullable=False, server_default=func.now()),
    Column("principal", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("endpoint", Text, nullable=False),
    Column("parameters", JSONB, nullable=False),
    Column("rows_returned", Integer, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("detail", Text),
    Column("status", SmallInteger),  # the HTTP status answered; null before 0008
    PrimaryKeyConstraint("access_id", name="reviewer_access_log_pkey"),
    CheckConstraint("rows_returned >= 0", name="reviewer_access_log_rows"),
    CheckConstraint(
        "outcome IN ('ok', 'rejected', 'not_found', 'denied', 'error', 'timeout', 'failed')",
        name="reviewer_access_log_outcome",
    ),
    CheckConstraint("status BETWEEN 100 AND 599", name="reviewer_access_log_status"),
    Index("reviewer_access_log_at", "at"),
)
