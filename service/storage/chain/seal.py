"""Sealing: hash new decisions, outcomes and requests into their day's chains, then anchor.

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

The same is done, in the same transaction and anchor line, for each chain of
``chain_codec.CHAINS`` (``outcomes`` and ``requests`` as ``decisions``), each
with its own cursor (its ``decision_chain_state`` row) and blocks table.

Nothing is signed that does not extend the signed chain: before a seal, the
anchor and its witness must agree and hold everything this process saw
(`Anchor.check`); the tail block each day's chain is extended from must be the
last block the anchor signed, with the same head. A crash between the commit
(3) and the anchor (4) leaves blocks the anchor lacks; the next seal anchors
them first (`catch_up`) — only after recomputing each one from the rows and
linking it to the last signed head. Anything else raises `SealRefused`, and
nothing is signed: signing would launder the tamper.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from datetime import time as dtime
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, text

from service.storage.chain.anchor import (
    Anchor,
    AnchoredBlock,
    Retirement,
    SealRefused,
    read_anchor,
    sign,
)
from service.storage.chain.codec import (
    CHAINS,
    DECISIONS,
    ChainRow,
    ChainSpec,
    CopyDecoder,
    block_head,
    copy_sql,
    genesis,
    row_hash_sql,
)
from service.storage.engine import unavailable_on_failure

log = logging.getLogger(__name__)

SEAL_LOCK = "understudy_chain_seal"
STATE = "decisions"


@dataclass(frozen=True)
class SealReport:
    """What one seal did (`rows` and `blocks`: of the decisions chain)."""

    rows: int = 0
    blocks: int = 0
    chained: tuple[tuple[str, int], ...] = ()
    """Rows chained per chain, e.g. ``(("decisions", 9), ("outcomes", 3), ("requests", 3))``."""
    watermark: int = 0
    skipped_retired: int = 0
    """Decisions of an already retired day (not chained; `verify` reports them)."""
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
    conn: Connection,
    where: str,
    params: Sequence[object],
    limit: int | None = None,
    spec: ChainSpec = DECISIONS,
) -> Iterable[ChainRow]:
    """Rows of `spec`'s table matching `where` (``%s`` parameters), in chain order, hashed.

    Consume it to the end: the COPY holds the connection until then.
    """
    cur = raw_cursor(conn)
    decoder = CopyDecoder(spec)
    with cur.copy(copy_sql(where, limit, spec), params) as copy:
        for chunk in copy:
            yield from decoder.feed(chunk)
    if not decoder.finished:
        raise ValueError(f"binary COPY of {spec.table} ended without its trailer")


def hashed_rows(
    conn: Connection,
    where: str,
    params: dict[str, object],
    limit: int | None = None,
    spec: ChainSpec = DECISIONS,
) -> list[ChainRow]:
    """Rows of `spec`'s table matching `where` (named parameters), in chain order, hashed.

    The sealer's path: only the hash and the order key leave PostgreSQL
    (`row_hash_sql`); `stream_rows` (the verifier's path) hashes the rows itself.
    """
    policy = "policy_name || '@' || policy_version" if spec.policy_fields else "''"
    sql = (
        "SELECT (request_time AT TIME ZONE 'UTC')::date, chain_xid, chain_seq, request_id, "
        f"{policy}, {row_hash_sql(spec)} FROM {spec.table} WHERE {where} "
        "ORDER BY chain_xid, chain_seq" + (f" LIMIT {int(limit)}" if limit else "")
    )
    return [
        ChainRow(bytes(r[5]), r[0], int(r[1]), int(r[2]), str(r[3]), str(r[4]))
        for r in conn.execute(text(sql), params)
    ]


def state_of(conn: Connection, *, lock: bool = False, name: str = STATE) -> tuple[int, int, int]:
    """Chain `name`'s cursor ``(chain_xid, chain_seq)`` sealed up to, and rows sealed."""
    row = conn.execute(
        text(
            "SELECT cursor_xid, cursor_seq, sealed_rows FROM decision_chain_state "
            "WHERE name = :n" + (" FOR UPDATE" if lock else "")
        ),
        {"n": name},
    ).first()
    if row is None:
        return -1, -1, 0
    return int(row[0]), int(row[1]), int(row[2])


def _tails(conn: Connection, days: Iterable[date], spec: ChainSpec) -> dict[date, _Tail]:
    rows = conn.execute(
        text(
            "SELECT DISTINCT ON (day) day, block, head, first_position + row_count "
            f"FROM {spec.blocks_table} WHERE day = ANY(:days) ORDER BY day, block DESC"
        ),
        {"days": list(days)},
    )
    return {r[0]: _Tail(int(r[1]), bytes(r[2]), int(r[3])) for r in rows}


def retired_days(conn: Connection) -> set[date]:
    """Days whose partitions were dropped by `retire`."""
    return set(conn.execute(text("SELECT day FROM decision_chain_retirements")).scalars())


def chain_rows(
    conn: Connection,
    rows: Sequence[ChainRow],
    block_rows: int,
    watermark: int,
    spec: ChainSpec = DECISIONS,
    anchor: Anchor | None = None,
) -> list[AnchoredBlock]:
    """Append `rows` (chain order) to their days' chains in blocks; return the new blocks.

    With `anchor`, each day's tail must be the last block it signed (`guard_tail`).
    """
    by_day: dict[date, list[ChainRow]] = defaultdict(list)
    for row in rows:
        by_day[row.day].append(row)
    tails = _tails(conn, by_day, spec)
    if anchor is not None:
        for day in by_day:
            guard_tail(anchor, spec, day, tails.get(day))
    made: list[AnchoredBlock] = []
    params: list[dict[str, Any]] = []
    for day, day_rows in sorted(by_day.items()):
        tail = tails.get(day, _Tail(-1, genesis(day, spec), 0))
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
            made.append(
                AnchoredBlock(day, block, tail.next_position, len(part), head.hex(), -1, spec.name)
            )
            tail = _Tail(block, head, tail.next_position + len(part))
    if params:
        conn.execute(
            text(
                f"INSERT INTO {spec.blocks_table} (day, block, first_position, row_count, "
                "first_xid, first_seq, last_xid, last_seq, prev_head, head, row_hashes, "
                "watermark) VALUES (:day, :block, :first, :n, :fx, :fs, :lx, :ls, :prev, "
                ":head, :hashes, :wm)"
            ),
            params,
        )
    return made


class _Unanchored(Exception):
    """A day's tail is a block the anchor has not signed yet: catch up first."""


def guard_tail(anchor: Anchor, spec: ChainSpec, day: date, tail: _Tail | None) -> None:
    """Refuse to extend `day`'s chain unless its tail is the last block `anchor` signed.

    Raises:
        SealRefused: the tail differs from the signed one (the blocks table was
            rewritten or cut), or the anchor signed blocks the table lacks.
        _Unanchored: the tail is beyond what the anchor signed (a crash after a
            seal's commit): `catch_up` verifies and anchors it first.
    """
    signed = anchor.contents.heads().get((spec.name, day))
    if tail is None and signed is None:
        return
    if tail is not None and (signed is None or tail.block > signed.block):
        raise _Unanchored(f"{spec.blocks_table} day {day} block {tail.block}")
    where = f"{spec.blocks_table} day {day}"
    if tail is None:
        assert signed is not None
        raise SealRefused(
            f"refusing to seal: {where} has no blocks, but the anchor signed block "
            f"{signed.block} (line {signed.line}): the chain's blocks were deleted"
        )
    assert signed is not None
    if (tail.block, tail.head.hex(), tail.next_position) != (
        signed.block,
        signed.head,
        signed.first_position + signed.row_count,
    ):
        raise SealRefused(
            f"refusing to seal: {where} ends with block {tail.block}, head "
            f"{tail.head.hex()[:16]}, but the anchor signed block {signed.block} with head "
            f"{signed.head[:16]} (line {signed.line}) last: the chain table was rewritten"
        )


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
        """Seal what is below the watermark (at most `max_rows` a chain) and anchor it.

        Raises:
            SealRefused: the anchor, its witness or the chain tables do not match
                the signed heads (module docstring); nothing was signed.
            Unavailable: the database cannot be reached.
        """
        with unavailable_on_failure("sealing the decision chain"), seal_lock(self._engine) as conn:
            if conn is None:
                return SealReport(locked_out=True)
            self.anchor.check()
            if self._needs_catch_up:
                self.catch_up(conn)
            try:
                with conn.begin():
                    report = self._seal(conn)
            except _Unanchored:  # another sealer crashed after its commit
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
        chained: dict[str, int] = defaultdict(int)
        while True:
            report = self.seal()
            total_rows += report.rows
            total_blocks += report.blocks
            skipped += report.skipped_retired
            for name, n in report.chained:
                chained[name] += n
            if report.caught_up and not report.locked_out:
                return SealReport(
                    rows=total_rows,
                    blocks=total_blocks,
                    chained=tuple(chained.items()),
                    watermark=report.watermark,
                    skipped_retired=skipped,
                    oldest_unsealed_s=report.oldest_unsealed_s,
                )
            if report.locked_out:
                time.sleep(0.05)

    def _seal(self, conn: Connection) -> SealReport:
        wm = int(
            conn.execute(
                text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
            ).scalar_one()
        )
        retired = retired_days(conn)
        caught_up = True
        skipped = 0
        blocks: list[AnchoredBlock] = []
        chained: list[tuple[str, int]] = []
        decisions = (0, 0)
        for spec in CHAINS:
            cx, cs, sealed = state_of(conn, lock=True, name=spec.name)
            fetched = hashed_rows(
                conn,
                "(chain_xid, chain_seq) > (:x, :s) AND chain_xid < :wm",
                {"x": cx, "s": cs, "wm": wm},
                self._max_rows,
                spec,
            )
            caught_up &= len(fetched) < self._max_rows
            if fetched:
                cx, cs = fetched[-1].chain_xid, fetched[-1].chain_seq
            rows = [r for r in fetched if r.day not in retired]
            for row in fetched:
                if row.day in retired:
                    log.error(
                        "%s row %s of retired day %s not chained",
                        spec.name,
                        row.request_id,
                        row.day,
                    )
            made = chain_rows(conn, rows, self.block_rows, wm, spec, self.anchor)
            blocks += made
            chained.append((spec.name, len(rows)))
            if spec is DECISIONS:
                skipped = len(fetched) - len(rows)
                decisions = (len(rows), len(made))
            conn.execute(
                text(
                    "INSERT INTO decision_chain_state (name, watermark, cursor_xid, cursor_seq, "
                    "sealed_rows, sealed_at) VALUES (:n, :wm, :cx, :cs, :rows, now()) "
                    "ON CONFLICT (name) DO UPDATE SET watermark = EXCLUDED.watermark, "
                    "cursor_xid = EXCLUDED.cursor_xid, cursor_seq = EXCLUDED.cursor_seq, "
                    "sealed_rows = EXCLUDED.sealed_rows, sealed_at = EXCLUDED.sealed_at"
                ),
                {"n": spec.name, "wm": wm, "cx": cx, "cs": cs, "rows": sealed + len(rows)},
            )
        dx, ds, _ = state_of(conn)
        oldest = conn.execute(
            text(
                "SELECT extract(epoch FROM now() - min(scored_at)) FROM decisions "
                "WHERE (chain_xid, chain_seq) > (:x, :s)"
            ),
            {"x": dx, "s": ds},
        ).scalar()
        return SealReport(
            rows=decisions[0],
            blocks=decisions[1],
            chained=tuple(chained),
            watermark=wm,
            skipped_retired=skipped,
            caught_up=caught_up,
            oldest_unsealed_s=float(oldest) if oldest is not None else None,
            new_blocks=tuple(blocks),
        )

    def catch_up(self, conn: Connection) -> int:
        """Anchor blocks and retirements the database has and the anchor file lacks.

        Covers a crash between a seal's commit and its anchor line. A block is
        anchored only after it is verified: its rows' hashes recomputed, its
        head recomputed, linked to the last head the anchor signed for its day
        (the day's genesis when none); a block the anchor signed must have the
        signed head. Retirement records are anchored only when their signature
        checks. Call it holding the seal lock (`seal` does). Returns lines written.

        Raises:
            SealRefused: a block does not verify (nothing is anchored).
        """
        written = 0
        missing: list[AnchoredBlock] = []
        watermark = 0
        signed_blocks = read_anchor(self.anchor.path, self.anchor.key).blocks
        with conn.begin():
            for spec in CHAINS:
                rows = conn.execute(
                    text(
                        "SELECT day, block, first_position, row_count, head, watermark "
                        f"FROM {spec.blocks_table} ORDER BY day, block"
                    )
                ).all()
                for r in rows:
                    b = AnchoredBlock(
                        r[0], int(r[1]), int(r[2]), int(r[3]), bytes(r[4]).hex(), -1, spec.name
                    )
                    signed = signed_blocks.get((spec.name, b.day, b.block))
                    if signed is None:
                        missing.append(b)
                        watermark = max(watermark, int(r[5]))
                    elif (signed.first_position, signed.row_count, signed.head) != (
                        b.first_position,
                        b.row_count,
                        b.head,
                    ):
                        raise SealRefused(
                            f"refusing to seal: {spec.blocks_table} day {b.day} block {b.block} "
                            f"has head {b.head[:16]}, the anchor signed {signed.head[:16]} "
                            f"(line {signed.line}): the chain table was rewritten"
                        )
                self._verify_unanchored(conn, spec, [b for b in missing if b.chain == spec.name])
            records = conn.execute(
                text(
                    "SELECT day, requests_rows, decisions_rows, outcomes_rows, blocks, "
                    "final_head, extract(epoch FROM retired_at), signature "
                    "FROM decision_chain_retirements ORDER BY day"
                )
            ).all()
        if missing:
            self.anchor.append_seal(watermark, missing)
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

    def _verify_unanchored(
        self, conn: Connection, spec: ChainSpec, blocks: Sequence[AnchoredBlock]
    ) -> None:
        """Recompute `blocks` (not yet anchored) from their rows, linked to the signed heads."""
        heads = self.anchor.contents.heads()
        by_day: dict[date, list[AnchoredBlock]] = defaultdict(list)
        for b in blocks:
            by_day[b.day].append(b)
        for day, day_blocks in by_day.items():
            signed = heads.get((spec.name, day))
            prev = bytes.fromhex(signed.head) if signed else genesis(day, spec)
            block = signed.block if signed else -1
            position = signed.first_position + signed.row_count if signed else 0
            for b in sorted(day_blocks, key=lambda x: x.block):
                where = (
                    f"refusing to seal: unanchored {spec.blocks_table} day {day} block {b.block}"
                )
                db = conn.execute(
                    text(
                        "SELECT prev_head, row_hashes, first_xid, first_seq, last_xid, last_seq "
                        f"FROM {spec.blocks_table} WHERE day = :d AND block = :b"
                    ),
                    {"d": day, "b": b.block},
                ).one()
                if (b.block, b.first_position, bytes(db[0])) != (block + 1, position, prev):
                    raise SealRefused(
                        f"{where} does not follow the last signed head {prev.hex()[:16]} "
                        f"(block {block}, next position {position}): the chain was rewritten"
                    )
                lo, hi = day_range(day)
                rows = hashed_rows(
                    conn,
                    "request_time >= :lo AND request_time < :hi "
                    "AND (chain_xid, chain_seq) BETWEEN (:fx, :fs) AND (:lx, :ls)",
                    {"lo": lo, "hi": hi, "fx": db[2], "fs": db[3], "lx": db[4], "ls": db[5]},
                    None,
                    spec,
                )
                hashes = [r.row_hash for r in rows]
                head = block_head(day, b.block, position, prev, hashes)
                if b"".join(hashes) != bytes(db[1]) or head.hex() != b.head:
                    raise SealRefused(
                        f"{where}: its rows hash to head {head.hex()[:16]}, the block says "
                        f"{b.head[:16]}: a row or the block was edited"
                    )
                prev, block, position = head, b.block, position + b.row_count


def day_range(day: date) -> tuple[datetime, datetime]:
    """The UTC day as ``[start, end)`` timestamps (its partition's bounds)."""
    lo = datetime.combine(day, dtime(0), tzinfo=UTC)
    return lo, lo + timedelta(days=1)


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
