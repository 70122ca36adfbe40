"""The decision-log writer: one batch, one transaction, idempotent.

``write`` binary-COPYs each kind of row into a session-local staging table and
moves it into the real table with ``INSERT ... SELECT ... ON CONFLICT DO
NOTHING``. Every unique key is the natural identity of the row —
``(request_id, request_time)``, ``(request_id, policy, version,
request_time)``, the snapshot's content hash, an outcome's request — so
re-writing records the journal already delivered (after a crash between the
database commit and the journal checkpoint) changes nothing, and the counts
say how many rows were new. A skipped request whose content differs from the
logged one is not a replay: it is recorded in ``conflicts``
(`service.storage.log.request_conflicts`, looked at only when rows were skipped).
A request whose ``request_id`` another request holds at another time never
reaches ``requests``, nor do its decisions: `service.storage.log.request_identity`
claims each id in the non-partitioned ``request_identities`` first, and the
refused ones are recorded in ``conflicts`` (one request per id).

Order inside the transaction: policies, snapshots, request identities, requests (then the pending
outcomes of newly logged requests are joined), decisions, outcomes, and last
the production decisions carried by joined outcomes. The caller advances the
journal checkpoint only after `write` returns: the commit happened.

Errors: `Unavailable` when the database cannot be reached (nothing was
committed; retry the same batch later), `Conflict` when a policy version is
re-registered with a different artifact (nothing was committed).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, LiteralString

import psycopg
from sqlalchemy import Engine

from service.contract.errors import Conflict
from service.storage.engine import unavailable_on_failure
from service.storage.log import outcome_join, request_identity
from service.storage.log import request_conflicts as request_conflict_log
from service.storage.log.partitions import PartitionKeeper
from service.storage.log.rows import (
    Counts,
    LogBatch,
    OutcomeCounts,
    PolicyRow,
    WriteResult,
)
from service.storage.log.staging import (
    DECISIONS,
    REQUESTS,
    SNAPSHOTS,
    CopyRow,
    Stage,
    copy_rows,
    staging_cursor,
)

_INSERT_SNAPSHOTS = """
    INSERT INTO cluster_snapshots (snapshot_hash, state_zstd, n_nodes, raw_bytes)
    SELECT snapshot_hash, state_zstd, n_nodes, raw_bytes FROM stage_snapshots
    ON CONFLICT (snapshot_hash) DO NOTHING
"""

_INSERT_REQUESTS = """
    WITH ins AS (
        INSERT INTO requests (
            request_id, request_time, received_at, journal_seq, schema_version,
            workload_id, workload_kind, tenant, model_family, accelerators_requested,
            priority, n_options, n_nodes, snapshot_hash, state_offset, payload_zstd,
            feature_version, feature_hash, production_option, production_propensity,
            production_source, feasibility_version, feasibility_bits, qos_class,
            production_probabilities_f64)
        SELECT request_id, to_timestamp(request_time), to_timestamp(received_at),
               journal_seq, schema_version, workload_id, workload_kind, tenant,
               model_family, accelerators_requested, priority, n_options, n_nodes,
               snapshot_hash, state_offset, payload_zstd, feature_version, feature_hash,
               production_option, production_propensity,
               CASE WHEN production_option IS NOT NULL THEN 'mirror' END,
               feasibility_version, feasibility_bits, qos_class, production_probabilities_f64
          FROM stage_requests
        ON CONFLICT (request_id, request_time) DO NOTHING
        RETURNING request_id, request_time)
    INSERT INTO stage_new_requests SELECT request_id, request_time FROM ins
"""

_INSERT_DECISIONS = """
    INSERT INTO decisions (
        request_id, request_time, policy_name, policy_version, status, chosen_option,
        chosen_probability, production_probability, defer_probability, scores_f32,
        probabilities_f64, predicted, raw_favourite_infeasible, agrees_with_production,
        latency_us, error, scored_at)
    SELECT request_id, to_timestamp(request_time), policy_name, policy_version, status,
           chosen_option, chosen_probability, production_probability, defer_probability,
           scores_f32, probabilities_f64, predicted::jsonb, raw_favourite_infeasible,
           agrees_with_production, latency_us, error, to_timestamp(scored_at)
      FROM stage_decisions
    ON CONFLICT (request_id, policy_name, policy_version, request_time) DO NOTHING
"""

_INSERT_POLICY = """
    INSERT INTO policies (name, version, kind, sha256, feature_version, feature_hash,
                          registered_at)
    VALUES (%s, %s, %s, %s, %s, %s, to_timestamp(%s))
    ON CONFLICT (name, version) DO NOTHING
"""

_POLICY_AS_STORED = """
    SELECT kind, sha256, feature_version, feature_hash FROM policies
     WHERE name = %s AND version = %s
"""


class DecisionLogWriter:
    """Writes `LogBatch`es to the decision log. One per scorer; not thread-safe.

    Args:
        engine: from `service.storage.engine.make_engine`.
        outcome_lookback_s: how far before an outcome's ``observed_at`` its
            request is first looked for (only those partitions are probed;
            outcomes not found there are then searched everywhere).
        keeper: keeps day partitions created ahead and for the days traffic
            reaches, never waiting on a lock (a long read cannot stall the
            write); None creates a default `PartitionKeeper` (7 days back, 7
            ahead, see `service.storage.log.partitions`).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        outcome_lookback_s: float = 7 * 86_400.0,
        keeper: PartitionKeeper | None = None,
    ) -> None:
        self._engine = engine
        self._lookback_s = outcome_lookback_s
        self._keeper = keeper if keeper is not None else PartitionKeeper(engine)

    def write(self, batch: LogBatch) -> WriteResult:
        """Commit `batch` in one transaction and count what was new.

        Raises:
            Unavailable: the database is unreachable; nothing was committed.
            Conflict: a policy (name, version) is already registered with a
                different kind, artifact hash or feature definition.
        """
        started = time.perf_counter()
        if not len(batch):
            return WriteResult()
        self._keeper.ensure_for(
            [r.request_time for r in batch.requests] + [d.request_time for d in batch.decisions]
        )
        with (
            unavailable_on_failure("writing the decision log"),
            self._engine.begin() as conn,
            staging_cursor(conn) as cur,
        ):
            result = self._write(cur, batch)
        return dataclasses.replace(result, elapsed_s=time.perf_counter() - started)

    def register_policies(self, rows: Sequence[PolicyRow]) -> Counts:
        """Record policy versions (call at startup, before scoring).

        Raises:
            Conflict: a (name, version) is registered with a different artifact.
            Unavailable: the database is unreachable.
        """
        return self.write(LogBatch(policies=rows)).policies

    def _write(self, cur: psycopg.Cursor[Any], batch: LogBatch) -> WriteResult:
        policies = self._write_policies(cur, batch.policies) if batch.policies else Counts()
        snapshots = Counts()
        if batch.snapshots:
            unique = list({s.snapshot_hash: s for s in batch.snapshots}.values())
            snapshots = _insert(cur, len(batch.snapshots), SNAPSHOTS, unique, _INSERT_SNAPSHOTS)
        requests = Counts()
        from_pending = request_conflicts = 0
        refused: frozenset[tuple[str, float]] = frozenset()
        if batch.requests:
            copy_rows(cur, REQUESTS, batch.requests)
            claimed = request_identity.claim(cur)  # ids held at another time: moved aside
            refused = claimed.refused
            requests = _move(cur, len(batch.requests) - claimed.n_refused, _INSERT_REQUESTS)
            if requests.inserted:
                from_pending = outcome_join.join_pending(cur)
            if claimed.n_refused:
                request_conflicts += request_conflict_log.record_refused(cur)
            if requests.duplicates:  # only then: a skipped row may contradict the logged one
                request_conflicts += request_conflict_log.record(cur)
        decisions = Counts()
        rows = batch.decisions
        if refused:  # a refused request's decisions are not logged either
            rows = [d for d in rows if (d.request_id, d.request_time) not in refused]
        if rows:
            decisions = _insert(cur, len(rows), DECISIONS, rows, _INSERT_DECISIONS)
        staged = None
        if batch.outcomes:
            staged = outcome_join.stage_and_join(cur, batch.outcomes, self._lookback_s)
        filled, production_conflicts, delays = outcome_join.apply_production(cur)
        return WriteResult(
            policies=policies,
            snapshots=snapshots,
            requests=requests,
            request_conflicts=request_conflicts,
            decisions=decisions,
            outcomes=OutcomeCounts(
                joined=staged.joined if staged else 0,
                pending=staged.pending if staged else 0,
                joined_from_pending=from_pending,
                duplicates=staged.duplicates if staged else 0,
                conflicting=staged.conflicting if staged else 0,
                production_filled=filled,
                production_conflicts=production_conflicts,
                outcome_delays_s=delays,
            ),
        )

    def _write_policies(self, cur: psycopg.Cursor[Any], rows: Sequence[PolicyRow]) -> Counts:
        inserted = 0
        for p in rows:
            cur.execute(
                _INSERT_POLICY,
                (
                    p.name,
                    p.version,
                    p.kind,
                    p.sha256,
                    p.feature_version,
                    p.feature_hash,
                    p.registered_at,
                ),
            )
            inserted += cur.rowcount
            cur.execute(_POLICY_AS_STORED, (p.name, p.version))
            stored = cur.fetchone()
            offered = (p.kind, p.sha256, p.feature_version, p.feature_hash)
            if stored is not None and tuple(stored) != offered:
                raise Conflict(
                    f"policy `{p.name}` version `{p.version}` is registered as "
                    f"(kind, sha256, feature_version, feature_hash) = {tuple(stored)}, "
                    f"got {offered}; give the changed artifact a new version"
                )
        return Counts(inserted=inserted, duplicates=len(rows) - inserted)


def _without_conflict_clause(insert_sql: LiteralString) -> LiteralString:
    """`insert_sql` without its ``ON CONFLICT ... DO NOTHING`` line: the plain insert."""
    lines = [line for line in insert_sql.splitlines() if "ON CONFLICT" not in line]
    plain = "\n".join(lines)
    if plain == insert_sql:
        raise ValueError("the statement has no ON CONFLICT clause")
    return plain


_PLAIN = {
    sql_text: _without_conflict_clause(sql_text)
    for sql_text in (_INSERT_REQUESTS, _INSERT_DECISIONS)
}
"""Statements tried plain first. Not snapshots: consecutive batches often share one."""


def _insert(
    cur: psycopg.Cursor[Any],
    offered: int,
    stage: Stage,
    rows: Sequence[CopyRow],
    insert_sql: LiteralString,
) -> Counts:
    """COPY `rows` into `stage`, move them in; count new rows against `offered`.

    Almost every batch is new, so the plain ``INSERT ... SELECT`` is tried first
    (inside a savepoint): it skips ``ON CONFLICT``'s extra index probe per row.
    Only when a row is already there (a replay after a crash, a re-mirrored
    request) does it fail with a unique violation; the savepoint is rolled
    back and `insert_sql` (``ON CONFLICT DO NOTHING``) runs instead. The rows
    written are the same either way.
    """
    copy_rows(cur, stage, rows)
    return _move(cur, offered, insert_sql)


def _move(cur: psycopg.Cursor[Any], offered: int, insert_sql: LiteralString) -> Counts:
    """Run `insert_sql` on rows already staged (plain first, see `_insert`); count them."""
    plain = _PLAIN.get(insert_sql)
    if plain is not None:
        cur.execute("SAVEPOINT plain_insert")
        try:
            cur.execute(plain)
        except psycopg.errors.UniqueViolation:
            cur.execute("ROLLBACK TO SAVEPOINT plain_insert")
        else:
            inserted = max(cur.rowcount, 0)
            cur.execute("RELEASE SAVEPOINT plain_insert")
            return Counts(inserted=inserted, duplicates=offered - inserted)
    cur.execute(insert_sql)
    inserted = max(cur.rowcount, 0)
    return Counts(inserted=inserted, duplicates=offered - inserted)
