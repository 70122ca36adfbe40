"""Sealing: hash new decisions into their day's chain, then anchor the new heads.

One seal, in one transaction, holding a session-level advisory lock from
before it until its anchor line is written (so replicas and ``understudy log
seal`` never seal concurrently, and `verify` never sees a block committed but
not yet anchored):

1. ``wm = pg_snapshot_xmin(pg_current_snapshot())``: every transaction with an
   id below ``wm`` has committed or aborted, and every transaction still
   running or yet to start has an id ``>= wm``;
2. read the decisions with ``(chain_xid, chain_seq)`` after the global cursor
   and ``chain_xid < wm``, in that order (at most `max_rows`), hashed by the
   server (``ROW_HASH_SQL``: only 32 bytes a row leave PostgreSQL);
3. append them to their day's chain in blocks of at most `block_rows`;
   store the blocks and the new cursor; commit;
4. append the new heads to the anchor file (signed, fsynced).

No row is skipped: a row not yet visible at step 2 belongs to a transaction
with id ``>= wm`` and so sorts after the cursor; a row at or below the cursor
was visible to an earlier seal (its id was below that seal's ``wm``). Rows
keep their ``chain_xid`` when the partition keeper moves them out of the
DEFAULT partition, and the chain is per UTC day, not per physical table.

A crash between the commit (3) and the anchor (4) leaves blocks the anchor
lacks; the next seal anchors them first (`catch_up`), as it does retirement
records whose signature checks.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, text

from service.storage.chain_anchor import Anchor, AnchoredBlock, Retirement, sign
from service.storage.chain_codec import (
    ROW_HASH_SQL,
    ChainRow,
    CopyDecoder,
    block_head,
    copy_sql,
    genesis,
)
from service.storage.engine import unavailable_on_failure

log = logging.getLogger(__name__)

SEAL_LOCK = "understudy_chain_seal"
STATE = "decisions"


@dataclass(frozen=True)
class SealReport:
    """What one seal did."""

    rows: int = 0
    blocks: int = 0
    watermark: int = 0
    skipped_retired: int = 0
    """Rows of an already retired day (not chained; `verify` reports them)."""
    locked_out: bool = False
    """Another sealer held the lock; nothing was done."""
    caught_up: bool = True
    """False when `max_rows` stopped the seal before the watermark."""
    oldest_unsealed_s: float | None = None
    """Age (by ``scored_at``) of the oldest decision not sealed after this seal."""
    new_blocks: tuple[AnchoredBlock, ...] = field(default=(), repr=False)


@dataclass
class _Tail:
    block: int
    head: bytes
    next_position: int


def raw_cursor(conn: Connection) -> psycopg.Cursor[Any]:
    """A psycopg cursor on `conn`'s session (for COPY)."""
    raw = conn.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):
        raise TypeError(f"the decision chain needs the psycopg driver, got {type(raw)!r}")
    return raw.cursor()


def stream_rows(
    conn: Connection, where: str, params: Sequence[object], limit: int | None = None
) -> Iterable[ChainRow]:
    """Decisions matching `where` (``%s`` parameters), in chain order, hashed.

    Consume it to the end: the COPY holds the connection until then.
    """
    cur = raw_cursor(conn)
    decoder = CopyDecoder()
    with cur.copy(copy_sql(where, limit), params) as copy:
        for chunk in copy:
            yield from decoder.feed(chunk)
    if not decoder.finished:
        raise ValueError("binary COPY of decisions ended without its trailer")


def hashed_rows(
    conn: Connection, where: str, params: dict[str, object], limit: int | None = None
) -> list[ChainRow]:
    """Decisions matching `where` (named parameters), in chain order, hashed by the server.

    The sealer's path: only the hash and the order key leave PostgreSQL
    (`ROW_HASH_SQL`); `stream_rows` (the verifier's path) hashes the rows itself.
    """
    sql = (
        "SELECT (request_time AT TIME ZONE 'UTC')::date, chain_xid, chain_seq, request_id, "
        f"policy_name || '@' || policy_version, {ROW_HASH_SQL} FROM decisions WHERE {where} "
        "ORDER BY chain_xid, chain_seq" + (f" LIMIT {int(limit)}" if limit else "")
    )
    return [
        ChainRow(bytes(r[5]), r[0], int(r[1]), int(r[2]), str(r[3]), str(r[4]))
        for r in conn.execute(text(sql), params)
    ]


def state_of(conn: Connection, *, lock: bool = False) -> tuple[int, int, int]:
    """The global cursor ``(chain_xid, chain_seq)`` sealed up to, and rows sealed."""
    row = conn.execute(
        text(
            "SELECT cursor_xid, cursor_seq, sealed_rows FROM decision_chain_state "
            "WHERE name = :n" + (" FOR UPDATE" if lock else "")
        ),
        {"n": STATE},
    ).first()
    if row is None:
        return -1, -1, 0
    return int(row[0]), int(row[1]), int(row[2])


def _tails(conn: Connection, days: Iterable[date]) -> dict[date, _Tail]:
    rows = conn.execute(
        text(
            "SELECT DISTINCT ON (day) day, block, head, first_position + row_count "
            "FROM decision_chain_blocks WHERE day = ANY(:days) ORDER BY day, block DESC"
        ),
        {"days": list(days)},
    )
    return {r[0]: _Tail(int(r[1]), bytes(r[2]), int(r[3])) for r in rows}


def retired_days(conn: Connection) -> set[date]:
    """Days whose partitions were dropped by `retire`."""
    return set(conn.execute(text("SELECT day FROM decision_chain_retirements")).scalars())


def chain_rows(
    conn: Connection, rows: Sequence[ChainRow], block_rows: int, watermark: int
) -> list[AnchoredBlock]:
    """Append `rows` (chain order) to their days' chains in blocks; return the new blocks."""
    by_day: dict[date, list[ChainRow]] = defaultdict(list)
    for row in rows:
        by_day[row.day].append(row)
    tails = _tails(conn, by_day)
    made: list[AnchoredBlock] = []
    params: list[dict[str, Any]] = []
    for day, day_rows in sorted(by_day.items()):
        tail = tails.get(day, _Tail(-1, genesis(day), 0))
        for start in range(0, len(day_rows), block_rows):
            part = day_rows[start : start + block_rows]
            hashes = [r.row_hash for r in part]
            block = tail.block + 1
            head = block_head(day, block, tail.next_position, tail.head, hashes)
            params.append(
                {
                    "day": day,
                    "block": block,
                    "first": tail.next_position,
                    "n": len(part),
                    "fx": part[0].chain_xid,
                    "fs": part[0].chain_seq,
                    "lx": part[-1].chain_xid,
                    "ls": part[-1].chain_seq,
                    "prev": tail.head,
                    "head": head,
                    "hashes": b"".join(hashes),
                    "wm": watermark,
                }
            )
            made.append(AnchoredBlock(day, block, tail.next_position, len(part), head.hex(), -1))
            tail = _Tail(block, head, tail.next_position + len(part))
    if params:
        conn.execute(
            text(
                "INSERT INTO decision_chain_blocks (day, block, first_position, row_count, "
                "first_xid, first_seq, last_xid, last_seq, prev_head, head, row_hashes, "
                "watermark) VALUES (:day, :block, :first, :n, :fx, :fs, :lx, :ls, :prev, "
                ":head, :hashes, :wm)"
            ),
            params,
        )
    return made


@contextmanager
def seal_lock(engine: Engine, *, wait: bool = False) -> Iterator[Connection | None]:
    """A connection holding the session-level seal lock, or None when another holds it.

    Session-level, not transaction-level: it is held from before a seal's
    transaction until its anchor line is written, so `verify` (which takes
    it shared before its snapshot) never sees a committed block whose anchor
    line is still on its way.
    """
    with engine.connect() as conn:
        fn = "pg_advisory_lock" if wait else "pg_try_advisory_lock"
        got = conn.execute(text(f"SELECT {fn}(hashtext(:k))"), {"k": SEAL_LOCK}).scalar()
        conn.commit()
        if got is False:
            yield None
            return
        try:
            yield conn
        finally:
            if conn.in_transaction():
                conn.rollback()
            conn.execute(text("SELECT pg_advisory_unlock(hashtext(:k))"), {"k": SEAL_LOCK})
            conn.commit()


class ChainSealer:
    """Seals the decision log into the chain and anchors it (module docstring).

    Args:
        engine: the decision log.
        anchor: the anchor file (with its key).
        block_rows: most rows per block (a broken block names at most this many rows).
        max_rows: most rows one `seal` takes (a backlog takes several seals).
    """

    def __init__(
        self, engine: Engine, anchor: Anchor, *, block_rows: int = 1000, max_rows: int = 50_000
    ) -> None:
        if block_rows < 1 or max_rows < 1:
            raise ValueError("`block_rows` and `max_rows` must be >= 1")
        self._engine = engine
        self.anchor = anchor
        self.block_rows = block_rows
        self._max_rows = max_rows
        self._needs_catch_up = True

    def seal(self) -> SealReport:
        """Seal what is below the watermark (at most `max_rows`) and anchor it.

        Raises:
            Unavailable: the database cannot be reached.
        """
        with unavailable_on_failure("sealing the decision chain"), seal_lock(self._engine) as conn:
            if conn is None:
                return SealReport(locked_out=True)
            if self._needs_catch_up:
                self.catch_up(conn)
            with conn.begin():
                report = self._seal(conn)
            try:
                self.anchor.append_seal(report.watermark, report.new_blocks)
            except OSError:
                self._needs_catch_up = True
                raise
        return report

    def seal_all(self) -> SealReport:
        """Seal until caught up with the watermark (for the CLI and retirement)."""
        total_rows = total_blocks = skipped = 0
        while True:
            report = self.seal()
            total_rows += report.rows
            total_blocks += report.blocks
            skipped += report.skipped_retired
            if report.caught_up and not report.locked_out:
                return SealReport(
                    rows=total_rows,
                    blocks=total_blocks,
                    watermark=report.watermark,
                    skipped_retired=skipped,
                    oldest_unsealed_s=report.oldest_unsealed_s,
                )
            if report.locked_out:
                time.sleep(0.05)

    def _seal(self, conn: Connection) -> SealReport:
        cx, cs, sealed = state_of(conn, lock=True)
        wm = int(
            conn.execute(
                text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
            ).scalar_one()
        )
        retired = retired_days(conn)
        fetched = hashed_rows(
            conn,
            "(chain_xid, chain_seq) > (:x, :s) AND chain_xid < :wm",
            {"x": cx, "s": cs, "wm": wm},
            self._max_rows,
        )
        caught_up = len(fetched) < self._max_rows
        if fetched:
            cx, cs = fetched[-1].chain_xid, fetched[-1].chain_seq
        rows = [r for r in fetched if r.day not in retired]
        for row in fetched:
            if row.day in retired:
                log.error("decision %s of retired day %s not chained", row.request_id, row.day)
        blocks = chain_rows(conn, rows, self.block_rows, wm)
        conn.execute(
            text(
                "INSERT INTO decision_chain_state (name, watermark, cursor_xid, cursor_seq, "
                "sealed_rows, sealed_at) VALUES (:n, :wm, :cx, :cs, :rows, now()) "
                "ON CONFLICT (name) DO UPDATE SET watermark = EXCLUDED.watermark, "
                "cursor_xid = EXCLUDED.cursor_xid, cursor_seq = EXCLUDED.cursor_seq, "
                "sealed_rows = EXCLUDED.sealed_rows, sealed_at = EXCLUDED.sealed_at"
            ),
            {"n": STATE, "wm": wm, "cx": cx, "cs": cs, "rows": sealed + len(rows)},
        )
        oldest = conn.execute(
            text(
                "SELECT extract(epoch FROM now() - min(scored_at)) FROM decisions "
                "WHERE (chain_xid, chain_seq) > (:x, :s)"
            ),
            {"x": cx, "s": cs},
        ).scalar()
        skipped = len(fetched) - len(rows)
        return SealReport(
            rows=len(rows),
            blocks=len(blocks),
            watermark=wm,
            skipped_retired=skipped,
            caught_up=caught_up,
            oldest_unsealed_s=float(oldest) if oldest is not None else None,
            new_blocks=tuple(blocks),
        )

    def catch_up(self, conn: Connection) -> int:
        """Anchor blocks and retirements the database has and the anchor file lacks.

        Covers a crash between a seal's commit and its anchor line. Retirement
        records are anchored only when their signature checks. Call it holding
        the seal lock (`seal` does). Returns lines written.
        """
        written = 0
        with conn.begin():
            anchored = self.anchor.anchored
            rows = conn.execute(
                text(
                    "SELECT day, block, first_position, row_count, head, watermark "
                    "FROM decision_chain_blocks ORDER BY day, block"
                )
            ).all()
            records = conn.execute(
                text(
                    "SELECT day, requests_rows, decisions_rows, outcomes_rows, blocks, "
                    "final_head, extract(epoch FROM retired_at), signature "
                    "FROM decision_chain_retirements ORDER BY day"
                )
            ).all()
        missing = [
            AnchoredBlock(r[0], int(r[1]), int(r[2]), int(r[3]), bytes(r[4]).hex(), -1)
            for r in rows
            if int(r[1]) > anchored.get(r[0], -1)
        ]
        if missing:
            self.anchor.append_seal(max(int(r[5]) for r in rows), missing)
            written += 1
        for r in records:
            if r[0] in self.anchor.retired:
                continue
            record = retirement_from_row(r)
            if sign(self.anchor.key, record.as_json()) != r[7]:
                log.error("retirement record of %s has a bad signature: not anchored", r[0])
                continue
            self.anchor.append_retirement(record)
            written += 1
        self._needs_catch_up = False
        return written


def retirement_from_row(r: Sequence[Any]) -> Retirement:
    """A `Retirement` from a ``decision_chain_retirements`` row (selected as in `catch_up`)."""
    return Retirement(
        day=r[0],
        requests_rows=int(r[1]),
        decisions_rows=int(r[2]),
        outcomes_rows=int(r[3]),
        blocks=int(r[4]),
        final_head=bytes(r[5]).hex(),
        retired_at=round(float(r[6]), 6),
    )
