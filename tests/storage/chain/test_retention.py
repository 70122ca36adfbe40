"""Retention drops whole days with a signed record; a forged or edited record does not verify."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from service.contract import MirrorRequest
from service.contract.errors import Conflict
from service.storage import count_decisions, list_partitions
from service.storage.chain.retire import retire
from service.storage.chain.seal import ChainSealer
from service.storage.chain.verify import verify
from tests.storage.chain.chain_helpers import DAY1, DAY2, run_log, sql, write_day


def test_retiring_a_day_drops_it_and_the_log_still_verifies(
    logged: Engine,
    make_sealer: Callable[..., ChainSealer],
    db_url: str,
    chain_dir: Path,
    requests_sample: list[MirrorRequest],
) -> None:
    make_sealer().seal_all()
    # Decisions committed after the last seal are sealed by the retirement itself.
    write_day(logged, requests_sample[2], DAY1, 5, "late", first=100)

    code, out = run_log(db_url, chain_dir, "retire", "--before", DAY2.isoformat())

    assert code == 0, out
    assert f"retired {DAY1}: 45 requests, 90 decisions, 0 outcomes, 6 blocks" in out
    assert "decisions_p20231114" not in list_partitions(logged, "decisions")
    assert "requests_p20231114" not in list_partitions(logged, "requests")
    assert count_decisions(logged) == 60
    with logged.connect() as conn:
        assert (
            conn.execute(
                text("SELECT count(*) FROM decision_chain_blocks WHERE day = :d"), {"d": DAY1}
            ).scalar()
            == 0
        )
    lines = [json.loads(x) for x in (chain_dir / "chain-anchor.jsonl").read_text().splitlines()]
    assert lines[-1]["kind"] == "retire"
    assert lines[-1]["retirement"]["decisions_rows"] == 90

    code, out = run_log(db_url, chain_dir, "verify")
    assert code == 0, out
    assert "1 live days (60 decisions in 4 blocks; 30 requests in 2 blocks), 1 retired days" in out


def test_a_day_that_does_not_verify_is_not_retired(
    logged: Engine, make_sealer: Callable[..., ChainSealer]
) -> None:
    sealer = make_sealer()
    sealer.seal_all()
    sql(logged, "UPDATE decisions SET chosen_option = 0 WHERE request_id = 'a-1'")
    with pytest.raises(Conflict, match=f"day {DAY1} does not verify, not retired"):
        retire(sealer, logged, DAY2)
    assert count_decisions(logged) == 140


def test_recent_days_are_refused(
    logged: Engine, make_sealer: Callable[..., ChainSealer], db_url: str, chain_dir: Path
) -> None:
    code, out = run_log(db_url, chain_dir, "retire", "--before", "2999-01-01")
    assert code == 2
    assert "`--before` must be at least 8 days ago" in out
    code, out = run_log(db_url, chain_dir, "retire", "--before", "yesterday")
    assert code == 2 and "`--before` must be a date YYYY-MM-DD" in out


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE decision_chain_retirements SET outcomes_rows = outcomes_rows + 7",
        "UPDATE decision_chain_retirements SET signature = repeat('0', 64)",
        "DELETE FROM decision_chain_retirements",
    ],
)
def test_an_edited_retirement_record_fails(
    logged: Engine, make_sealer: Callable[..., ChainSealer], edit: str
) -> None:
    sealer = make_sealer()
    retire(sealer, logged, DAY2)
    assert verify(logged, [sealer.anchor.path], sealer.anchor.key).ok
    sql(logged, "ALTER TABLE decision_chain_retirements DISABLE TRIGGER USER")
    sql(logged, edit)

    report = verify(logged, [sealer.anchor.path], sealer.anchor.key)

    assert report.first is not None and report.first.day == DAY1
    assert "retire" in report.first.what


def test_a_forged_retirement_of_a_live_day_fails(
    logged: Engine, make_sealer: Callable[..., ChainSealer]
) -> None:
    """The attacker drops day 2 and writes a retirement record for it, without the key."""
    sealer = make_sealer()
    sealer.seal_all()
    sql(
        logged,
        "INSERT INTO decision_chain_retirements (day, requests_rows, decisions_rows, "
        "outcomes_rows, blocks, final_head, signature) SELECT day, 30, 60, 0, count(*), "
        "(array_agg(head ORDER BY block DESC))[1], repeat('0', 64) "
        "FROM decision_chain_blocks WHERE day = :d GROUP BY day",
        d=DAY2,
    )
    sql(logged, "DELETE FROM decision_chain_blocks WHERE day = :d", d=DAY2)
    sql(logged, "DROP TABLE decisions_p20231115, requests_p20231115, outcomes_p20231115")

    report = verify(logged, [sealer.anchor.path], sealer.anchor.key)

    assert report.first is not None and report.first.day == DAY2
    assert "signature does not match" in report.first.what


def test_a_day_dropped_without_a_record_fails(
    logged: Engine, make_sealer: Callable[..., ChainSealer]
) -> None:
    sealer = make_sealer()
    sealer.seal_all()
    sql(logged, "ALTER TABLE decision_chain_blocks DISABLE TRIGGER USER")
    sql(logged, "DELETE FROM decision_chain_blocks WHERE day = :d", d=DAY1)
    sql(logged, "DROP TABLE decisions_p20231114")

    report = verify(logged, [sealer.anchor.path], sealer.anchor.key)

    assert report.first is not None
    assert (report.first.day, report.first.block, report.first.position) == (DAY1, 0, 0)
    assert "rows deleted" in report.first.what


def test_decisions_written_to_a_retired_day_are_not_chained_and_fail_verification(
    logged: Engine, make_sealer: Callable[..., ChainSealer], requests_sample: list[MirrorRequest]
) -> None:
    sealer = make_sealer()
    retire(sealer, logged, DAY2)
    write_day(logged, requests_sample[5], DAY1, 3, "undead")

    assert sealer.seal_all().skipped_retired == 6

    report = verify(logged, [sealer.anchor.path], sealer.anchor.key)
    assert report.first is not None and report.first.day == DAY1
    assert "retired, yet 6 decisions rows of this day exist" in report.first.what
