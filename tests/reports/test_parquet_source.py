"""OPE over Parquet slices written from in-memory logs with a known truth, and bad slices.

The slice is written with the exporter's own writer (``write_parquet``) from
the synthetic bandit log of ``tests.reports.synthetic``: three options and
DEFER, production uniform, ``best@1`` worth 0.9 and ``mixed@1`` worth 0.35.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service.contract import InvalidInput
from service.ope import Estimate, Estimator
from service.reports.ope.ope_run import run_ope
from service.reports.ope.parquet_ope import stream_ope
from service.reports.ope.parquet_source import open_slice, read_parquet_log
from service.reports.ope.summary import report_json
from service.storage.export.parquet import SLICE_SCHEMA, write_parquet
from service.storage.reads.ope import OpeFilter, OpeLog
from tests.reports.synthetic import bandit_log
from tests.reports.test_export_live import assert_same

DAY_US = 86_400_000_000
START_S = 1_795_000_000
HOUR_S = 3600


def _batches(log: OpeLog, chunk: int) -> Iterator[pa.RecordBatch]:
    """The log's rounds as slice rows, one per (round, policy), `chunk` rounds a batch."""
    for lo in range(0, log.n, chunk):
        rounds = range(lo, min(lo + chunk, log.n))
        rows: list[dict[str, object]] = []
        for i in rounds:
            received = round(log.received_at[i] * 1_000_000)
            for (name, version), p in log.policies.items():
                probs = p.probabilities[i]
                rows.append(
                    {
                        "seq": i,
                        "request_id": str(log.request_id[i]),
                        "request_time": received,
                        "received_at": received,
                        "workload_id": f"w{i}",
                        "workload_kind": str(log.workload_kind[i]),
                        "tenant": str(log.tenant[i]),
                        "model_family": str(log.model_family[i]),
                        "n_options": int(log.n_options[i]),
                        "production_option": int(log.production_option[i]),
                        "production_propensity": float(log.production_propensity[i]),
                        "production_source": "mirror",
                        "observed_at": received,
                        "queue_delay_s": float(log.queue_delay_s[i]),
                        "throughput": float(log.throughput[i]),
                        "completion_time_s": float(log.completion_time_s[i]),
                        "slo_met": bool(log.slo_met[i]),
                        "failure": str(log.failure[i]),
                        "policy_version": version,
                        "status": p.status[i],
                        "chosen_option": 0,
                        "probabilities": None if probs is None else probs.tolist(),
                        "defer_probability": float(p.defer_probability[i]),
                        "raw_favourite_infeasible": bool(p.raw_favourite_infeasible[i]),
                        "agrees_with_production": None,
                        "feature_version": "f",
                        "feature_hash": "h",
                        "traffic": "simulated",
                        "scenario": "synthetic",
                        "date": str(np.datetime64(received // DAY_US, "D")),
                        "policy": name,
                    }
                )
        yield pa.RecordBatch.from_pylist(rows, schema=SLICE_SCHEMA)


@pytest.fixture(scope="module")
def synthetic_slice(tmp_path_factory: pytest.TempPathFactory) -> tuple[OpeLog, Path]:
    synthetic = bandit_log(3000, seed=11)
    hours = START_S + HOUR_S * np.arange(synthetic.n, dtype=np.float64)  # several dates
    log = replace(synthetic, received_at=hours)
    root = tmp_path_factory.mktemp("synthetic") / "slice"
    summary = write_parquet(_batches(log, 250), root)
    assert summary.rounds == log.n and len(summary.dates) > 100
    return log, root


def test_streamed_ope_equals_ope_in_memory_and_covers_the_truth(
    synthetic_slice: tuple[OpeLog, Path],
) -> None:
    log, root = synthetic_slice
    expected = run_ope(log)
    assert_same(report_json(expected), report_json(stream_ope(root, batch_rows=997)))
    assert_same(report_json(expected), report_json(run_ope(read_parquet_log(root))))
    truth = {"best": 0.9, "mixed": 0.35}
    for p in stream_ope(root, memory_limit="64MB").policies:
        dr = p.results[Estimator.DR]
        assert isinstance(dr, Estimate)
        assert dr.interval.lower < truth[p.policy[0]] < dr.interval.upper


def test_a_filter_on_the_slice_equals_the_filter_in_memory(
    synthetic_slice: tuple[OpeLog, Path],
) -> None:
    log, root = synthetic_slice
    where = OpeFilter(
        since=START_S + 500 * HOUR_S, until=START_S + 2500 * HOUR_S, policies=("best",)
    )
    kept = (np.arange(log.n) >= 500) & (np.arange(log.n) < 2500)
    sub = read_parquet_log(root, where)
    assert sub.n == int(kept.sum()) and list(sub.policies) == [("best", "1")]
    assert (sub.request_id == log.request_id[kept]).all()
    streamed = report_json(stream_ope(root, where, batch_rows=333))
    assert_same(report_json(run_ope(sub)), streamed)
    assert streamed["rounds"] == 2000
    assert math.isclose(streamed["production"]["value"], float(log.slo_met[kept].mean()))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: None, "must be a slice folder"),
        (lambda root: root.mkdir(), "must contain Parquet files"),
        (
            lambda root: (
                root.mkdir(),
                pq.write_table(
                    pa.table({"seq": [0]}).replace_schema_metadata(
                        {b"understudy.schema": b"understudy-slice/0"}
                    ),
                    root / "part-0.parquet",
                ),
            ),
            "must have schema understudy-slice/1, got understudy-slice/0",
        ),
        (
            lambda root: (root.mkdir(), pq.write_table(pa.table({"x": [1]}), root / "a.parquet")),
            "got none",
        ),
    ],
)
def test_a_folder_that_is_not_a_slice_is_refused_naming_parquet(
    tmp_path: Path, make: object, message: str
) -> None:
    root = tmp_path / "slice"
    make(root)  # type: ignore[operator]
    with pytest.raises(InvalidInput) as info:
        open_slice(root)
    assert info.value.field == "parquet"
    assert message in str(info.value)
