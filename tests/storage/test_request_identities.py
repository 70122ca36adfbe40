"""One request per ``request_id`` in the log, whatever its ``request_time`` (issue 22 item 5).

``requests`` is unique on ``(request_id, request_time)`` only (it is partitioned
by time), so the same id re-sent with another time used to become a second
request row with a second set of decisions. The writer now claims each id in
``request_identities`` (migration 0011) in the same transaction: a request whose
id is held at another time is refused, with its decisions, and recorded in
``conflicts``. These tests drive the writer on the real PostgreSQL, as a replica
with no ingest index (or a restarted one) would reach it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, text

from service.contract import MirrorRequest
from service.contract.identity import content_sha256
from service.storage import DecisionLogWriter, LogBatch, conflicts, make_engine, rows_from
from service.storage.log.convert import outcome_row
from service.storage.migrate import downgrade, upgrade
from tests.storage.storage_helpers import (
    FEATURES,
    decisions_of,
    outcome_for,
    payload_of,
    request_batch,
)


def _later(request: MirrorRequest, seconds: float = 3600.0) -> MirrorRequest:
    """The same id at another time: another request under a taken id."""
    return dataclasses.replace(request, request_time=request.request_time + seconds)


def _with_decisions(requests: list[MirrorRequest], first_seq: int, seed: int = 0) -> LogBatch:
    batch = request_batch(requests, first_seq=first_seq)
    return dataclasses.replace(batch, decisions=decisions_of(requests, seed=seed))


def _rows(engine: Engine, table: str, request_id: str) -> list[float]:
    with engine.connect() as conn:
        found = conn.execute(
            text(
                f"SELECT extract(epoch FROM request_time) FROM {table}"
                " WHERE request_id = :r ORDER BY 1"
            ),
            {"r": request_id},
        )
        return [float(r[0]) for r in found]


def test_the_same_id_at_another_time_is_refused_with_its_decisions(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    writer = DecisionLogWriter(engine)
    first = requests_sample[0]
    written = writer.write(_with_decisions([first], first_seq=1))
    assert (written.requests.inserted, written.decisions.inserted) == (1, 1)

    moved = _later(first)
    clash = writer.write(_with_decisions([moved], first_seq=2, seed=1))
    assert (clash.requests.inserted, clash.decisions.inserted, clash.request_conflicts) == (0, 0, 1)
    assert _rows(engine, "requests", first.request_id) == [pytest.approx(first.request_time)]
    assert _rows(engine, "decisions", first.request_id) == [pytest.approx(first.request_time)]
    [recorded] = conflicts(engine, request_id=first.request_id)
    assert recorded.kind == "request"
    assert recorded.existing["request_time"] == pytest.approx(first.request_time)
    assert recorded.existing["journal_seq"] == 1
    assert recorded.existing["tenant"] == first.workload.tenant
    assert recorded.incoming["request_time"] == pytest.approx(moved.request_time)

    again = writer.write(_with_decisions([moved], first_seq=3, seed=1))  # re-sent: same conflict
    assert (again.requests.inserted, again.request_conflicts) == (0, 0)
    assert len(conflicts(engine, request_id=first.request_id)) == 1
    assert _rows(engine, "requests", first.request_id) == [pytest.approx(first.request_time)]


def test_a_clash_inside_one_batch_keeps_the_first_journaled(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    writer = DecisionLogWriter(engine)
    first = requests_sample[1]
    both = writer.write(_with_decisions([first, _later(first, 60.0)], first_seq=10))
    assert (both.requests.inserted, both.decisions.inserted, both.request_conflicts) == (1, 1, 1)
    assert _rows(engine, "requests", first.request_id) == [pytest.approx(first.request_time)]
    assert _rows(engine, "decisions", first.request_id) == [pytest.approx(first.request_time)]


def test_the_identity_holds_the_content_digest_and_a_resend_is_a_duplicate(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    writer = DecisionLogWriter(engine)
    r = requests_sample[2]
    writer.write(_with_decisions([r], first_seq=1))
    with engine.connect() as conn:
        held = conn.execute(
            text(
                "SELECT content_sha256, journal_seq FROM request_identities WHERE request_id = :i"
            ),
            {"i": r.request_id},
        ).one()
    assert (bytes(held[0]), held[1]) == (content_sha256(r), 1)
    # Re-sent in version 1 with an unknown field: other bytes, the same request.
    v1 = dataclasses.replace(r, schema_version=1)
    padded = payload_of(v1) + bytes([0xB8, 0x3E, 0x01])
    row, snapshot = rows_from(v1, padded, 42, r.request_time + 9.0, *FEATURES)
    result = writer.write(
        LogBatch(
            requests=[row],
            snapshots=[snapshot] if snapshot else [],
            decisions=decisions_of([r], seed=5),
        )
    )
    assert (result.requests.duplicates, result.request_conflicts) == (1, 0)
    assert (result.decisions.inserted, result.decisions.duplicates) == (0, 1)
    assert conflicts(engine) == []


def test_ids_logged_before_the_migration_are_held_by_time(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    """Back-filled identities have no digest: time decides, then the messages."""
    writer = DecisionLogWriter(engine)
    r = requests_sample[3]
    writer.write(request_batch([r]))
    with engine.begin() as conn:
        conn.execute(text("UPDATE request_identities SET content_sha256 = NULL"))
    same = writer.write(request_batch([r], first_seq=5))
    assert (same.requests.duplicates, same.request_conflicts) == (1, 0)
    other_tenant = dataclasses.replace(
        r, workload=dataclasses.replace(r.workload, tenant="someone-else")
    )
    assert writer.write(request_batch([other_tenant], first_seq=6)).request_conflicts == 1
    assert writer.write(request_batch([_later(r)], first_seq=7)).request_conflicts == 1
    assert _rows(engine, "requests", r.request_id) == [pytest.approx(r.request_time)]


def test_migration_0011_backfills_one_identity_per_id_and_goes_down(
    fresh_db: Callable[[bool], str], requests_sample: list[MirrorRequest]
) -> None:
    url = fresh_db(False)
    upgrade(url)
    engine = make_engine(url)
    try:
        a, b = requests_sample[4], requests_sample[5]
        DecisionLogWriter(engine).write(request_batch([a, b]))
        downgrade(url, "0010")
        with engine.begin() as conn:
            assert conn.execute(text("SELECT to_regclass('request_identities')")).scalar() is None
            # What the old code let in: the same id again, a day later, received later.
            conn.execute(
                text("CREATE TEMP TABLE twin AS SELECT * FROM requests WHERE request_id = :r"),
                {"r": a.request_id},
            )
            conn.execute(
                text(
                    "UPDATE twin SET request_time = request_time + interval '1 day',"
                    " received_at = received_at + interval '1 day', journal_seq = 99"
                )
            )
            conn.execute(text("INSERT INTO requests SELECT * FROM twin"))
        assert len(_rows(engine, "requests", a.request_id)) == 2
        upgrade(url)
        with engine.connect() as conn:
            held = conn.execute(
                text(
                    "SELECT request_id, extract(epoch FROM request_time), content_sha256,"
                    " journal_seq FROM request_identities ORDER BY journal_seq"
                )
            ).all()
        assert [(h[0], float(h[1]), h[2], h[3]) for h in held] == [
            (a.request_id, pytest.approx(a.request_time), None, 1),
            (b.request_id, pytest.approx(b.request_time), None, 2),
        ]
        # The back-filled identity now refuses a third time for `a`.
        assert (
            DecisionLogWriter(engine).write(request_batch([_later(a, 7.0)])).request_conflicts == 1
        )
        downgrade(url, "0010")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT to_regclass('request_identities')")).scalar() is None
    finally:
        engine.dispose()


def test_an_outcome_joins_the_one_request_of_its_id(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    """After a refused re-send at another time, the outcome still has one request to join."""
    writer = DecisionLogWriter(engine)
    first = requests_sample[6]
    writer.write(request_batch([first]))
    writer.write(request_batch([_later(first)], first_seq=2))  # refused: the id is taken
    outcome = outcome_for(first.request_id, observed_at=first.request_time + 7200.0)
    joined = writer.write(LogBatch(outcomes=[outcome_row(outcome, outcome.observed_at + 1.0)]))
    assert (joined.outcomes.joined, joined.outcomes.pending) == (1, 0)
    assert _rows(engine, "outcomes", first.request_id) == [pytest.approx(first.request_time)]
    again = writer.write(LogBatch(outcomes=[outcome_row(outcome, outcome.observed_at + 5.0)]))
    assert (again.outcomes.duplicates, again.outcomes.conflicting) == (1, 0)  # a re-send
