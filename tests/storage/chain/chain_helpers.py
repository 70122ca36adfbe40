"""Writing real decisions, the attacker's moves, and running the CLI, for the tamper tests."""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime
from pathlib import Path

from sqlalchemy import Engine, text
from typer.testing import CliRunner

from service.cli.main import app
from service.contract import MirrorRequest
from service.storage import DecisionLogWriter, PartitionKeeper, ensure_partitions
from service.storage.chain.codec import DECISIONS, ChainSpec, block_head, genesis
from service.storage.chain.seal import stream_rows
from tests.storage.storage_helpers import decisions_of, request_batch

DAY1 = date(2023, 11, 14)
DAY2 = date(2023, 11, 15)
POLICIES = ("p1", "p2")


def midnight(day: date) -> float:
    """Unix seconds of the day's start (UTC)."""
    return datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()


def write_day(
    engine: Engine,
    base: MirrorRequest,
    day: date,
    n: int,
    prefix: str,
    *,
    first: int = 0,
    writer: DecisionLogWriter | None = None,
) -> int:
    """Write `n` requests of `day` and each policy's decisions on them; returns decisions."""
    ensure_partitions(engine, day, day)
    start = midnight(day)
    requests = [
        dataclasses.replace(base, request_id=f"{prefix}-{i}", request_time=start + 60.0 * i)
        for i in range(first, first + n)
    ]
    decisions = [row for p in POLICIES for row in decisions_of(requests, p, seed=len(p) + first)]
    writer = writer or DecisionLogWriter(engine, keeper=PartitionKeeper(engine, days_back=0))
    writer.write(dataclasses.replace(request_batch(requests), decisions=decisions))
    return len(decisions)


def sql(engine: Engine, statement: str, **params: object) -> None:
    """Run `statement` as the attacker would (the service's role owns the tables)."""
    with engine.begin() as conn:
        conn.execute(text(statement), params)


def rewrite_chain(engine: Engine, day: date, spec: ChainSpec = DECISIONS) -> None:
    """The attacker recomputes the day's chain tables to match the rows as they now are.

    Keeps the block boundaries (row counts) and rewrites every block's row
    hashes, previous head and head from the current rows, with the triggers
    disabled (the table owner may).
    """
    with engine.begin() as conn:
        table = spec.blocks_table
        conn.execute(text(f"ALTER TABLE {table} DISABLE TRIGGER USER"))
        blocks = conn.execute(
            text(
                f"SELECT block, first_position, row_count FROM {table} "
                "WHERE day = :d ORDER BY block"
            ),
            {"d": day},
        ).all()
        lo = datetime(day.year, day.month, day.day, tzinfo=UTC)
        cx, cs = conn.execute(
            text("SELECT cursor_xid, cursor_seq FROM decision_chain_state WHERE name = :n"),
            {"n": spec.name},
        ).one()
        rows = list(
            stream_rows(
                conn,
                "request_time >= %s AND request_time < %s + interval '1 day' "
                "AND (chain_xid, chain_seq) <= (%s, %s)",
                (lo, lo, cx, cs),
                spec=spec,
            )
        )
        prev, position = genesis(day, spec), 0
        for block, _, count in blocks:
            hashes = [r.row_hash for r in rows[position : position + count]]
            head = block_head(day, block, position, prev, hashes)
            conn.execute(
                text(
                    f"UPDATE {table} SET prev_head = :p, head = :h, "
                    "row_hashes = :r, row_count = :n, first_position = :f "
                    "WHERE day = :d AND block = :b"
                ),
                {
                    "p": prev,
                    "h": head,
                    "r": b"".join(hashes),
                    "n": len(hashes),
                    "f": position,
                    "d": day,
                    "b": block,
                },
            )
            prev, position = head, position + count
        conn.execute(text(f"ALTER TABLE {table} ENABLE TRIGGER USER"))


def position_of(engine: Engine, day: date, request_id: str, policy: str) -> int:
    """A decision's 0-based position in its day's chain order."""
    lo = datetime(day.year, day.month, day.day, tzinfo=UTC)
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT pos FROM (SELECT request_id, policy_name, row_number() OVER "
                    "(ORDER BY chain_xid, chain_seq) - 1 AS pos FROM decisions "
                    "WHERE request_time >= :lo AND request_time < :lo + interval '1 day') x "
                    "WHERE request_id = :r AND policy_name = :p"
                ),
                {"lo": lo, "r": request_id, "p": policy},
            ).scalar_one()
        )


def witness_file(chain_dir: Path) -> Path:
    """The anchor's witness: another directory than the anchor's, as in production."""
    return chain_dir.parent / "witness" / "chain-anchor.jsonl"


def run_log(db_url: str, chain_dir: Path, *args: str) -> tuple[int, str]:
    """``understudy log <args>`` in-process, against the test's database and anchor."""
    env = {
        "UNDERSTUDY_DATABASE_URL": db_url,
        "UNDERSTUDY_DATA_DIR": str(chain_dir.parent / "data"),
        "UNDERSTUDY_CHAIN_KEY_FILE": str(chain_dir / "chain.key"),
        "UNDERSTUDY_CHAIN_ANCHOR_FILE": str(chain_dir / "chain-anchor.jsonl"),
        "UNDERSTUDY_CHAIN_WITNESS_FILE": str(witness_file(chain_dir)),
        "UNDERSTUDY_CHAIN_BLOCK_ROWS": "16",
        "COLUMNS": "200",
    }
    result = CliRunner().invoke(app, ["log", *args], env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, " ".join(result.output.split())
