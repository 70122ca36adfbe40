"""The untouched log verifies; editing, deleting, forging or moving a row does not."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine

from service.storage import count_decisions
from service.storage.chain.seal import ChainSealer
from service.storage.chain.verify import verify
from tests.storage.chain.chain_helpers import DAY1, DAY2, position_of, rewrite_chain, run_log, sql

BLOCK = 16


def _verify(sealer: ChainSealer, engine: Engine) -> object:
    return verify(engine, [sealer.anchor.path], sealer.anchor.key)


def test_the_untouched_log_verifies(logged: Engine, db_url: str, chain_dir: Path) -> None:
    code, out = run_log(db_url, chain_dir, "seal")
    assert code == 0, out
    assert f"sealed {count_decisions(logged)} decisions in 9 blocks" in out
    assert run_log(db_url, chain_dir, "seal")[1].startswith("sealed 0 decisions")
    code, out = run_log(db_url, chain_dir, "verify")
    assert code == 0, out
    assert "2 live days (140 decisions in 9 blocks; 70 requests in 5 blocks)" in out
    assert "the decision log verifies" in out


@pytest.mark.parametrize(
    ("column", "edit"),
    [
        ("chosen_option", "chosen_option + 1"),
        ("chosen_probability", "chosen_probability * (1 + 1e-15)"),
        ("scores_f32", "overlay(scores_f32 placing '\\x00'::bytea from 3 for 1)"),
        ("predicted", "'{\"throughput_q50\": 0.5}'::jsonb"),
    ],
)
def test_an_edited_row_with_a_recomputed_chain_fails_naming_its_block(
    logged: Engine,
    make_sealer: Callable[..., ChainSealer],
    db_url: str,
    chain_dir: Path,
    column: str,
    edit: str,
) -> None:
    make_sealer().seal_all()
    victim = "a-21"
    position = position_of(logged, DAY1, victim, "p1")
    sql(
        logged,
        f"UPDATE decisions SET {column} = {edit} WHERE request_id = :r AND policy_name = 'p1'",
        r=victim,
    )
    rewrite_chain(logged, DAY1)

    code, out = run_log(db_url, chain_dir, "verify")

    assert code == 1
    block = position // BLOCK
    first = block * BLOCK
    assert f"first broken link: day {DAY1}, block {block}, position {first}" in out
    assert f"positions {first}-{first + BLOCK - 1}" in out
    assert "decision_chain_blocks agrees: rewritten with the rows" in out


def test_an_edited_row_without_the_chain_rewritten_is_named_exactly(
    logged: Engine, make_sealer: Callable[..., ChainSealer], db_url: str, chain_dir: Path
) -> None:
    make_sealer().seal_all()
    position = position_of(logged, DAY2, "b-7", "p2")
    sql(
        logged,
        "UPDATE decisions SET latency_us = latency_us + 1 WHERE request_id = 'b-7' "
        "AND policy_name = 'p2'",
    )

    code, out = run_log(db_url, chain_dir, "verify")

    assert code == 1
    assert (
        f"first broken link: day {DAY2}, block {position // BLOCK}, position {position} "
        "(request `b-7`, policy `p2@1`): row hash recomputed"
    ) in out


def test_a_deleted_row_fails_at_its_position(
    logged: Engine, make_sealer: Callable[..., ChainSealer]
) -> None:
    sealer = make_sealer()
    sealer.seal_all()
    position = position_of(logged, DAY1, "a-5", "p2")
    sql(logged, "DELETE FROM decisions WHERE request_id = 'a-5' AND policy_name = 'p2'")
    rewrite_chain(logged, DAY1)  # even with the chain recomputed over the remaining rows

    report = verify(logged, [sealer.anchor.path], sealer.anchor.key)

    first = report.first
    assert first is not None and first.day == DAY1
    assert first.block == position // BLOCK


def test_a_forged_row_dated_into_a_sealed_block_fails(
    logged: Engine, make_sealer: Callable[..., ChainSealer]
) -> None:
    sealer = make_sealer()
    sealer.seal_all()
    position = position_of(logged, DAY2, "b-3", "p1")
    sql(
        logged,
        "INSERT INTO decisions SELECT request_id || '-forged', request_time, policy_name, "
        "policy_version, status, chosen_option, chosen_probability, production_probability, "
        "defer_probability, scores_f32, probabilities_f64, predicted, raw_favourite_infeasible, "
        "agrees_with_production, latency_us, error, scored_at, chain_xid, chain_seq "
        "FROM decisions WHERE request_id = 'b-3' AND policy_name = 'p1'",
    )

    report = verify(logged, [sealer.anchor.path], sealer.anchor.key)

    first = report.first
    assert first is not None
    assert (first.day, first.block) == (DAY2, position // BLOCK)
    assert first.position is not None and first.position <= position + 1


def test_a_forged_row_with_a_future_transaction_id_fails(
    logged: Engine, make_sealer: Callable[..., ChainSealer]
) -> None:
    sealer = make_sealer()
    sealer.seal_all()
    sql(
        logged,
        "INSERT INTO decisions SELECT 'from-the-future', request_time, policy_name, "
        "policy_version, status, chosen_option, chosen_probability, production_probability, "
        "defer_probability, scores_f32, probabilities_f64, predicted, raw_favourite_infeasible, "
        "agrees_with_production, latency_us, error, scored_at, 9000000000000, 1 "
        "FROM decisions WHERE request_id = 'b-3' AND policy_name = 'p1'",
    )
    report = verify(logged, [sealer.anchor.path], sealer.anchor.key)
    assert not report.ok
    assert "transaction id from the future" in str(report.first)
    assert "`from-the-future`" in str(report.first)


def test_two_rows_swapped_fail(logged: Engine, make_sealer: Callable[..., ChainSealer]) -> None:
    sealer = make_sealer()
    sealer.seal_all()
    a = position_of(logged, DAY1, "a-2", "p1")
    b = position_of(logged, DAY1, "a-30", "p1")
    sql(
        logged,
        "UPDATE decisions d SET chain_seq = s.other FROM (SELECT request_id, "
        "CASE request_id WHEN 'a-2' THEN (SELECT chain_seq FROM decisions WHERE request_id = "
        "'a-30' AND policy_name = 'p1') ELSE (SELECT chain_seq FROM decisions WHERE "
        "request_id = 'a-2' AND policy_name = 'p1') END AS other FROM decisions "
        "WHERE request_id IN ('a-2', 'a-30') AND policy_name = 'p1') s "
        "WHERE d.request_id = s.request_id AND d.policy_name = 'p1'",
    )
    assert position_of(logged, DAY1, "a-2", "p1") == b  # the attack did move them
    rewrite_chain(logged, DAY1)

    report = verify(logged, [sealer.anchor.path], sealer.anchor.key)

    first = report.first
    assert first is not None
    assert (first.day, first.block) == (DAY1, min(a, b) // BLOCK)


def test_a_row_edited_in_the_second_day_leaves_the_first_day_intact(
    logged: Engine, make_sealer: Callable[..., ChainSealer]
) -> None:
    sealer = make_sealer()
    sealer.seal_all()
    sql(logged, "UPDATE decisions SET error = 'x' WHERE request_id = 'b-29' AND policy_name = 'p2'")
    report = verify(logged, [sealer.anchor.path], sealer.anchor.key)
    assert [p.day for p in report.problems] == [DAY2]
    assert report.rows == 140  # every row was read, the broken block included


def test_a_column_the_hash_does_not_cover_fails(
    logged: Engine, make_sealer: Callable[..., ChainSealer]
) -> None:
    sealer = make_sealer()
    sealer.seal_all()
    sql(logged, "ALTER TABLE decisions ADD COLUMN reviewer_note text")
    report = verify(logged, [sealer.anchor.path], sealer.anchor.key)
    assert "not covered by the row hash: ['reviewer_note']" in str(report.first)
