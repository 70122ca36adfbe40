"""The outcome-join half of a writer transaction (semantics: `service.storage.log.outcomes`).

Runs on the writer's psycopg cursor, reading the staging tables: outcomes are
staged with ``first_in_batch`` marked, their requests looked up (recent
partitions first), the first of each request inserted into ``outcomes`` or
``pending_outcomes`` with ``ON CONFLICT DO NOTHING``, and every staged outcome
that was not inserted compared with the stored one to record conflicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from service.storage.log.rows import OutcomeRow
from service.storage.log.staging import OUTCOME_FIELDS, OUTCOMES, copy_rows

_CONTENT = (
    "queue_delay_s",
    "throughput",
    "completion_time_s",
    "slo_met",
    "failure",
    "production_option",
    "production_propensity",
)
_STORED = ", ".join(OUTCOME_FIELDS[3:])  # outcome fields after request_id, times
_EPOCH = "extract(epoch FROM {})::float8"


def _content(alias: str, observed: str) -> tuple[str, str]:
    """(row expression for comparison, jsonb for the conflicts table) of an outcome."""
    row = "(" + ", ".join([observed, *(f"{alias}.{c}" for c in _CONTENT)]) + ")"
    pairs = [f"'observed_at', {_EPOCH.format(observed)}"]
    pairs += [f"'{c}', {alias}.{c}" for c in _CONTENT]
    return row, "jsonb_build_object(" + ", ".join(pairs) + ")"


_STAGED_ROW, _STAGED_JSON = _content("s", "to_timestamp(s.observed_at)")


def join_pending(cur: psycopg.Cursor[Any]) -> int:
    """Move pending outcomes of the requests inserted in this batch into ``outcomes``.

    Reads ``stage_new_requests``; appends what it joined to ``stage_joined``.
    Returns the number joined. A pending outcome whose request already has a
    joined outcome (possible only when several writers race, see
    `service.storage.log.outcomes.rejoin_pending`) is a duplicate: dropped from
    pending, and recorded in ``conflicts`` if its content differs.
    """
    cur.execute(
        "SELECT EXISTS (SELECT 1 FROM pending_outcomes p"
        " JOIN stage_new_requests n ON n.request_id = p.request_id)"
    )
    if not _scalar(cur):
        return 0  # the common case: no outcome was waiting
    pending_row, pending_json = _content("p", "p.observed_at")
    joined_row, joined_json = _content("o", "o.observed_at")
    cur.execute(
        f"""
        WITH dup AS (
            DELETE FROM pending_outcomes p USING stage_new_requests n, outcomes o
             WHERE p.request_id = n.request_id
               AND o.request_id = n.request_id AND o.request_time = n.request_time
         RETURNING p.request_id, {joined_json} AS existing, {pending_json} AS incoming,
                   {joined_row} IS DISTINCT FROM {pending_row} AS differs)
        INSERT INTO conflicts (request_id, kind, existing, incoming)
        SELECT request_id, 'outcome', existing, incoming FROM dup WHERE differs
        ON CONFLICT DO NOTHING
        """
    )
    cur.execute(
        f"""
        WITH moved AS (
            DELETE FROM pending_outcomes p USING stage_new_requests n
             WHERE p.request_id = n.request_id
         RETURNING p.*, n.request_time AS rt),
        ins AS (
            INSERT INTO outcomes (request_id, request_time, observed_at, received_at,
                                  {_STORED}, join_state)
            SELECT request_id, rt, observed_at, received_at, {_STORED}, 'before_request'
              FROM moved
            RETURNING request_id, request_time, observed_at, production_option,
                      production_propensity)
        INSERT INTO stage_joined SELECT * FROM ins
        """
    )
    return cur.rowcount


@dataclass(frozen=True, slots=True)
class _Staged:
    joined: int
    pending: int
    duplicates: int
    conflicting: int


def stage_and_join(
    cur: psycopg.Cursor[Any], rows: Sequence[OutcomeRow], lookback_s: float
) -> _Staged:
    """Insert a batch's outcomes where they belong (see module doc).

    `lookback_s` bounds the first search for each outcome's request to
    ``request_time >= min(observed_at) - lookback_s`` so only recent
    partitions are probed; outcomes not found there are searched in all
    partitions before being declared pending.
    """
    seen: set[str] = set()
    tuples = []
    for row in rows:
        tuples.append((*(getattr(row, f) for f in OUTCOME_FIELDS), row.request_id not in seen))
        seen.add(row.request_id)
    copy_rows(cur, OUTCOMES, tuples)
    cur.execute("ANALYZE stage_outcomes")
    # Latest request with that id (ids are unique by contract; a reused id joins the latest).
    find = """
        UPDATE stage_outcomes s SET request_time = (
            SELECT r.request_time FROM requests r
             WHERE r.request_id = s.request_id {bound}
             ORDER BY r.request_time DESC LIMIT 1)
         WHERE s.request_time IS NULL
    """
    lo = min(r.observed_at for r in rows) - lookback_s
    cur.execute(find.format(bound="AND r.request_time >= to_timestamp(%(lo)s)"), {"lo": lo})
    cur.execute("SELECT count(*) FROM stage_outcomes WHERE request_time IS NULL")
    if _scalar(cur):
        cur.execute(find.format(bound=""))
    mark = """
        UPDATE stage_outcomes s SET inserted = true FROM ins
         WHERE s.request_id = ins.request_id AND s.first_in_batch
    """
    cur.execute(
        f"""
        WITH ins AS (
            INSERT INTO outcomes (request_id, request_time, observed_at, received_at,
                                  {_STORED}, join_state)
            SELECT request_id, request_time, to_timestamp(observed_at),
                   to_timestamp(received_at), {_STORED}, 'after_request'
              FROM stage_outcomes
             WHERE request_time IS NOT NULL AND first_in_batch
            ON CONFLICT DO NOTHING
            RETURNING request_id, request_time, observed_at, production_option,
                      production_propensity),
        j AS (INSERT INTO stage_joined SELECT * FROM ins)
        {mark}
        """
    )
    joined = cur.rowcount
    cur.execute(
        f"""
        WITH ins AS (
            INSERT INTO pending_outcomes (request_id, observed_at, received_at, {_STORED})
            SELECT request_id, to_timestamp(observed_at), to_timestamp(received_at), {_STORED}
              FROM stage_outcomes
             WHERE request_time IS NULL AND first_in_batch
            ON CONFLICT DO NOTHING
            RETURNING request_id)
        {mark}
        """
    )
    pending = cur.rowcount
    conflicting = _record_conflicts(cur, "outcomes", "o.request_time = s.request_time")
    conflicting += _record_conflicts(cur, "pending_outcomes", "s.request_time IS NULL")
    return _Staged(joined, pending, len(rows) - joined - pending, conflicting)


def _record_conflicts(cur: psycopg.Cursor[Any], table: str, match: str) -> int:
    """Record every not-inserted staged outcome whose content differs from the stored one."""
    stored_row, stored_json = _content("o", "o.observed_at")
    cur.execute(
        f"""
        WITH diff AS (
            SELECT s.request_id, 'outcome' AS kind, {stored_json} AS existing,
                   {_STAGED_JSON} AS incoming
              FROM stage_outcomes s
              JOIN {table} o ON o.request_id = s.request_id AND {match}
             WHERE NOT s.inserted AND {stored_row} IS DISTINCT FROM {_STAGED_ROW}),
        ins AS (
            INSERT INTO conflicts (request_id, kind, existing, incoming)
            SELECT * FROM diff ON CONFLICT DO NOTHING)
        SELECT count(*) FROM diff
        """
    )
    return _scalar(cur)


def apply_production(cur: psycopg.Cursor[Any]) -> tuple[int, int, tuple[float, ...]]:
    """Fill requests' production decision from the outcomes joined in this batch.

    Returns ``(filled, conflicts, outcome_delays_s)`` for the outcomes in
    ``stage_joined``.
    """
    cur.execute("SELECT count(*) FROM stage_joined")
    if not _scalar(cur):
        return 0, 0, ()
    cur.execute("ANALYZE stage_joined")
    cur.execute(
        """
        WITH diff AS (
            SELECT j.request_id, 'production_decision' AS kind,
                   jsonb_build_object('option', r.production_option,
                                      'propensity', r.production_propensity,
                                      'source', r.production_source) AS existing,
                   jsonb_build_object('option', j.production_option,
                                      'propensity', j.production_propensity,
                                      'source', 'outcome') AS incoming
              FROM stage_joined j
              JOIN requests r
                ON r.request_id = j.request_id AND r.request_time = j.request_time
             WHERE j.production_option IS NOT NULL AND r.production_option IS NOT NULL
               AND (r.production_option <> j.production_option
                    OR r.production_propensity <> j.production_propensity)),
        ins AS (
            INSERT INTO conflicts (request_id, kind, existing, incoming)
            SELECT * FROM diff ON CONFLICT DO NOTHING)
        SELECT count(*) FROM diff
        """
    )
    conflicts = _scalar(cur)
    cur.execute(
        """
        UPDATE requests r
           SET production_option = j.production_option,
               production_propensity = coalesce(r.production_propensity,
                                                j.production_propensity),
               production_source = coalesce(r.production_source, 'outcome')
          FROM stage_joined j
         WHERE r.request_id = j.request_id AND r.request_time = j.request_time
           AND j.production_option IS NOT NULL
           AND (r.production_option IS NULL
                OR (r.production_option = j.production_option
                    AND r.production_propensity IS NULL
                    AND j.production_propensity IS NOT NULL))
        """
    )
    filled = cur.rowcount
    cur.execute("SELECT extract(epoch FROM observed_at - request_time)::float8 FROM stage_joined")
    delays = tuple(float(r[0]) for r in cur.fetchall())
    return filled, conflicts, delays


def _scalar(cur: psycopg.Cursor[Any]) -> int:
    row = cur.fetchone()
    return int(row[0]) if row and row[0] is not None else 0
