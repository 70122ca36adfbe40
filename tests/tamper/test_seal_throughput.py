"""How fast decisions are sealed and verified, and what the chain columns cost writes (printed).

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
from sqlalchemy import Engine

from service.contract import MirrorRequest
from service.storage import DecisionLogWriter, downgrade, ensure_partitions, make_engine
from service.storage.chain_anchor import Anchor, load_key
from service.storage.chain_seal import ChainSealer
from service.storage.chain_verify import verify
from service.storage.partitions import day_of
from tests.storage.storage_helpers import decisions_of, request_batch

N_REQUESTS = 500
N_POLICIES = 12
ROUNDS = 3

pytestmark = pytest.mark.slow


def _write_rounds(engine: Engine, base: MirrorRequest) -> list[float]:
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
    downgrade(plain_url, "0004")  # the decision log without the chain columns and index
    plain = make_engine(plain_url)
    chained = make_engine(fresh_db(True))
    try:
        without = _write_rounds(plain, base)
        with_chain = _write_rounds(chained, base)
        sealer = ChainSealer(chained, Anchor(tmp_path / "anchor.jsonl", load_key(tmp_path / "key")))
        started = time.perf_counter()
        report = sealer.seal_all()
        seal_s = time.perf_counter() - started
        started = time.perf_counter()
        checked = verify(chained, [sealer.anchor.path], sealer.anchor.key)
        verify_s = time.perf_counter() - started
    finally:
        plain.dispose()
        chained.dispose()
    assert report.rows == ROUNDS * n
    assert checked.ok and checked.rows == ROUNDS * n
    w0, w1 = statistics.median(without), statistics.median(with_chain)
    with capsys.disabled():
        print(
            f"\n[chain] write {n} decisions: {n / w0:,.0f} rows/s without the chain columns, "
            f"{n / w1:,.0f} rows/s with them ({(w1 / w0 - 1) * 100:+.0f}% time, median of "
            f"{ROUNDS}); seal {report.rows} rows in {seal_s:.2f} s = "
            f"{report.rows / seal_s:,.0f} rows/s; verify {checked.rows / verify_s:,.0f} rows/s"
        )
