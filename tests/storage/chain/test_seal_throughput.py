"""How fast the chains are sealed and verified, and what the chain columns cost writes (printed).

Each round also writes an outcome per request (untimed), so the seal and the
verification cover the three chains (requests, decisions, outcomes); a few
small seals after the backlog show what a routine seal costs, the checks
against the signed heads and the witness included.

Nothing here asserts a speed (benchmarks do not belong in assertions); the
assertions check the work was done. docs/tamper_evidence.md quotes the output.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from service.contract import MirrorRequest
from service.storage import DecisionLogWriter, ensure_partitions, make_engine
from service.storage.chain.anchor import Anchor, load_key
from service.storage.chain.seal import ChainSealer
from service.storage.chain.verify import verify
from service.storage.log.partitions import day_of
from service.storage.log.rows import LogBatch, OutcomeRow
from tests.storage.storage_helpers import decisions_of, request_batch

N_REQUESTS = 500
N_POLICIES = 12
ROUNDS = 3
SMALL_SEALS = 5

pytestmark = pytest.mark.slow


def _outcomes(requests: list[MirrorRequest]) -> LogBatch:
    return LogBatch(
        outcomes=[
            OutcomeRow(
                r.request_id,
                r.request_time + 60,
                r.request_time + 61,
                1.0,
                2.0,
                30.0,
                True,
                "none",
                None,
                None,
            )
            for r in requests
        ]
    )


def _write_rounds(engine: Engine, base: MirrorRequest, *, outcomes: bool) -> list[float]:
    """Seconds to write N_REQUESTS x N_POLICIES decisions, per round (fresh ids each round)."""
    writer = DecisionLogWriter(engine)
    times = []
    for r in range(ROUNDS):
        requests = [
            dataclasses.replace(base, request_id=f"r{r}-{i}", request_time=base.request_time + i)
            for i in range(N_REQUESTS)
        ]
        ensure_partitions(engine, day_of(base.request_time), day_of(requests[-1].request_time))
        writer.write(request_batch(requests))
        decisions = [
            row for p in range(N_POLICIES) for row in decisions_of(requests, f"policy-{p}", seed=p)
        ]
        started = time.perf_counter()
        result = writer.write(dataclasses.replace(request_batch([]), decisions=decisions))
        times.append(time.perf_counter() - started)
        assert result.decisions.inserted == len(decisions)
        if outcomes:
            writer.write(_outcomes(requests))
    return times


def _small_seals(engine: Engine, sealer: ChainSealer, base: MirrorRequest) -> list[float]:
    """Seconds of a seal of one request, its decisions and its outcome, after the backlog."""
    writer = DecisionLogWriter(engine)
    times = []
    for i in range(SMALL_SEALS):
        request = dataclasses.replace(base, request_id=f"s-{i}", request_time=base.request_time + i)
        decisions = [
            row for p in range(N_POLICIES) for row in decisions_of([request], f"policy-{p}")
        ]
        writer.write(dataclasses.replace(request_batch([request]), decisions=decisions))
        writer.write(_outcomes([request]))
        started = time.perf_counter()
        assert sealer.seal().rows == N_POLICIES
        times.append(time.perf_counter() - started)
    return times


def test_sealing_and_write_overhead(
    fresh_db: Callable[[bool], str],
    requests_sample: list[MirrorRequest],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = requests_sample[0]
    n = N_REQUESTS * N_POLICIES
    plain_url = fresh_db(True)
    plain = make_engine(plain_url)
    with plain.begin() as conn:  # today's decision log without the chain columns and index
        for table in ("decisions", "outcomes", "requests"):
            conn.execute(text(f"ALTER TABLE {table} DROP COLUMN chain_seq, DROP COLUMN chain_xid"))
    chained = make_engine(fresh_db(True))
    try:
        without = _write_rounds(plain, base, outcomes=False)
        with_chain = _write_rounds(chained, base, outcomes=True)
        anchor = Anchor(
            tmp_path / "anchor.jsonl", load_key(tmp_path / "key"), tmp_path / "w" / "anchor.jsonl"
        )
        sealer = ChainSealer(chained, anchor)
        started = time.perf_counter()
        report = sealer.seal_all()
        seal_s = time.perf_counter() - started
        small = _small_seals(chained, sealer, base)
        started = time.perf_counter()
        checked = verify(
            chained,
            [sealer.anchor.path],
            sealer.anchor.key,
            witnesses=[tmp_path / "w" / "anchor.jsonl"],
        )
        verify_s = time.perf_counter() - started
    finally:
        plain.dispose()
        chained.dispose()
    assert report.rows == ROUNDS * n
    chained_rows = dict(report.chained)
    assert chained_rows == {
        "requests": ROUNDS * N_REQUESTS,
        "decisions": ROUNDS * n,
        "outcomes": ROUNDS * N_REQUESTS,
    }
    all_rows = sum(chained_rows.values())
    assert checked.ok and checked.rows == ROUNDS * n + SMALL_SEALS * N_POLICIES
    verified = sum(rows for rows, _ in checked.chains.values())
    w0, w1 = statistics.median(without), statistics.median(with_chain)
    with capsys.disabled():
        print(
            f"\n[chain] write {n} decisions: {n / w0:,.0f} rows/s without the chain columns, "
            f"{n / w1:,.0f} rows/s with them ({(w1 / w0 - 1) * 100:+.0f}% time, median of "
            f"{ROUNDS}); seal {all_rows} rows ({report.rows} decisions, "
            f"{chained_rows['requests']} requests, {chained_rows['outcomes']} outcomes) in "
            f"{seal_s:.2f} s = {all_rows / seal_s:,.0f} rows/s; a seal of 1 request + "
            f"{N_POLICIES} decisions + 1 outcome after it: median "
            f"{statistics.median(small) * 1000:.1f} ms (max {max(small) * 1000:.1f} ms); "
            f"verify {verified} rows in {verify_s:.2f} s = {verified / verify_s:,.0f} rows/s"
        )
