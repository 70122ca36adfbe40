"""The loaders read the shared data as SOURCE.md describes it, and invent nothing."""

from __future__ import annotations

import csv
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from service.environment import DATA_ENV_VAR, SharedDataMissing, ThroughputTable, data_dir
from service.environment.data import (
    GAVEL_WORKER_TYPES,
    SCALE_FACTORS,
    load_throughputs,
    load_trace,
    machine_shape,
    philly_surge_factor,
)


def _rows(*parts: str) -> list[dict[str, str]]:
    with data_dir().joinpath(*parts).open() as f:
        return list(csv.DictReader(f))


def test_every_isolated_measurement_is_in_the_table(table: ThroughputTable) -> None:
    worker_to_class = {w: c for c, w in GAVEL_WORKER_TYPES.items()}
    rows = _rows("gavel-throughputs", "isolated_throughputs.csv")
    for r in rows:
        got = table.rate(
            r["job_type"],
            int(r["scale_factor"]),
            worker_to_class[r["worker_type"]],
            consolidated=r["consolidated"] == "1",
        )
        assert got == float(r["throughput_simulation_steps_per_s"])
    # nothing beyond the file: every finite cell is one row
    assert int(np.isfinite(table.isolated).sum()) == len(rows)


def test_single_gpu_pairs_are_in_the_table_and_multi_gpu_pairs_are_not(
    table: ThroughputTable,
) -> None:
    worker_to_class = {w: c for c, w in GAVEL_WORKER_TYPES.items()}
    rows = _rows("gavel-throughputs", "colocated_pair_throughputs.csv")
    singles = [r for r in rows if r["scale_factor"] == r["other_scale_factor"] == "1"]
    for r in singles:
        a, b = table.type_index(r["job_type"]), table.type_index(r["other_job_type"])
        c = table.class_index(worker_to_class[r["worker_type"]])
        assert table.pair[a, b, c] == float(r["throughput_self_steps_per_s"])
    assert int(np.isfinite(table.pair).sum()) == len(singles)
    multi = [float(r["throughput_self_steps_per_s"]) for r in rows if r["scale_factor"] != "1"]
    assert multi and max(multi) == 0.0  # why the simulator never shares multi-GPU jobs


def test_unknown_job_type_and_class_are_refused(table: ThroughputTable) -> None:
    with pytest.raises(KeyError, match="`job_type`"):
        table.type_index("GPT-5 (batch size 1)")
    with pytest.raises(KeyError, match="`hardware`"):
        table.class_index("H100-SXM")


def test_noise_sigma_is_the_median_remeasurement_change(table: ThroughputTable) -> None:
    rows = _rows("gavel-throughputs", "isolated_throughputs.csv")
    pairs = [
        (
            float(r["throughput_simulation_steps_per_s"]),
            float(r["throughput_physical_cluster_steps_per_s"]),
        )
        for r in rows
    ]
    logs = [abs(math.log(b / a)) for a, b in pairs if a > 0 and b > 0]
    changed = sorted(x for x in logs if x > 1e-12)
    assert table.noise_sigma() == pytest.approx(float(np.median(changed)))


def test_traces_drop_exactly_the_unmeasured_rows(table: ThroughputTable) -> None:
    measured = {
        (t, k)
        for t in table.job_types
        for k in SCALE_FACTORS
        if np.nanmax(
            np.nan_to_num(table.isolated[table.type_index(t), SCALE_FACTORS.index(k), :, 1])
        )
        > 0
    }
    for path in sorted(data_dir().joinpath("gavel-philly-derived-traces").glob("*.trace")):
        lines = [line.split("\t") for line in path.read_text().splitlines() if line.strip()]
        kept = [f for f in lines if (f[0], int(f[6])) in measured]
        trace = load_trace(path.stem)
        assert trace.n_rows == len(lines)
        assert trace.dropped == len(lines) - len(kept)
        assert len(trace.job_type) == len(kept)
        assert np.all(np.diff(trace.arrival_s) >= 0)
        assert Counter(trace.job_type) == Counter(f[0] for f in kept)


def test_machine_shape_is_the_most_common_row() -> None:
    rows = _rows("alibaba-gpu-v2020-machine-spec", "pai_machine_spec.csv")
    for gpu_type in ("P100", "V100", "MISC"):
        counts = Counter(
            (int(r["cap_gpu"]), float(r["cap_cpu"]), float(r["cap_mem"]))
            for r in rows
            if r["gpu_type"] == gpu_type
        )
        (gpus, cpu, mem), n = counts.most_common(1)[0]
        shape = machine_shape(gpu_type)
        assert (shape.gpus, shape.cpu_cores, shape.memory_gb, shape.machines) == (gpus, cpu, mem, n)
    with pytest.raises(KeyError, match="`machine`"):
        machine_shape("K80")  # Alibaba has none: scenarios must say which shape they borrow


def test_surge_factor_is_a_busy_day_over_a_typical_day() -> None:
    assert philly_surge_factor() > 1.0
    assert philly_surge_factor(quantile=0.5) == pytest.approx(1.0)


def test_missing_data_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path))
    assert data_dir() == tmp_path
    with pytest.raises(SharedDataMissing, match=DATA_ENV_VAR):
        load_throughputs(str(tmp_path))
