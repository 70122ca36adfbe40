"""SQLAlchemy Core tables of the decision log, mirroring the Alembic migrations.

The migrations (``migrations/versions``) are the source of truth and are
written by hand because partitioning is PostgreSQL DDL; these `Table`s exist
so queries are typed and composable. ``tests/storage`` compares them with the
migrated database, so the two cannot drift apart silently.

Partitioned by RANGE (``request_time``), one partition per UTC day plus a
DEFAULT partition: ``requests``, ``decisions``, ``outcomes``. Not partitioned:
``policies`` (few rows), ``cluster_snapshots`` (keyed by content hash, so a
global primary key is the point), ``request_identities`` (one row per
``request_id``: a global key is the point again), ``pending_outcomes`` (outcomes waiting for
their request; small) and ``conflicts`` (anomalies only).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    func,
    literal_column,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData()

TS = DateTime(timezone=True)
_FAILURES = "failure IN ('none', 'oom', 'preempted', 'crashed', 'other')"

policies = Table(
    "policies",
    metadata,
    Column("name", Text, nullable=False),
    Column("version", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("sha256", Text),
    Column("feature_version", Text, nullable=False),
    Column("feature_hash", Text, nullable=False),
    Column("registered_at", TS, nullable=False),
    PrimaryKeyConstraint("name", "version", name="policies_pkey"),
)

cluster_snapshots = Table(
    "cluster_snapshots",
    metadata,
    Column("snapshot_hash", LargeBinary, nullable=False),
    Column("state_zstd", LargeBinary, nullable=False),
    Column("n_nodes", Integer, nullable=False),
    Column("raw_bytes", Integer, nullable=False),
    Column("first_seen_at", TS, nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("snapshot_hash", name="cluster_snapshots_pkey"),
    CheckConstraint("octet_length(snapshot_hash) = 32", name="cluster_snapshots_hash_len"),
)

requests = Table(
    "requests",
    metadata,
    Column("request_id", Text, nullable=False),
    Column("request_time", TS, nullable=False),
    Column("received_at", TS, nullable=False),
    Column("journal_seq", BigInteger, nullable=False),
    Column("schema_version", Integer, nullable=False),
    Column("workload_id", Text, nullable=False),
    Column("workload_kind", Text, nullable=False),
    Column("tenant", Text, nullable=False),
    Column("model_family", Text, nullable=False),
    Column("accelerators_requested", Integer, nullable=False),
    Column("priority", Integer, nullable=False),
    Column("n_options", Integer, nullable=False),
    Column("n_nodes", Integer, nullable=False),
    Column("snapshot_hash", LargeBinary),
    Column("state_offset", Integer),
    Column("payload_zstd", LargeBinary, nullable=False),
    Column("feature_version", Text, nullable=False),
    Column("feature_hash", Text, nullable=False),
    Column("production_option", Integer),
    Column("production_propensity", Double),
    Column("production_source", Text),
    # Contract v2 (migration 0010): per-option feasibility bits (uint16 LE per option,
    # bit i = SIGNALS[i]), production's whole distribution (float64 LE, options then
    # defer), the QoS class. NULL on rows logged before.
    Column("feasibility_version", Text),
    Column("feasibility_bits", LargeBinary),
    Column("production_probabilities_f64", LargeBinary),
    Column("qos_class", Text),
    PrimaryKeyConstraint("request_id", "request_time", name="requests_pkey"),
    CheckConstraint(
        "production_source IN ('mirror', 'outcome')", name="requests_production_source"
    ),
    CheckConstraint(
        "(snapshot_hash IS NULL) = (state_offset IS NULL)", name="requests_snapshot_cut"
    ),
    Index("requests_time", "request_time"),
    postgresql_partition_by="RANGE (request_time)",
)

decisions = Table(
    "decisions",
    metadata,
    Column("request_id", Text, nullable=False),
    Column("request_time", TS, nullable=False),
    Column("policy_name", Text, nullable=False),
    Column("policy_version", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("chosen_option", Integer, nullable=False),
    Column("chosen_probability", Double),
    Column("production_probability", Double),
    Column("defer_probability", Double),
    Column("scores_f32", LargeBinary, nullable=False),
    Column("probabilities_f64", LargeBinary, nullable=False),
    Column("predicted", JSONB),
    Column("raw_favourite_infeasible", Boolean, nullable=False),
    Column("agrees_with_production", Boolean),
    Column("latency_us", BigInteger, nullable=False),
    Column("error", Text),
    Column("scored_at", TS, nullable=False),
    PrimaryKeyConstraint(
        "request_id", "policy_name", "policy_version", "request_time", name="decisions_pkey"
    ),
    CheckConstraint(
        "status IN ('ok', 'all_infeasible', 'infeasible_choice', 'error', 'timeout')",
        name="decisions_status",
    ),
    Index("decisions_policy_time", "policy_name", "policy_version", "request_time"),
    Index("decisions_time", "request_time", postgresql_using="brin"),
    Index(
        "decisions_disagreement",
        "policy_name",
        "request_time",
        postgresql_where=text("agrees_with_production = false"),
    ),
    postgresql_partition_by="RANGE (request_time)",
)


def _outcome_fields() -> tuple[Column[Any], ...]:
    """The contract `Outcome` fields, shared by joined and pending outcomes."""
    return (
        Column("queue_delay_s", Double),
        Column("throughput", Double),
        Column("completion_time_s", Double),
        Column("slo_met", Boolean),
        Column("failure", Text, nullable=False),
        Column("production_option", Integer),
        Column("production_propensity", Double),
        Column("journal_seq", BigInteger),
    )


outcomes = Table(
    "outcomes",
    metadata,
    Column("request_id", Text, nullable=False),
    Column("request_time", TS, nullable=False),
    Column("observed_at", TS, nullable=False),
    Column("received_at", TS, nullable=False),
    *_outcome_fields(),
    Column("join_state", Text, nullable=False),
    Column("joined_at", TS, nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("request_id", "request_time", name="outcomes_pkey"),
    CheckConstraint(_FAILURES, name="outcomes_failure"),
    CheckConstraint(
        "join_state IN ('after_request', 'before_request')", name="outcomes_join_state"
    ),
    Index("outcomes_observed", "observed_at"),
    Index("outcomes_received", "received_at"),  # migration 0006: the live checks' window
    postgresql_partition_by="RANGE (request_time)",
)

pending_outcomes = Table(
    "pending_outcomes",
    metadata,
    Column("request_id", Text, nullable=False),
    Column("observed_at", TS, nullable=False),
    Column("received_at", TS, nullable=False),
    *_outcome_fields(),
    PrimaryKeyConstraint("request_id", name="pending_outcomes_pkey"),
    CheckConstraint(_FAILURES, name="pending_outcomes_failure"),
    Index("pending_outcomes_received", "received_at"),
)

request_identities = Table(  # migration 0011: one request per request_id
    "request_identities",
    metadata,
    Column("request_id", Text, nullable=False),
    Column("request_time", TS, nullable=False),
    Column("content_sha256", LargeBinary),  # NULL for requests logged before 0011
    Column("journal_seq", BigInteger),
    PrimaryKeyConstraint("request_id", name="request_identities_pkey"),
    CheckConstraint(
        "content_sha256 IS NULL OR octet_length(content_sha256) = 32",
        name="request_identities_sha256",
    ),
)

conflicts = Table(
    "conflicts",
    metadata,
    Column("conflict_id", BigInteger, Identity(always=True), nullable=False),
    Column("request_id", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("existing", JSONB, nullable=False),
    Column("incoming", JSONB, nullable=False),
    Column("recorded_at", TS, nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("conflict_id", name="conflicts_pkey"),
    CheckConstraint(  # 'request': migration 0009
        "kind IN ('outcome', 'production_decision', 'request')", name="conflicts_kind"
    ),
    Index(
        "conflicts_once",
        "request_id",
        "kind",
        func.md5(literal_column("incoming::text")),
        unique=True,
    ),
)

PARTITIONED_TABLES: tuple[str, ...] = ("requests", "decisions", "outcomes")
"""Tables partitioned by RANGE on ``request_time``, one partition per UTC day."""
