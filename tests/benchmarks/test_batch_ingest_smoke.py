"""The batch ingest benchmark: its messages are valid batches, and a quick run reports its rows.

No figure is asserted (speed belongs to the benchmarks, not the tests). The
messages are checked as ingest reads them (codec + batch validation): every
request valid, ids unique per message and run, the snapshots of each shape.
A quick run of a subset (batch stream at 64, the worst case, the single
stream: real ingest-only service and bare servers) must write every row of
every point with finite figures, the issue's targets on the rows of record,
and figures that count what the service counted.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.batch_workload import BatchTemplate, batch_envelope, shaped_requests
from service.contract.batch.validation import validate_batch
from service.contract.validation import RequestLimits
from service.wire.batch_codec import batch_from_pb
from service.wire.understudy.v1 import batch_pb2, shadow_pb2

ROOT = Path(__file__).resolve().parents[2]
LIMITS = RequestLimits()


@pytest.mark.parametrize(("shape", "n", "snapshots"), [("record", 64, 8), ("worst", 16, 16)])
def test_templates_are_valid_batches_with_unique_ids(shape: str, n: int, snapshots: int) -> None:
    template = BatchTemplate.of(shaped_requests(n, shape))
    assert (template.n, template.snapshots) == (n, snapshots)
    seen: set[str] = set()
    for tag, message in (("g1x1", 0), ("g1x1", 1), ("g2x1", 0), ("g10x99999", 123456)):
        body = template.body(tag, message)
        assert len(body) == template.size
        batch = batch_from_pb(batch_pb2.MirrorBatch.FromString(body), LIMITS)
        verdict = validate_batch(batch, LIMITS)
        assert verdict.refusals == () and bool(verdict.ok.all())
        assert batch.states.n_states == snapshots
        ids = batch.request_id.values()
        assert all(i.startswith(f"{tag}-") for i in ids)
        assert not seen & set(ids) and len(set(ids)) == n
        seen |= set(ids)
    envelope = shadow_pb2.MirrorBatchStreamRequest.FromString(batch_envelope(7, body))
    assert envelope.sequence == 7
    assert envelope.batch.SerializeToString() == body


def test_the_shape_of_record_shares_one_snapshot_per_eight_requests() -> None:
    reqs = shaped_requests(64)
    assert len({id(r.state) for r in reqs}) == 8
    assert all(reqs[i].state is reqs[8 * (i // 8)].state for i in range(64))
    assert all(len(r.state.node_ids) == 128 for r in reqs)
    assert max(len(r.options.node_offsets) - 1 for r in reqs) <= 50


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench")
    env = {
        **os.environ,
        "UNDERSTUDY_BENCH_OUT": str(out),
        "UNDERSTUDY_BENCH_BATCH_TRANSPORTS": "mstream,worst,stream",
        # one batch size: every row kind of a batched point (the x1 rows are the same
        # kinds at another size), and 64 carries the targets of record
        "UNDERSTUDY_BENCH_BATCH_SIZES": "64",
    }
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "batch_ingest", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    doc: dict[str, Any] = json.loads((out / "batch_ingest.json").read_text())
    doc["summary"] = (out / "summary.md").read_text()
    return doc


ROW_ENDINGS = (
    ": ingest ceiling (closed loop, requests acked and journaled/s)",
    ": ingest CPU per request (at the ceiling)",
    ": ack p50 at 80% of the ceiling (per message)",
    ": ack p99 at 80% of the ceiling (per message)",
    ": journal append p50 (server side, one append per message)",
    ": journal append p99 (server side, one append per message)",
)


@pytest.mark.slow  # a real quick run: ~1 minute on the 2-core machine
def test_quick_run_reports_every_row_finite(quick_run: dict[str, Any]) -> None:
    assert quick_run["benchmark"] == "batch_ingest" and quick_run["quick"] is True
    rows = {r["metric"]: r for r in quick_run["rows"]}
    labels = [
        "gRPC batch stream x64 (8 snapshots)",
        "gRPC batch stream x64 (64 snapshots, every request its own snapshot)",
        "gRPC single-request stream",
    ]
    for label in labels:
        for ending in ROW_ENDINGS:
            row = rows[label + ending]
            for key in ("figure", "raw_limit", "ratio"):
                assert all(math.isfinite(v) and v > 0 for v in row[key]["runs"]), (row, key)
            assert row["metric"] in quick_run["summary"]
    # the targets, stated on the rows of record and on the single stream
    record = "gRPC batch stream x64 (8 snapshots)"
    assert rows[f"{record}: ingest ceiling vs the target"]["target"]["threshold"] == 50_000
    assert rows[record + ROW_ENDINGS[0]]["target"]["threshold"] == 0.5
    assert rows[record + ROW_ENDINGS[3]]["target"]["threshold"] == 1.5
    assert rows[record + ROW_ENDINGS[5]]["target"]["threshold"] == 200
    single = rows["gRPC single-request stream: ingest ceiling vs the target"]["target"]
    assert single["threshold"] == 3300
    for row in rows.values():
        if row["target"] is not None:
            verdict = "pass" if row["target"]["pass"] else "**miss**"
            assert f"{row['target']['text']}: {verdict}" in quick_run["summary"]


@pytest.mark.slow
def test_quick_run_counts_what_the_service_counted(quick_run: dict[str, Any]) -> None:
    for point in quick_run["details"]["points"]:
        runs = [point["warm_up"], *point["closed"], point["latency"]]
        for r in runs:
            assert r["shed"] == r["rejected"] == r["errors"] == r["unacked"] == 0, (point, r)
            assert r["accepted"] == r["sent"] > 0
        # what the generator saw acked is what ingest counted accepted, request by request
        assert point["ingest_totals"] == {"accepted": sum(r["accepted"] for r in runs)}
        # a batch is one journal append
        messages = sum(r["messages" if point["transport"] != "stream" else "sent"] for r in runs)
        assert point["journal_appends"] == messages
