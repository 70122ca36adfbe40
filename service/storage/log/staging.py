"""Session-local staging tables and binary COPY into them.

Rows reach the real tables in two steps inside one transaction: binary COPY
into a TEMP staging table (the fastest way into PostgreSQL: ~10x executemany),
then ``INSERT ... SELECT ... ON CONFLICT DO NOTHING``, which makes a replay of
the same journal records a no-op and tells us how many rows were new.

Staging tables are created once per database session (``ON COMMIT DELETE
ROWS`` empties them at every commit; a rollback empties them anyway), so a
batch costs no catalog churn. Times stay Unix seconds (``float8``) here and
become ``timestamptz`` in the INSERT via ``to_timestamp``: one conversion, in
one place, for every table.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import Connection

from service.storage.log.rows import DecisionRow, OutcomeRow, RequestRow, SnapshotRow


@dataclass(frozen=True)
class Stage:
    """A staging table: its columns, their COPY types, and how a row becomes a tuple.

    ``copied`` leading columns are filled by COPY (all when None); the rest are
    filled later by SQL (e.g. the ``request_time`` found by the outcome join).
    """

    name: str
    columns: tuple[tuple[str, str], ...]
    to_tuple: Callable[[Any], Sequence[object]] | None = None
    copied: int | None = None

    def create_sql(self) -> sql.Composed:
        cols = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in self.columns
        )
        return sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} ({}) ON COMMIT DELETE ROWS").format(
            sql.Identifier(self.name), cols
        )


def _getter(names: Sequence[str]) -> Callable[[Any], Sequence[object]]:
    get = attrgetter(*names)
    return lambda row: get(row)


_SNAPSHOT_COLS = (
    ("snapshot_hash", "bytea"),
    ("state_zstd", "bytea"),
    ("n_nodes", "int4"),
    ("raw_bytes", "int4"),
)
_REQUEST_COLS = (
    ("request_id", "text"),
    ("request_time", "float8"),
    ("received_at", "float8"),
    ("journal_seq", "int8"),
    ("schema_version", "int4"),
    ("workload_id", "text"),
    ("workload_kind", "text"),
    ("tenant", "text"),
    ("model_family", "text"),
    ("accelerators_requested", "int4"),
    ("priority", "int4"),
    ("n_options", "int4"),
    ("n_nodes", "int4"),
    ("snapshot_hash", "bytea"),
    ("state_offset", "int4"),
    ("payload_zstd", "bytea"),
    ("feature_version", "text"),
    ("feature_hash", "text"),
    ("production_option", "int4"),
    ("production_propensity", "float8"),
    ("feasibility_version", "text"),
    ("feasibility_bits", "bytea"),
    ("qos_class", "text"),
    ("production_probabilities_f64", "bytea"),
    ("content_sha256", "bytea"),
)
_DECISION_COLS = (
    ("request_id", "text"),
    ("request_time", "float8"),
    ("policy_name", "text"),
    ("policy_version", "text"),
    ("status", "text"),
    ("chosen_option", "int4"),
    ("chosen_probability", "float8"),
    ("production_probability", "float8"),
    ("defer_probability", "float8"),
    ("scores_f32", "bytea"),
    ("probabilities_f64", "bytea"),
    ("predicted", "text"),
    ("raw_favourite_infeasible", "bool"),
    ("agrees_with_production", "bool"),
    ("latency_us", "int8"),
    ("error", "text"),
    ("scored_at", "float8"),
)
_OUTCOME_COLS = (
    ("request_id", "text"),
    ("observed_at", "float8"),
    ("received_at", "float8"),
    ("queue_delay_s", "float8"),
    ("throughput", "float8"),
    ("completion_time_s", "float8"),
    ("slo_met", "bool"),
    ("failure", "text"),
    ("production_option", "int4"),
    ("production_propensity", "float8"),
    ("journal_seq", "int8"),
)

_decision_get = attrgetter(*(c for c, _ in _DECISION_COLS))
_PREDICTED = [c for c, _ in _DECISION_COLS].index("predicted")


def _decision_tuple(row: DecisionRow) -> Sequence[object]:
    values: tuple[object, ...] = _decision_get(row)
    if row.predicted is None:
        return values
    out = list(values)
    out[_PREDICTED] = json.dumps(dict(row.predicted), allow_nan=False)
    return out


SNAPSHOTS = Stage("stage_snapshots", _SNAPSHOT_COLS, _getter([c for c, _ in _SNAPSHOT_COLS]))
REQUESTS = Stage("stage_requests", _REQUEST_COLS, _getter([c for c, _ in _REQUEST_COLS]))
DECISIONS = Stage("stage_decisions", _DECISION_COLS, _decision_tuple)
OUTCOME_FIELDS = tuple(c for c, _ in _OUTCOME_COLS)
"""`OutcomeRow` fields in ``stage_outcomes`` column order."""
OUTCOMES = Stage(
    "stage_outcomes",
    (
        *_OUTCOME_COLS,
        ("first_in_batch", "bool"),
        ("request_time", "timestamptz"),
        ("inserted", "bool NOT NULL DEFAULT false"),
    ),
    None,  # rows arrive as tuples: the writer adds first_in_batch
    copied=len(_OUTCOME_COLS) + 1,
)
NEW_REQUESTS = Stage(
    "stage_new_requests", (("request_id", "text"), ("request_time", "timestamptz"))
)
JOINED = Stage(
    "stage_joined",
    (
        ("request_id", "text"),
        ("request_time", "timestamptz"),
        ("observed_at", "timestamptz"),
        ("production_option", "int4"),
        ("production_propensity", "float8"),
    ),
)
REFUSED_REQUESTS = Stage("stage_refused_requests", _REQUEST_COLS)
"""Staged requests whose id another request holds (`service.storage.log.request_identity`)."""
ALL_STAGES = (SNAPSHOTS, REQUESTS, DECISIONS, OUTCOMES, NEW_REQUESTS, JOINED, REFUSED_REQUESTS)

# The row types each COPY stage accepts (documentation for readers and mypy).
CopyRow = SnapshotRow | RequestRow | DecisionRow | OutcomeRow


def staging_cursor(conn: Connection) -> psycopg.Cursor[Any]:
    """A psycopg cursor on `conn`'s session, with the staging tables present.

    Existence is asked of the session itself (one catalog lookup per batch)
    rather than remembered, because a rolled-back transaction also rolls back
    a ``CREATE TEMP TABLE`` and a reconnect starts a session without them.
    """
    raw = conn.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):
        raise TypeError(f"the decision log needs the psycopg driver, got {type(raw)!r}")
    cur = raw.cursor()
    last = sql.Literal(f"pg_temp.{ALL_STAGES[-1].name}")  # created last: all are there
    cur.execute(sql.SQL("SELECT to_regclass({})").format(last))
    row = cur.fetchone()
    if row is None or row[0] is None:
        for stage in ALL_STAGES:
            cur.execute(stage.create_sql())
    return cur


def copy_rows(
    cur: psycopg.Cursor[Any], stage: Stage, rows: Iterable[CopyRow | Sequence[object]]
) -> int:
    """Binary-COPY `rows` into `stage`; returns how many were written.

    Rows are dataclasses converted by the stage's ``to_tuple``, or ready tuples
    when the stage has none. Only the stage's ``copied`` leading columns are written.
    """
    to_tuple = stage.to_tuple or (lambda row: row)
    columns = stage.columns[: stage.copied]
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(stage.name), sql.SQL(", ").join(sql.Identifier(c) for c, _ in columns)
    )
    n = 0
    with cur.copy(statement) as copy:
        copy.set_types([t for _, t in columns])
        for row in rows:
            copy.write_row(to_tuple(row))
            n += 1
    return n
