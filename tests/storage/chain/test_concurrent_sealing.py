"""Sealing while writers commit out of order skips no row and chains none twice."""

from __future__ import annotations

import threading
from collections.abc import Callable

from sqlalchemy import Engine, text

from service.contract import MirrorRequest
from service.storage import DecisionLogWriter, PartitionKeeper, count_decisions
from service.storage.chain.seal import ChainSealer
from service.storage.chain.verify import verify
from tests.storage.chain.chain_helpers import DAY1, DAY2, write_day

WRITERS = 4
BATCHES = 12
PER_BATCH = 5


def _sealed_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT coalesce(sum(row_count), 0) FROM decision_chain_blocks")
            ).scalar_one()
        )


def test_concurrent_writers_and_repeated_seals_skip_no_row(
    engine: Engine,
    make_sealer: Callable[..., ChainSealer],
    requests_sample: list[MirrorRequest],
) -> None:
    sealer = make_sealer(block_rows=7)
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            writer = DecisionLogWriter(engine, keeper=PartitionKeeper(engine, days_back=0))
            for b in range(BATCHES):
                day = (DAY1, DAY2)[(w + b) % 2]
                write_day(
                    engine,
                    requests_sample[w],
                    day,
                    PER_BATCH,
                    f"w{w}",
                    first=b * PER_BATCH,
                    writer=writer,
                )
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
    seals_with_rows = 0

    def seal_while_writing() -> None:
        nonlocal seals_with_rows
        try:
            while any(t.is_alive() for t in threads):
                seals_with_rows += sealer.seal().rows > 0
        except BaseException as exc:
            errors.append(exc)

    for t in threads:
        t.start()
    sealing = threading.Thread(target=seal_while_writing)
    sealing.start()
    verified_midway = 0
    try:
        while sealing.is_alive():  # verify races both the writers and the sealer
            midway = verify(engine, [sealer.anchor.path], sealer.anchor.key)
            assert midway.ok, midway.first
            verified_midway += 1
    finally:  # never leave threads holding connections behind a failure
        for t in [*threads, sealing]:
            t.join()
    assert errors == []
    sealer.seal_all()

    written = WRITERS * BATCHES * PER_BATCH * 2
    assert count_decisions(engine) == written
    assert _sealed_rows(engine) == written
    assert seals_with_rows > 1  # the seals really interleaved with the writes
    assert verified_midway > 0
    report = verify(engine, [sealer.anchor.path], sealer.anchor.key)
    assert report.ok, report.first
    assert report.rows == written


def test_a_row_of_a_transaction_still_open_is_sealed_after_it_commits(
    logged: Engine, make_sealer: Callable[..., ChainSealer], requests_sample: list[MirrorRequest]
) -> None:
    """An older transaction commits after a younger one: the seal waits for it."""
    sealer = make_sealer()
    sealer.seal_all()
    slow = logged.connect()
    try:
        tx = slow.begin()
        slow.execute(  # takes its transaction id (and its chain_xid) now...
            text(
                "INSERT INTO decisions (request_id, request_time, policy_name, policy_version, "
                "status, chosen_option, scores_f32, probabilities_f64, "
                "raw_favourite_infeasible, latency_us, scored_at) SELECT 'slow', "
                "request_time, policy_name, policy_version, status, chosen_option, scores_f32, "
                "probabilities_f64, raw_favourite_infeasible, latency_us, scored_at "
                "FROM decisions WHERE request_id = 'a-0' AND policy_name = 'p1'"
            )
        )
        # ...while a younger writer commits first, and a seal runs.
        write_day(logged, requests_sample[3], DAY1, 3, "fast", first=500)
        report = sealer.seal()
        assert report.rows == 0  # the younger rows sort after the open transaction's
        assert report.oldest_unsealed_s is not None
        tx.commit()
    finally:
        slow.close()
    assert sealer.seal_all().rows == 7
    assert _sealed_rows(logged) == count_decisions(logged) == 147
    assert verify(logged, [sealer.anchor.path], sealer.anchor.key).ok
