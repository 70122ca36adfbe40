"""How fast decisions reach PostgreSQL through COPY + INSERT ... ON CONFLICT (printed)."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from sqlalchemy import Engine

from service.contract import MirrorRequest
from service.storage import DecisionLogWriter, count_decisions, ensure_partitions
from service.storage.log.partitions import day_of
from tests.storage.storage_helpers import decisions_of, request_batch

N_REQUESTS = 500
N_POLICIES = 12


def test_decision_copy_throughput(
    engine: Engine, requests_sample: list[MirrorRequest], capsys: pytest.CaptureFixture[str]
) -> None:
    base = requests_sample[0]
    requests = [
        dataclasses.replace(base, request_id=f"tp-{i}", request_time=base.request_time + i)
        for i in range(N_REQUESTS)
    ]
    ensure_partitions(engine, day_of(base.request_time), day_of(requests[-1].request_time))
    writer = DecisionLogWriter(engine)
    writer.write(request_batch(requests))
    decisions = [
        row for p in range(N_POLICIES) for row in decisions_of(requests, f"policy-{p}", seed=p)
    ]
    n_options = base.options.n_options

    started = time.perf_counter()
    result = writer.write(dataclasses.replace(request_batch([]), decisions=decisions))
    elapsed = time.perf_counter() - started
    replay_started = time.perf_counter()
    replay = writer.write(dataclasses.replace(request_batch([]), decisions=decisions))
    replay_elapsed = time.perf_counter() - replay_started

    assert result.decisions.inserted == len(decisions)
    assert replay.decisions.duplicates == len(decisions)
    assert count_decisions(engine) == len(decisions)
    blob = np.float32(0).nbytes * n_options + np.float64(0).nbytes * n_options
    with capsys.disabled():
        print(
            f"\n[storage] decisions: {len(decisions)} rows ({n_options} options, "
            f"{blob} B of blobs each) in {elapsed:.3f} s = {len(decisions) / elapsed:,.0f} rows/s; "
            f"replay (all duplicates) {len(decisions) / replay_elapsed:,.0f} rows/s"
        )
