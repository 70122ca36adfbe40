"""The Parquet export carries each round's logged feasibility bits, with the names to read them.

Requests are logged by the scorer's write path into a real PostgreSQL
database, outcomes joined, the slice exported with `export_parquet`; the
bits read back from the files equal `check_feasibility`'s, decode with the
manifest's signal names, and are null for a request logged before 0010.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds

from service.contract import MirrorRequest, check_feasibility
from service.storage import make_engine
from service.storage.export.parquet import MANIFEST, export_parquet
from service.storage.reads.ope import OpeFilter
from tests.storage.scored_log import log_scored
from tests.storage.storage_helpers import outcome_for


def test_the_slice_holds_each_rounds_bits_and_their_names(
    db_url: str, requests_sample: list[MirrorRequest], tmp_path: Path
) -> None:
    new = requests_sample[:3]
    old = [dataclasses.replace(requests_sample[3], request_id="logged-before-0010")]
    log_scored(db_url, new, outcomes=[outcome_for(r.request_id) for r in new])
    log_scored(db_url, old, with_bits=False, outcomes=[outcome_for(old[0].request_id)])
    engine = make_engine(db_url)
    try:
        summary = export_parquet(engine, OpeFilter(), tmp_path / "slice")
    finally:
        engine.dispose()
    assert summary.rounds == 4

    table = ds.dataset(tmp_path / "slice", format="parquet", partitioning="hive").to_table()
    rows = {r["request_id"]: r for r in table.to_pylist()}
    names = json.loads((tmp_path / "slice" / MANIFEST).read_text())["feasibility_signals"]
    for r in new:
        f = check_feasibility(r.state, r.workload, r.options, r.quota_remaining)
        row = rows[r.request_id]
        assert row["feasibility_version"] == f.version
        assert row["feasibility_bits"] == f.bits.tolist()
        assert row["qos_class"] == r.workload.qos_class
        signals = names[row["feasibility_version"]]
        decoded = [
            [n for i, n in enumerate(signals) if b >> i & 1] for b in row["feasibility_bits"]
        ]
        assert decoded == [[s.value for s in f.failed(i)] for i in range(r.options.n_options)]
        assert np.count_nonzero(row["feasibility_bits"]) > 0
    before = rows["logged-before-0010"]
    assert before["feasibility_bits"] is None and before["feasibility_version"] is None
