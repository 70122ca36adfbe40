"""Outcomes and requests are chained like decisions: an edit of either is named by `verify`.

Outcomes decide every off-policy verdict, and requests carry production's
decision and what the policies saw; before migration 0007 only decisions were
chained and such an edit went unnoticed. The tests that reproduce that use only
the CLI and SQL, so they also run against the code before the change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import date
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from service.contract import MirrorRequest
from service.storage import DecisionLogWriter, PartitionKeeper
from service.storage.chain.seal import ChainSealer
from service.storage.log.rows import LogBatch, OutcomeRow
from tests.storage.chain.chain_helpers import DAY1, DAY2, midnight, run_log, sql
from tests.storage.storage_helpers import request_batch

BLOCK = 16


def _outcome(request_id: str, at: float, option: int | None = None) -> OutcomeRow:
    return OutcomeRow(
        request_id=request_id,
        observed_at=at,
        received_at=at + 1,
        queue_delay_s=2.0,
        throughput=1.5,
        completion_time_s=300.0,
        slo_met=True,
        failure="none",
        production_option=option,
        production_propensity=None if option is None else 0.25,
    )


@pytest.fixture()
def with_outcomes(logged: Engine, requests_sample: list[MirrorRequest]) -> Engine:
    """`logged` plus outcomes of a-0..a-19 and b-0..b-9, and five requests (c-*) whose
    production decision only the outcome brings (the join fills it in)."""
    writer = DecisionLogWriter(logged, keeper=PartitionKeeper(logged, days_back=0))
    start = midnight(DAY1)
    silent = [
        dataclasses.replace(
            requests_sample[2],
            request_id=f"c-{i}",
            request_time=start + 7_000.0 + i,
            production=None,
        )
        for i in range(5)
    ]
    writer.write(request_batch(silent))
    outcomes = [_outcome(f"a-{i}", start + 60.0 * i + 30) for i in range(20)]
    outcomes += [_outcome(f"b-{i}", midnight(DAY2) + 60.0 * i + 30) for i in range(10)]
    outcomes += [_outcome(f"c-{i}", start + 7_100.0 + i, option=1) for i in range(5)]
    writer.write(LogBatch(outcomes=outcomes))
    return logged


def _position(engine: Engine, table: str, day: date, request_id: str) -> int:
    """A row's 0-based position in its day's chain of `table`."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT pos FROM (SELECT request_id, row_number() OVER (ORDER BY chain_xid, "
                    f"chain_seq) - 1 AS pos FROM {table} WHERE request_time >= to_timestamp(:lo) "
                    "AND request_time < to_timestamp(:lo) + interval '1 day') x "
                    "WHERE request_id = :r"
                ),
                {"lo": midnight(day), "r": request_id},
            ).scalar_one()
        )


def test_outcomes_and_requests_are_sealed_and_verify(
    with_outcomes: Engine, db_url: str, chain_dir: Path
) -> None:
    code, out = run_log(db_url, chain_dir, "seal")
    assert code == 0, out
    assert "sealed 140 decisions in 9 blocks (and 75 requests, 35 outcomes)" in out
    code, out = run_log(db_url, chain_dir, "verify")
    assert code == 0, out
    assert "140 decisions in 9 blocks; 75 requests in 5 blocks, 35 outcomes in 3 blocks" in out


def test_an_edited_outcome_is_named_with_its_table_and_row(
    with_outcomes: Engine, db_url: str, chain_dir: Path
) -> None:
    assert run_log(db_url, chain_dir, "seal")[0] == 0
    position = _position(with_outcomes, "outcomes", DAY1, "a-7")
    sql(with_outcomes, "UPDATE outcomes SET throughput = 15.0 WHERE request_id = 'a-7'")

    code, out = run_log(db_url, chain_dir, "verify")

    print(f"verify after an outcome edit: exit {code}: {out}")
    assert code == 1, out
    assert (
        f"first broken link: outcomes day {DAY1}, block {position // BLOCK}, position "
        f"{position} (request `a-7`): row hash recomputed"
    ) in out


def test_an_edited_request_is_named_with_its_table_and_row(
    with_outcomes: Engine, db_url: str, chain_dir: Path
) -> None:
    assert run_log(db_url, chain_dir, "seal")[0] == 0
    position = _position(with_outcomes, "requests", DAY2, "b-4")
    sql(with_outcomes, "UPDATE requests SET priority = priority + 1 WHERE request_id = 'b-4'")

    code, out = run_log(db_url, chain_dir, "verify")

    assert code == 1, out
    assert (
        f"first broken link: requests day {DAY2}, block {position // BLOCK}, position "
        f"{position} (request `b-4`): row hash recomputed"
    ) in out


def test_production_decisions_are_held_to_the_mirror_and_the_outcome(
    with_outcomes: Engine, db_url: str, chain_dir: Path
) -> None:
    """Mirrored: in the row hash. Filled from the outcome: must equal the chained outcome's."""
    assert run_log(db_url, chain_dir, "seal")[0] == 0
    with with_outcomes.connect() as conn:
        source = conn.execute(
            text("SELECT production_source FROM requests WHERE request_id IN ('a-2', 'c-3')")
        ).scalars()
        assert sorted(source) == ["mirror", "outcome"]  # both paths are exercised
    sql(with_outcomes, "UPDATE requests SET production_propensity = 0.9 WHERE request_id = 'c-3'")
    sql(
        with_outcomes,
        "UPDATE requests SET production_option = production_option + 1 WHERE request_id = 'a-2'",
    )

    code, out = run_log(db_url, chain_dir, "verify")

    assert code == 1, out
    assert (
        f"requests day {DAY1} (request `c-3`): production decision option 1, propensity 0.9" in out
    )
    assert "does not match its outcome's option 1, propensity 0.25" in out
    position = _position(with_outcomes, "requests", DAY1, "a-2")
    assert (
        f"requests day {DAY1}, block {position // BLOCK}, position {position} (request `a-2`)"
        in out
    )


def test_an_outcome_edit_with_its_chain_rewritten_names_the_block(
    with_outcomes: Engine, make_sealer: Callable[..., ChainSealer]
) -> None:
    from service.storage.chain.codec import OUTCOMES
    from service.storage.chain.verify import verify
    from tests.storage.chain.chain_helpers import rewrite_chain

    sealer = make_sealer()
    sealer.seal_all()
    position = _position(with_outcomes, "outcomes", DAY1, "a-18")
    sql(with_outcomes, "UPDATE outcomes SET slo_met = false WHERE request_id = 'a-18'")
    rewrite_chain(with_outcomes, DAY1, OUTCOMES)

    report = verify(with_outcomes, [sealer.anchor.path], sealer.anchor.key)

    first = report.first
    assert first is not None and first.table == "outcomes", first
    assert (first.day, first.block) == (DAY1, position // BLOCK)
    assert "outcome_chain_blocks agrees: rewritten with the rows" in first.what


def test_a_day_retires_with_its_outcome_and_request_chains(
    with_outcomes: Engine, make_sealer: Callable[..., ChainSealer], chain_dir: Path
) -> None:
    from service.storage.chain.retire import retire
    from service.storage.chain.verify import verify
    from tests.storage.chain.chain_helpers import witness_file

    sealer = make_sealer()
    sealer.seal_all()
    records = retire(sealer, with_outcomes, DAY2, allow_recent=True)
    assert [(r.day, r.requests_rows, r.decisions_rows, r.outcomes_rows) for r in records] == [
        (DAY1, 45, 80, 25)
    ]
    anchors, witnesses = [sealer.anchor.path], [witness_file(chain_dir)]
    report = verify(with_outcomes, anchors, sealer.anchor.key, witnesses=witnesses)
    assert report.ok, report.first
    assert report.chains["outcomes"] == (10, 1)  # DAY2's only

    with with_outcomes.begin() as conn:  # an outcome written later for the retired day
        conn.execute(text("SELECT understudy_ensure_partitions(:d, :d)"), {"d": DAY1})
        conn.execute(
            text(
                "INSERT INTO outcomes (request_id, request_time, observed_at, received_at, "
                "failure, join_state) VALUES ('late', to_timestamp(:t), to_timestamp(:t), "
                "to_timestamp(:t), 'none', 'after_request')"
            ),
            {"t": midnight(DAY1) + 5},
        )
    report = verify(with_outcomes, anchors, sealer.anchor.key, witnesses=witnesses)
    assert f"outcomes day {DAY1}: retired, yet 1 outcomes rows of this day exist" in [
        str(p) for p in report.problems
    ]


def test_a_production_decision_filled_after_its_request_was_sealed_still_verifies(
    logged: Engine,
    make_sealer: Callable[..., ChainSealer],
    requests_sample: list[MirrorRequest],
    chain_dir: Path,
) -> None:
    """The outcome join updates a sealed request: that is the service's own write, not an edit."""
    from service.storage.chain.verify import verify
    from tests.storage.chain.chain_helpers import witness_file

    writer = DecisionLogWriter(logged, keeper=PartitionKeeper(logged, days_back=0))
    at = midnight(DAY1) + 9_000.0
    silent = dataclasses.replace(
        requests_sample[2], request_id="d-0", request_time=at, production=None
    )
    writer.write(request_batch([silent]))
    sealer = make_sealer()
    sealer.seal_all()  # the request is sealed without a production decision
    writer.write(LogBatch(outcomes=[_outcome("d-0", at + 10, option=2)]))
    sealer.seal_all()

    with logged.connect() as conn:
        filled = conn.execute(
            text(
                "SELECT production_option, production_source FROM requests WHERE request_id = 'd-0'"
            )
        ).one()
    assert tuple(filled) == (2, "outcome")
    report = verify(
        logged, [sealer.anchor.path], sealer.anchor.key, witnesses=[witness_file(chain_dir)]
    )
    assert report.ok, report.first
