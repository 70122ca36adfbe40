"""Decision-log rows/s: `DecisionLogWriter` vs raw binary COPY into twin tables.

Both write the same rows (requests, cluster snapshots, decisions of 3 ONNX
policies + 3 baselines over 128-request scorer batches) into the embedded
PostgreSQL. The raw limit COPYs them in binary straight into tables created
``LIKE <table> INCLUDING ALL`` (same columns, defaults, constraints and
indexes; plain, not partitioned), one transaction per batch. Understudy's
figure is the writer's whole transaction: COPY into staging, ``INSERT ...
ON CONFLICT DO NOTHING`` into the partitioned tables, the outcome join
probes. A second row adds the sink's row conversion (payload compression,
snapshot hashing), which the scorer thread also pays. Runs are interleaved.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb
from sqlalchemy import Engine

from benchmarks import workload
from benchmarks.harness import BenchResult, Row, Target
from benchmarks.policyset import policy_set
from service.contract import DEFAULT_FEATURES
from service.pipeline.scorer import LoggedRequest, ScoredBatch
from service.pipeline.scoring import score_requests
from service.policies.registry import Registry
from service.server.decision_log import DecisionLogSink
from service.storage import make_engine, open_database, upgrade
from service.storage.embedded import stop_embedded
from service.storage.log.rows import LogBatch, WriteResult
from service.storage.log.staging import DECISIONS, REQUESTS, SNAPSHOTS, Stage
from service.storage.log.writer import DecisionLogWriter
from service.wire.convert import mirror_request_from_pb
from service.wire.understudy.v1 import contract_pb2

BATCH = 128
_TIME_COLS = {"request_time", "received_at", "scored_at"}
_REAL_TYPES = {
    "request_time": "timestamptz",
    "received_at": "timestamptz",
    "scored_at": "timestamptz",
    "predicted": "jsonb",
}
TWINS = (("requests", REQUESTS), ("cluster_snapshots", SNAPSHOTS), ("decisions", DECISIONS))
IDENTITY_COLS = ("request_id", "request_time", "content_sha256", "journal_seq")
"""A staged request's identity goes to `request_identities` (migration 0011), not to
`requests`: the raw limit COPYs it into that table's twin too, as the writer inserts it."""


def _copies(stage_table: str, stage: Stage) -> list[tuple[str, list[int]]]:
    """(twin table, indexes of the staged columns it takes) for one staged table."""
    names = [c for c, _ in stage.columns]
    if stage_table != "requests":
        return [(stage_table, list(range(len(names))))]
    held = [i for i, c in enumerate(names) if c != "content_sha256"]
    return [
        ("requests", held),
        ("request_identities", [names.index(c) for c in IDENTITY_COLS]),
    ]


class _Capture:
    """A writer stand-in that keeps the `LogBatch` the sink built (to replay it timed)."""

    def __init__(self) -> None:
        self.batches: list[LogBatch] = []

    def write(self, batch: LogBatch) -> Any:
        self.batches.append(batch)
        return WriteResult()


@lru_cache(maxsize=1)
def _registry() -> Registry:
    return policy_set(3, 3)


def scored_batches(n_batches: int, tag: str, seed: int) -> list[ScoredBatch]:
    """Scorer batches of `BATCH` fresh requests, scored by 3 ONNX policies + 3 baselines."""
    policies = list(_registry().policies.values())
    out = []
    reqs = workload.requests(BATCH * n_batches, seed=seed)  # own clusters
    templates = workload.protobuf_templates(reqs)
    for b in range(n_batches):
        chunk = []
        for i in range(b * BATCH, (b + 1) * BATCH):
            payload = templates[i].body(tag, i)
            req = mirror_request_from_pb(contract_pb2.MirrorRequest.FromString(payload))
            chunk.append(LoggedRequest(i, req, payload, time.time()))
        _, decisions, _ = score_requests([r.request for r in chunk], policies, DEFAULT_FEATURES)
        out.append(
            ScoredBatch(
                chunk,
                [],
                decisions,
                policies,
                DEFAULT_FEATURES.version,
                DEFAULT_FEATURES.definition_hash,
                chunk[-1].seq,
            )
        )
    return out


def _raw_tuple(stage: Stage, row: Any) -> tuple[object, ...]:
    assert stage.to_tuple is not None
    values = list(stage.to_tuple(row))
    for i, (col, _) in enumerate(stage.columns):
        if col in _TIME_COLS and values[i] is not None:
            values[i] = datetime.fromtimestamp(float(values[i]), UTC)  # type: ignore[arg-type]
        elif col == "predicted" and values[i] is not None:
            values[i] = Jsonb(row.predicted)
    return tuple(values)


def _raw_copy(engine: Engine, prepared: list[dict[str, list[tuple[object, ...]]]]) -> int:
    """Binary COPY of every prepared batch into the twin tables, one transaction each."""
    rows = 0
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        for batch in prepared:
            with raw.transaction(), raw.cursor() as cur:
                for stage_table, stage in TWINS:
                    for table, take in _copies(stage_table, stage):
                        cols = [stage.columns[i][0] for i in take]
                        types = [
                            _REAL_TYPES.get(c, stage.columns[i][1])
                            for i, c in zip(take, cols, strict=True)
                        ]
                        statement = (
                            f"COPY bench_raw_{table} ({', '.join(cols)}) FROM STDIN (FORMAT BINARY)"
                        )
                        with cur.copy(statement) as copy:  # type: ignore[arg-type]
                            copy.set_types(types)
                            for values in batch[stage_table]:
                                copy.write_row([values[i] for i in take])
                    rows += len(batch[stage_table])
    return rows


def _log_rows(batch: LogBatch) -> int:
    return len(batch.requests) + len(batch.snapshots) + len(batch.decisions)


def run(quick: bool = False) -> BenchResult:
    """Interleaved runs of the writer, the sink and raw COPY; return the rows."""
    runs = 2 if quick else 5
    per_run = 2 if quick else 6
    home = Path(tempfile.mkdtemp(prefix="us-bench-log-"))
    try:
        url, _server = open_database(None, home)
        upgrade(url)
        engine = make_engine(url)
        with engine.begin() as conn:
            for table in [t for st, s in TWINS for t, _ in _copies(st, s)]:
                conn.exec_driver_sql(f"CREATE TABLE bench_raw_{table} (LIKE {table} INCLUDING ALL)")
        writer = DecisionLogWriter(engine)
        sink = DecisionLogSink(writer, _registry().manifests)
        warm = scored_batches(1, "w", 1000)
        sink.write(warm[0])  # registers the policies and creates today's partitions
        writer_rates, sink_rates, raw_rates = [], [], []
        for r in range(runs):
            scored = scored_batches(per_run, f"r{r}", 2000 + r)
            capture = _Capture()
            capturing = DecisionLogSink(capture, _registry().manifests)  # type: ignore[arg-type]
            capturing._registered = set(sink._registered)
            for b in scored:
                capturing.write(b)
            batches = capture.batches
            n = sum(_log_rows(b) for b in batches)
            prepared = [
                {t: [_raw_tuple(s, row) for row in getattr(b, _attr(t))] for t, s in TWINS}
                for b in batches
            ]
            start = time.perf_counter()
            for b in batches:
                writer.write(b)
            writer_rates.append(n / (time.perf_counter() - start))
            start = time.perf_counter()
            _raw_copy(engine, prepared)
            raw_rates.append(n / (time.perf_counter() - start))
            again = scored_batches(per_run, f"s{r}", 3000 + r)
            start = time.perf_counter()
            for b in again:
                sink.write(b)
            sink_rates.append(n / (time.perf_counter() - start))
        engine.dispose()
    finally:
        stop_embedded(home / "postgres")
        shutil.rmtree(home, ignore_errors=True)
    target = Target("log writing >= 60% of raw COPY rows/s", 0.60)
    rows = [
        Row.paired(
            "decision-log writer (requests + snapshots + decisions)",
            "rows/s",
            writer_rates,
            raw_rates,
            "binary COPY into LIKE-twin tables",
            target,
        ),
        Row.paired(
            "decision-log sink incl. row conversion",
            "rows/s",
            sink_rates,
            raw_rates,
            "binary COPY into LIKE-twin tables",
            target,
        ),
    ]
    return BenchResult(
        "decision_log",
        rows,
        {
            "batch_requests": BATCH,
            "batches_per_run": per_run,
            "policies": 6,
            "rows_per_request": n / (BATCH * per_run),
        },
    )


def _attr(table: str) -> str:
    return {"requests": "requests", "cluster_snapshots": "snapshots", "decisions": "decisions"}[
        table
    ]
