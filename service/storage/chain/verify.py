"""``understudy log verify``: recompute the chains from the rows and hold them to the anchor.

For each chain (decisions, outcomes, requests: ``chain_codec.CHAINS``) and
every UTC day, in order:

- a retired day must have a retirement record in the database whose HMAC
  signature checks, equal to the one anchored, whose block count and final
  head equal the anchored chain's, and no rows or blocks left;
- any other day: the sealed rows (at or below the cursor) are read in chain
  order and hashed; block by block (the anchored blocks are the authority,
  database blocks beyond them are reported as not anchored) the head is
  recomputed from the previous head and the row hashes and compared with the
  anchored head, and the ``decision_chain_blocks`` row with the recomputation.

Each anchor file is compared with its witness (a cut or an edited line is
named), and blocks only the witness still holds are held against the rows too.
A request's production decision filled from its outcome must equal the
outcome's (the row hash covers only what the mirror sent, which never changes).

The first difference in a day ends that day's walk (later positions would
only echo it). A problem names the day, block, position, the row found there
(request id, policy) and what differs; `VerifyReport.first` is the first
broken link in (day, block, position) order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, text

from service.storage.chain.anchor import (
    AnchorContents,
    AnchoredBlock,
    Retirement,
    compare_witness,
    read_anchor,
    read_bytes,
    sign,
)
from service.storage.chain.codec import (
    CHAINS,
    DECISIONS,
    HASH_BYTES,
    REQUESTS,
    ChainRow,
    ChainSpec,
    block_head,
    genesis,
)
from service.storage.chain.findings import Problem, VerifyReport, merge_anchors
from service.storage.chain.seal import SEAL_LOCK, retirement_from_row, state_of, stream_rows
from service.storage.engine import unavailable_on_failure


@dataclass(frozen=True)
class _DbBlock:
    block: int
    first_position: int
    row_count: int
    prev_head: bytes
    head: bytes
    row_hashes: bytes


def day_bounds(day: date) -> tuple[datetime, datetime]:
    """The UTC day as ``[start, end)`` timestamps (its partition's bounds)."""
    lo = datetime.combine(day, time(0), tzinfo=UTC)
    return lo, lo + timedelta(days=1)


class _Verifier:
    def __init__(
        self,
        conn: Connection,
        anchors: AnchorContents,
        key: bytes,
        spec: ChainSpec = DECISIONS,
        report: VerifyReport | None = None,
    ) -> None:
        self.conn = conn
        self.anchors = anchors
        self.key = key
        self.spec = spec
        self.report = report or VerifyReport(anchor_lines=anchors.lines)
        self.cx, self.cs, _ = state_of(conn, name=spec.name)
        self.late: set[tuple[str, date, int]] = set()
        """Blocks anchored after the snapshot was taken (they may be missing from it)."""

    def problem(self, day: date | None, what: str, **where: Any) -> None:
        table = None if self.spec is DECISIONS else self.spec.table
        self.report.problems.append(Problem(day, what=what, table=table, **where))

    def anchored(self, day: date) -> dict[int, AnchoredBlock]:
        """This chain's anchored blocks of `day`, by number."""
        name = self.spec.name
        return {b: a for (c, d, b), a in self.anchors.blocks.items() if c == name and d == day}

    def columns(self) -> None:
        names = self.conn.execute(
            text(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name = :t"
            ),
            {"t": self.spec.table},
        ).scalars()
        uncovered = set(names) - self.spec.covers
        if uncovered:
            self.problem(
                None,
                f"{self.spec.table} columns not covered by the row hash: {sorted(uncovered)}",
            )

    def days(self) -> tuple[dict[date, tuple[int, int]], set[date]]:
        rows = self.conn.execute(
            text(
                "SELECT (request_time AT TIME ZONE 'UTC')::date, "
                "count(*) FILTER (WHERE (chain_xid, chain_seq) <= (:x, :s)), count(*) "
                f"FROM {self.spec.table} GROUP BY 1"
            ),
            {"x": self.cx, "s": self.cs},
        )
        counts = {r[0]: (int(r[1]), int(r[2])) for r in rows}
        block_days = set(
            self.conn.execute(text(f"SELECT DISTINCT day FROM {self.spec.blocks_table}")).scalars()
        )
        name = self.spec.name
        return counts, block_days | {d for c, d, _ in self.anchors.blocks if c == name}

    def db_blocks(self, day: date) -> dict[int, _DbBlock]:
        rows = self.conn.execute(
            text(
                "SELECT block, first_position, row_count, prev_head, head, row_hashes "
                f"FROM {self.spec.blocks_table} WHERE day = :d ORDER BY block"
            ),
            {"d": day},
        )
        return {
            int(r[0]): _DbBlock(
                int(r[0]), int(r[1]), int(r[2]), bytes(r[3]), bytes(r[4]), bytes(r[5])
            )
            for r in rows
        }

    def retirements(self) -> dict[date, tuple[Retirement, str]]:
        rows = self.conn.execute(
            text(
                "SELECT day, requests_rows, decisions_rows, outcomes_rows, blocks, final_head, "
                "extract(epoch FROM retired_at), signature FROM decision_chain_retirements"
            )
        ).all()
        return {r[0]: (retirement_from_row(r), str(r[7])) for r in rows}

    def retired_day(
        self, day: date, db: tuple[Retirement, str] | None, counts: tuple[int, int] | None
    ) -> None:
        anchored = self.anchors.retirements.get(day)
        if db is None:
            self.problem(day, "retired in the anchor but no record in decision_chain_retirements")
            return
        record, signature = db
        if sign(self.key, record.as_json()) != signature:
            self.problem(
                day, "retirement record's signature does not match its contents (edited or forged)"
            )
            return
        if anchored is None:
            self.problem(day, "retirement record is not anchored (forged, or the anchor was cut)")
            return
        if anchored != record:
            diff = {
                k: (v, anchored.as_json()[k])
                for k, v in record.as_json().items()
                if anchored.as_json()[k] != v
            }
            self.problem(day, f"retirement record differs from the anchored one: {diff}")
            return
        blocks = sorted(self.anchored(day).values(), key=_num)
        if self.spec is not DECISIONS:
            self._retired_rows(day, record, blocks, counts)
            return
        final = blocks[-1].head if blocks else genesis(day).hex()
        rows = sum(b.row_count for b in blocks)
        if (len(blocks), final, rows) != (record.blocks, record.final_head, record.decisions_rows):
            self.problem(
                day,
                f"retirement record says {record.blocks} blocks, {record.decisions_rows} rows, "
                f"final head {record.final_head[:16]}; the anchored chain has {len(blocks)} "
                f"blocks, {rows} rows, head {final[:16]}",
            )
        self._retired_leftovers(day, counts)

    def _retired_rows(
        self,
        day: date,
        record: Retirement,
        blocks: list[AnchoredBlock],
        counts: tuple[int, int] | None,
    ) -> None:
        """A retired day of the outcomes or requests chain: the record counts its anchored rows.

        A day retired before these chains existed (migration 0007) has none anchored.
        """
        dropped = record.outcomes_rows if self.spec.name == "outcomes" else record.requests_rows
        rows = sum(b.row_count for b in blocks)
        if blocks and rows != dropped:
            self.problem(
                day,
                f"retirement record says {dropped} {self.spec.table} rows were dropped; the "
                f"anchored chain has {rows}",
            )
        self._retired_leftovers(day, counts)

    def _retired_leftovers(self, day: date, counts: tuple[int, int] | None) -> None:
        if counts is not None and counts[1]:
            self.problem(day, f"retired, yet {counts[1]} {self.spec.table} rows of this day exist")
        if self.db_blocks(day):
            self.problem(day, f"retired, yet {self.spec.blocks_table} still holds blocks of it")

    def live_day(self, day: date) -> None:
        db = self.db_blocks(day)
        anchored = self.anchored(day)
        lo, hi = day_bounds(day)
        rows = iter(
            stream_rows(
                self.conn,
                "request_time >= %s AND request_time < %s AND (chain_xid, chain_seq) <= (%s, %s)",
                (lo, hi, self.cx, self.cs),
                spec=self.spec,
            )
        )
        try:
            self._walk(day, rows, db, anchored)
        finally:
            for _ in rows:  # finish the COPY
                pass

    def _walk(
        self,
        day: date,
        rows: Iterator[ChainRow],
        db: dict[int, _DbBlock],
        anchored: dict[int, AnchoredBlock],
    ) -> None:
        prev, position = genesis(day, self.spec), 0
        last = max([*db, *anchored], default=-1)
        for b in range(last + 1):
            a, d = anchored.get(b), db.get(b)
            if d is None and (self.spec.name, day, b) in self.late:
                break  # sealed after our snapshot: the rows are beyond its cursor too
            spec = a or d
            if spec is None:
                self.problem(day, "block missing from the anchor and the database", block=b)
                return
            first, count = spec.first_position, spec.row_count
            if first != position:
                self.problem(day, f"block starts at position {first}, expected {position}", block=b)
                return
            taken = [r for _, r in zip(range(count), rows, strict=False)]
            self.report.count(self.spec.name, len(taken))
            if len(taken) < count:
                self.problem(
                    day,
                    f"block holds {count} rows but the day's sealed rows end after "
                    f"{len(taken)} of them (rows deleted)",
                    block=b,
                    position=position + len(taken),
                )
                return
            hashes = [r.row_hash for r in taken]
            head = block_head(day, b, position, prev, hashes)
            if a is not None and head.hex() != a.head:
                self._locate(day, b, position, taken, head, a, d)
                return
            if d is None:
                self.problem(day, f"anchored block missing from {self.spec.blocks_table}", block=b)
                return
            if (d.prev_head, d.head, d.row_hashes, d.first_position, d.row_count) != (
                prev,
                head,
                b"".join(hashes),
                first,
                count,
            ):
                self.problem(
                    day,
                    f"{self.spec.blocks_table} differs from the rows' recomputed chain "
                    "(the chain table was edited)",
                    block=b,
                    position=position,
                )
                return
            if a is None:
                self.problem(
                    day,
                    f"block (positions {position}-{position + count - 1}) is sealed but not "
                    "anchored (run `understudy log seal` to anchor it; anchor file cut?)",
                    block=b,
                    position=position,
                )
                return
            prev, position = head, position + count
        extra = next(rows, None)
        if extra is not None:
            self.problem(
                day,
                "row is below the sealed cursor but in no block (inserted behind the sealer)",
                position=position,
                request_id=extra.request_id,
                policy=extra.policy,
            )

    def _locate(
        self,
        day: date,
        b: int,
        position: int,
        taken: list[ChainRow],
        head: bytes,
        a: AnchoredBlock,
        d: _DbBlock | None,
    ) -> None:
        """Name the row that breaks an anchored block, as closely as the database allows."""
        if d is not None:
            recorded = [d.row_hashes[i : i + HASH_BYTES] for i in range(0, len(d.row_hashes), 32)]
            for i, (row, was) in enumerate(zip(taken, recorded, strict=False)):
                if row.row_hash != was:
                    rewritten = (
                        " (its recorded head was recomputed to match)" if d.head == head else ""
                    )
                    self.problem(
                        day,
                        f"row hash recomputed {row.row_hash.hex()[:16]}, recorded "
                        f"{was.hex()[:16]}: the row was edited, inserted, deleted or moved"
                        f"{rewritten}; anchored head {a.head[:16]} (anchor line {a.line})",
                        block=b,
                        position=position + i,
                        request_id=row.request_id,
                        policy=row.policy,
                    )
                    return
        first, last_row = taken[0], taken[-1]
        self.problem(
            day,
            f"head recomputed from the rows is {head.hex()[:16]}"
            + (
                f" ({self.spec.blocks_table} agrees: rewritten with the rows)"
                if d and d.head == head
                else ""
            )
            + f", the anchor signed {a.head[:16]} (line {a.line}): a row among positions "
            f"{position}-{position + len(taken) - 1} (requests `{first.request_id}` .. "
            f"`{last_row.request_id}`) was edited, inserted, deleted or moved",
            block=b,
            position=position,
            request_id=first.request_id,
            policy=first.policy,
        )

    def future_rows(self) -> None:
        row = self.conn.execute(
            text(
                f"SELECT count(*), min(request_id) FROM {self.spec.table} "
                "WHERE chain_xid >= pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
            )
        ).one()
        if row[0]:
            self.problem(
                None,
                f"{row[0]} {self.spec.table} carry a transaction id from the future (forged "
                f"chain_xid), e.g. request `{row[1]}`",
            )

    def production_filled(self) -> None:
        """Sealed requests whose production decision, filled from the outcome, is not its outcome's.

        The row hash covers production's decision only as the mirror sent it
        (it never changes); one filled by the outcome join must equal the
        (chained) outcome's, and none may appear without a source.
        """
        rows = self.conn.execute(
            text(
                "SELECT r.request_id, (r.request_time AT TIME ZONE 'UTC')::date, "
                "r.production_option, r.production_propensity, r.production_source, "
                "o.production_option, o.production_propensity "
                "FROM requests r LEFT JOIN outcomes o "
                "ON o.request_id = r.request_id AND o.request_time = r.request_time "
                "WHERE (r.chain_xid, r.chain_seq) <= (:x, :s) AND ("
                "(r.production_source = 'outcome' AND (o.request_id IS NULL "
                "OR r.production_option IS DISTINCT FROM o.production_option "
                "OR r.production_propensity IS DISTINCT FROM o.production_propensity)) "
                "OR (r.production_source IS NULL AND (r.production_option IS NOT NULL "
                "OR r.production_propensity IS NOT NULL))) "
                "ORDER BY 2, 1 LIMIT 20"
            ),
            {"x": self.cx, "s": self.cs},
        ).all()
        for r in rows:
            outcome = (
                "no outcome"
                if r[5] is None and r[4] == "outcome"
                else (f"its outcome's option {r[5]}, propensity {r[6]}")
            )
            self.problem(
                r[1],
                f"production decision option {r[2]}, propensity {r[3]} (source {r[4]}) "
                f"does not match {outcome}: the request's production columns were edited",
                request_id=str(r[0]),
            )


def _num(b: AnchoredBlock) -> int:
    return b.block


def _with_witnesses(
    anchors: Sequence[Path], witnesses: Sequence[Path], key: bytes
) -> AnchorContents:
    """The anchors merged; each compared with its witness, whose extra blocks count too."""
    merged = merge_anchors(anchors, key)
    for anchor, witness in zip(anchors, witnesses, strict=False):
        a, w = read_bytes(anchor), read_bytes(witness)
        if not w:
            continue
        cut, _ = compare_witness(a, w, anchor.name, str(witness))
        merged.problems += cut
        if cut:  # the witness may hold what the anchor lost: hold the rows to it too
            contents = read_anchor(witness, key)
            merged.problems += [p for p in contents.problems if p not in merged.problems]
            for k, b in contents.blocks.items():
                merged.blocks.setdefault(k, b)
            merged.retirements = contents.retirements | merged.retirements
    return merged


def verify(
    engine: Engine,
    anchors: Sequence[Path],
    key: bytes,
    *,
    witnesses: Sequence[Path] = (),
    on_day: Callable[[date, int], None] | None = None,
    days_known: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Verify every chain against `anchors` and their `witnesses` (see the module docstring).

    `witnesses[i]` is `anchors[i]`'s witness (fewer witnesses than anchors: the
    rest have none). `days_known(n)` is told how many days will be checked,
    `on_day(day, i)` after each (a day counts once per chain).

    Raises:
        Unavailable: the database cannot be reached.
    """
    before = _with_witnesses(anchors, witnesses, key)
    with unavailable_on_failure("verifying the decision chain"), engine.connect() as conn:
        # Wait for a seal in progress to write its anchor line (it holds the lock until
        # then), then take the snapshot: every block in it is anchored by now.
        conn.execute(text("SELECT pg_advisory_lock_shared(hashtext(:k))"), {"k": SEAL_LOCK})
        conn.commit()
        conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        conn.execute(text("SELECT pg_advisory_unlock_shared(hashtext(:k))"), {"k": SEAL_LOCK})
        # Seals anchor after they commit: what was anchored before the snapshot must be in
        # it; what was anchored since may be missing from it, and is then not held against it.
        contents = _with_witnesses(anchors, witnesses, key)
        report = VerifyReport(anchor_lines=contents.lines)
        for message in contents.problems:
            report.problems.append(Problem(None, what=message))
        verifiers = [_Verifier(conn, contents, key, spec, report) for spec in CHAINS]
        plans = []
        for v in verifiers:
            v.late = set(contents.blocks) - set(before.blocks)
            v.columns()
            counts, chained = v.days()
            plans.append((v, counts, chained))
        retirements = verifiers[0].retirements()
        retired = set(retirements) | set(before.retirements)
        total = sum(len(set(counts) | chained | retired) for _, counts, chained in plans)
        if days_known is not None:
            days_known(total)
        i = 0
        for v, counts, chained in plans:
            for day in sorted(set(counts) | chained | retired):
                if day in retired:
                    if v.spec is DECISIONS:
                        report.retired_days += 1
                    v.retired_day(day, retirements.get(day), counts.get(day))
                else:
                    report.days += int(v.spec is DECISIONS)
                    v.live_day(day)
                if on_day is not None:
                    on_day(day, i)
                i += 1
            v.future_rows()
            if v.spec is DECISIONS:
                report.pending_rows = sum(total - sealed for sealed, total in counts.values())
            if v.spec is REQUESTS:
                v.production_filled()
        conn.rollback()
    return report


def verify_day(
    conn: Connection, anchors: AnchorContents, key: bytes, day: date, spec: ChainSpec = DECISIONS
) -> list[Problem]:
    """Problems of one live day's sealed rows of `spec`'s chain (`retire` checks a day first)."""
    v = _Verifier(conn, anchors, key, spec)
    v.live_day(day)
    return v.report.problems
