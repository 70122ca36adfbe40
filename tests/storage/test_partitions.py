"""Daily partitions: created ahead, rows routed by request time, DEFAULT never refuses."""

from __future__ import annotations

import dataclasses
from datetime import date, timedelta

from sqlalchemy import Engine, text

from service.contract import MirrorRequest
from service.storage import (
    DecisionLogWriter,
    PartitionKeeper,
    count_requests,
    ensure_partitions,
    list_partitions,
)
from service.storage.log.partitions import day_of
from tests.storage.storage_helpers import decisions_of, request_batch


def _where(engine: Engine, table: str) -> dict[str, int]:
    """Rows of `table` per partition, read from each row's tableoid."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(f"SELECT tableoid::regclass::text, count(*) FROM {table} GROUP BY 1")
        )
        return {str(name): int(n) for name, n in rows}


def _stamp(day: date) -> str:
    return day.strftime("%Y%m%d")


def test_ensure_partitions_creates_each_day_once(engine: Engine) -> None:
    start = date(2026, 3, 1)
    assert ensure_partitions(engine, start, start + timedelta(days=2)) == 9
    assert ensure_partitions(engine, start, start + timedelta(days=3)) == 3
    for table in ("requests", "decisions", "outcomes"):
        assert list_partitions(engine, table) == [
            f"{table}_default",
            *(f"{table}_p{_stamp(start + timedelta(days=i))}" for i in range(4)),
        ]
    with engine.connect() as conn:  # the primary key came along with ATTACH
        n = conn.execute(
            text(
                "SELECT count(*) FROM pg_indexes WHERE tablename = 'decisions_p20260301' "
                "AND indexdef LIKE 'CREATE UNIQUE INDEX%'"
            )
        ).scalar()
    assert n == 1


def test_rows_go_to_default_then_move_into_their_day(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    requests = requests_sample[:8]
    day = day_of(requests[0].request_time)
    assert all(day_of(r.request_time) == day for r in requests)
    far_future = PartitionKeeper(engine, clock=lambda: 4_000_000_000.0)
    writer = DecisionLogWriter(engine, keeper=far_future)
    writer.write(
        dataclasses.replace(request_batch(requests[:4]), decisions=decisions_of(requests[:4]))
    )
    assert _where(engine, "requests") == {"requests_default": 4}
    assert _where(engine, "decisions") == {"decisions_default": 4}

    ensure_partitions(engine, day, day)
    part = f"_p{_stamp(day)}"
    assert _where(engine, "requests") == {f"requests{part}": 4}
    assert _where(engine, "decisions") == {f"decisions{part}": 4}

    writer.write(
        dataclasses.replace(request_batch(requests[4:]), decisions=decisions_of(requests[4:]))
    )
    assert _where(engine, "requests") == {f"requests{part}": 8}
    assert count_requests(engine) == 8
    # Replays are still recognised across the move.
    again = writer.write(request_batch(requests))
    assert again.requests.inserted == 0


def test_the_writer_creates_partitions_only_near_now(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    requests = requests_sample[:3]
    t = requests[0].request_time
    near = PartitionKeeper(engine, clock=lambda: t + 3600, days_back=1, days_ahead=1)
    DecisionLogWriter(engine, keeper=near).write(request_batch(requests))
    assert f"requests_p{_stamp(day_of(t))}" in list_partitions(engine, "requests")

    odd = dataclasses.replace(requests[0], request_id="from-1999", request_time=930_000_000.0)
    DecisionLogWriter(engine, keeper=near).write(request_batch([odd]))
    assert f"requests_p{_stamp(day_of(930_000_000.0))}" not in list_partitions(engine, "requests")
    assert _where(engine, "requests")["requests_default"] == 1
