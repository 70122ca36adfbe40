"""Retention: drop whole day partitions, leaving a signed retirement record.

``retire(sealer, before)`` handles each UTC day before `before` that still
has partitions, rows or chain blocks. For each day, in one transaction
holding the seal lock:

1. move any of the day's rows out of the DEFAULT partitions into its own
   (``understudy_ensure_partitions``) and lock the day's three partitions
   (ACCESS EXCLUSIVE: every writer that touched them has finished, none can
   start);
2. verify the day's sealed rows of each chain (decisions, outcomes,
   requests) against the anchor (a day that does not verify is not dropped:
   the evidence would go with it);
3. seal the day's remaining rows of each chain (committed after the last seal);
4. record the retirement (row counts of requests, decisions, outcomes; the
   number of decision blocks and their final head), signed with the anchor
   key, delete the day's blocks of every chain and drop the three partitions;
   commit;

then anchor the new blocks and the retirement record (still holding the seal
lock, so `verify` never sees the record before its anchor line). Nothing else in
Understudy deletes decision-log rows.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, date, datetime, timedelta

import psycopg
from sqlalchemy import Connection, Engine, exc, text

from service.contract.errors import Conflict
from service.storage.chain.anchor import AnchoredBlock, Retirement, read_anchor, sign
from service.storage.chain.codec import CHAINS, genesis
from service.storage.chain.seal import ChainSealer, chain_rows, seal_lock, state_of, stream_rows
from service.storage.chain.verify import day_bounds, verify_day
from service.storage.engine import unavailable_on_failure
from service.storage.log.tables import PARTITIONED_TABLES

MIN_AGE_DAYS = 8
"""Days younger than this are refused: the writer still creates and fills partitions
up to 7 days back (`PartitionKeeper`)."""
_DAY = re.compile(r"_p(\d{8})$")


def days_to_retire(engine: Engine, before: date) -> list[date]:
    """Days before `before` with a partition, a row in a DEFAULT partition, or chain blocks."""
    days: set[date] = set()
    lo = datetime.combine(before, datetime.min.time(), tzinfo=UTC)
    with engine.connect() as conn:
        for table in PARTITIONED_TABLES:
            names = conn.execute(
                text(
                    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                    "WHERE i.inhparent = to_regclass(:t)"
                ),
                {"t": table},
            ).scalars()
            for name in names:
                m = _DAY.search(name)
                if m:
                    day = datetime.strptime(m.group(1), "%Y%m%d").date()
                    if day < before:
                        days.add(day)
            days |= set(
                conn.execute(
                    text(
                        f"SELECT DISTINCT (request_time AT TIME ZONE 'UTC')::date "
                        f"FROM {table}_default WHERE request_time < :lo"
                    ),
                    {"lo": lo},
                ).scalars()
            )
        for spec in CHAINS:
            days |= set(
                conn.execute(
                    text(f"SELECT DISTINCT day FROM {spec.blocks_table} WHERE day < :b"),
                    {"b": before},
                ).scalars()
            )
        retired = set(conn.execute(text("SELECT day FROM decision_chain_retirements")).scalars())
    return sorted(days - retired)


def retire(
    sealer: ChainSealer,
    engine: Engine,
    before: date,
    *,
    allow_recent: bool = False,
    today: date | None = None,
) -> list[Retirement]:
    """Retire every day before `before` (module docstring); returns the records written.

    Raises:
        ValueError: `before` is within `MIN_AGE_DAYS` of today and not `allow_recent`.
        Conflict: a day's rows do not verify against the anchor (nothing of it dropped).
        Unavailable: the database cannot be reached.
    """
    today = today or datetime.now(UTC).date()
    if not allow_recent and before > today - timedelta(days=MIN_AGE_DAYS):
        latest = today - timedelta(days=MIN_AGE_DAYS)
        raise ValueError(
            f"`--before` must be at least {MIN_AGE_DAYS} days ago ({latest} or earlier), "
            f"got {before}: the writer may still fill younger days"
        )
    done: list[Retirement] = []
    with unavailable_on_failure("retiring partitions"):
        for day in days_to_retire(engine, before):
            sealer.seal_all()
            for attempt in range(3):
                try:
                    with seal_lock(engine, wait=True) as conn:
                        assert conn is not None  # waited for it
                        sealer.anchor.check()
                        record, blocks = _retire_day(sealer, conn, day)
                        sealer.anchor.append_seal(0, blocks)
                        sealer.anchor.append_retirement(record)
                    break
                except exc.OperationalError as err:  # a writer and the partition locks crossed
                    if not isinstance(err.orig, psycopg.errors.DeadlockDetected) or attempt == 2:
                        raise
            done.append(record)
    return done


def _count(conn: Connection, table: str) -> int:
    return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def _retire_day(
    sealer: ChainSealer, conn: Connection, day: date
) -> tuple[Retirement, list[AnchoredBlock]]:
    """Steps 1-4 of the module docstring on `conn`, which holds the seal lock."""
    stamp = day.strftime("%Y%m%d")
    parts = {t: f"{t}_p{stamp}" for t in PARTITIONED_TABLES}
    with conn.begin():
        conn.execute(text("SELECT understudy_ensure_partitions(:d, :d)"), {"d": day})
        conn.execute(text(f"LOCK TABLE {', '.join(parts.values())} IN ACCESS EXCLUSIVE MODE"))
        lo, hi = day_bounds(day)
        anchors = read_anchor(sealer.anchor.path, sealer.anchor.key)
        blocks: list[AnchoredBlock] = []
        for spec in CHAINS:
            problems = verify_day(conn, anchors, sealer.anchor.key, day, spec)
            if problems:
                raise Conflict(f"day {day} does not verify, not retired: {problems[0]}")
            cx, cs, _ = state_of(conn, lock=True, name=spec.name)
            tail = list(
                stream_rows(
                    conn,
                    "request_time >= %s AND request_time < %s "
                    "AND (chain_xid, chain_seq) > (%s, %s)",
                    (lo, hi, cx, cs),
                    spec=spec,
                )
            )
            blocks += chain_rows(conn, tail, sealer.block_rows, cx, spec, sealer.anchor)
        last = conn.execute(
            text(
                "SELECT count(*), max(block), (array_agg(head ORDER BY block DESC))[1] "
                "FROM decision_chain_blocks WHERE day = :d"
            ),
            {"d": day},
        ).one()
        record = Retirement(
            day=day,
            requests_rows=_count(conn, parts["requests"]),
            decisions_rows=_count(conn, parts["decisions"]),
            outcomes_rows=_count(conn, parts["outcomes"]),
            blocks=int(last[0]),
            final_head=bytes(last[2]).hex() if last[2] is not None else genesis(day).hex(),
            retired_at=round(time.time(), 3),
        )
        conn.execute(
            text(
                "INSERT INTO decision_chain_retirements (day, requests_rows, decisions_rows, "
                "outcomes_rows, blocks, final_head, retired_at, signature) VALUES (:day, :rq, "
                ":dc, :oc, :bl, :fh, to_timestamp(:at), :sig)"
            ),
            {
                "day": day,
                "rq": record.requests_rows,
                "dc": record.decisions_rows,
                "oc": record.outcomes_rows,
                "bl": record.blocks,
                "fh": bytes.fromhex(record.final_head),
                "at": record.retired_at,
                "sig": sign(sealer.anchor.key, record.as_json()),
            },
        )
        for spec in CHAINS:
            conn.execute(text(f"DELETE FROM {spec.blocks_table} WHERE day = :d"), {"d": day})
        conn.execute(text(f"DROP TABLE {', '.join(parts.values())}"))
    return record, blocks
