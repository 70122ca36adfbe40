"""A reviewer's long read never stalls the decision log, and is cut at the limit.

Attaching a day partition needs an ACCESS EXCLUSIVE lock on the DEFAULT
partition, which a reviewer's open ``BEGIN; SELECT ... FROM decisions`` holds a
share lock on; the writer once created the day's partition on its write path
and waited — no log writes for as long as the read stayed open (every UTC
midnight with a long reviewer read). Here, on the real embedded PostgreSQL,
a reviewer session opens that read and holds it, the real writer writes a
batch for a day without partitions, and:

1. the rows land while the read is still open (waited on, with a hang guard;
   the write's duration is printed) — the partition creation gave up on its
   lock timeout and the rows went to DEFAULT;
2. the reviewer guard ends the read once it is over its limit, although the
   session had switched every timeout off;
3. the next batch creates the day's partitions and moves the rows into them.

A second test: a reviewer session idle inside a transaction is ended, and a
service-role session doing the reviewer API's ``SET ROLE`` is never touched.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from service.contract import MirrorRequest
from service.storage import (
    DecisionLogWriter,
    EmbeddedPostgres,
    LogBatch,
    PartitionKeeper,
    list_partitions,
    make_engine,
)
from service.storage.log.partitions import day_of
from tests.live_traffic import wait_for
from tests.storage.storage_helpers import decisions_of, request_batch

HANG_GUARD_S = 60.0


@pytest.fixture()
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


def _reviewer(pg_server: EmbeddedPostgres, db_url: str) -> psycopg.Connection:
    """A direct session as the reviewer role, every timeout it may lift lifted."""
    database = make_url(db_url).database
    conn = psycopg.connect(
        f"dbname={database} host={Path(pg_server.socket_dir)} user=understudy_reviewer"
    )
    for name in ("statement_timeout", "idle_in_transaction_session_timeout"):
        conn.execute(f"SET {name} = 0")
    conn.execute("SET transaction_timeout = 0")
    conn.commit()
    return conn


def _decisions_logged(engine: Engine) -> int | None:
    """Decisions in the log, or None if counting would wait on a lock (the old stall:
    reads queue behind a waiting ATTACH too)."""
    try:
        with engine.begin() as conn:
            conn.execute(text("SELECT set_config('lock_timeout', '1s', true)"))
            return int(conn.execute(text("SELECT count(*) FROM decisions")).scalar_one())
    except OperationalError:
        return None


def _alive(engine: Engine, pid: int) -> bool:
    with engine.connect() as conn:
        found = conn.execute(text("SELECT 1 FROM pg_stat_activity WHERE pid = :p"), {"p": pid})
        return found.first() is not None


def _where(engine: Engine, table: str) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(f"SELECT tableoid::regclass::text, count(*) FROM {table} GROUP BY 1")
        )
        return {str(name): int(n) for name, n in rows}


def _batch(requests: list[MirrorRequest]) -> LogBatch:
    return dataclasses.replace(request_batch(requests), decisions=decisions_of(requests))


def test_a_long_reviewer_read_neither_stalls_the_log_nor_outlives_its_limit(
    engine: Engine,
    db_url: str,
    pg_server: EmbeddedPostgres,
    requests_sample: list[MirrorRequest],
) -> None:
    requests = [
        dataclasses.replace(r, request_time=requests_sample[0].request_time)
        for r in requests_sample[:8]
    ]
    now = requests[0].request_time
    stamp = day_of(now).strftime("%Y%m%d")
    reviewer = _reviewer(pg_server, db_url)
    pid = reviewer.info.backend_pid
    writer_done = threading.Event()
    try:
        assert reviewer.execute("SELECT count(*) FROM decisions").fetchone() == (0,)
        # The read stays open: its share lock on every partition of `decisions` is held.
        clock = [now]  # the keeper's clock: moved by hand below, nothing waits on it
        keeper = PartitionKeeper(engine, clock=lambda: clock[0])
        writer = DecisionLogWriter(engine, keeper=keeper)
        started = time.perf_counter()

        def write() -> None:
            writer.write(_batch(requests[:4]))
            writer_done.set()

        threading.Thread(target=write, daemon=True).start()
        wait_for(lambda: _decisions_logged(engine) == 4, "the batch landing while the read is open")
        print(f"batch written in {time.perf_counter() - started:.3f} s with the read open")
        assert writer_done.wait(HANG_GUARD_S)
        assert _alive(engine, pid)  # the rows landed while the read was still open
        assert _where(engine, "decisions") == {"decisions_default": 4}

        from service.storage.log.partitions import RETRY_S
        from service.storage.reviewer.guard import ReviewerGuard

        # Imported here so that this file, run against the old code, fails on the stall above.
        guard = ReviewerGuard(engine, transaction_limit_s=1.0, idle_limit_s=3600.0)
        ended: dict[str, int] = {}
        wait_for(lambda: bool(ended.update(guard.sweep().terminated) or ended), "the read ended")
        assert ended == {"transaction": 1}
        assert not _alive(engine, pid)
        with pytest.raises(psycopg.OperationalError):
            reviewer.execute("SELECT count(*) FROM decisions")
    finally:
        reviewer.close()

    # Nothing holds the lock now, but the keeper waits `RETRY_S` after giving up...
    writer.write(_batch(requests[4:6]))
    assert _where(engine, "decisions") == {"decisions_default": 6}
    # ...then the next batch creates the day (and the week ahead) and moves the rows in.
    clock[0] = now + RETRY_S + 1  # the same UTC day
    writer.write(_batch(requests[6:]))
    assert _where(engine, "decisions") == {f"decisions_p{stamp}": 8}
    assert _where(engine, "requests") == {f"requests_p{stamp}": 8}
    assert keeper.gave_up == 1
    ahead = [day_of(now + d * 86_400).strftime("%Y%m%d") for d in range(8)]
    assert list_partitions(engine, "decisions") == [
        "decisions_default",
        *(f"decisions_p{day}" for day in ahead),
    ]


def test_an_idle_reviewer_transaction_is_ended_and_the_api_role_switch_is_not(
    engine: Engine, db_url: str, pg_server: EmbeddedPostgres
) -> None:
    from service.storage.reviewer.guard import ReviewerGuard  # imported here: see above

    reviewer = _reviewer(pg_server, db_url)
    pid = reviewer.info.backend_pid
    try:
        reviewer.execute("SELECT 1")  # BEGIN (implicit), then idle inside the transaction
        with engine.connect() as api:  # the reviewer API's way: the service's own session
            api.execute(text("SET LOCAL ROLE understudy_reviewer"))
            api.execute(text("SELECT count(*) FROM decisions"))
            api_pid = api.execute(text("SELECT pg_backend_pid()")).scalar_one()
            guard = ReviewerGuard(engine, transaction_limit_s=3600.0, idle_limit_s=0.5)
            ended: dict[str, int] = {}
            wait_for(lambda: bool(ended.update(guard.sweep().terminated) or ended), "idle ended")
            assert ended == {"idle": 1}
            assert not _alive(engine, pid)
            assert _alive(engine, api_pid)
            assert api.execute(text("SELECT current_user")).scalar() == "understudy_reviewer"
    finally:
        reviewer.close()
