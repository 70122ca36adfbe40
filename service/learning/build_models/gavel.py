"""The Gavel isolated-throughput table, as predictor rows.

Reads ``gavel-throughputs/isolated_throughputs.csv`` from the shared data
folder (never committed): ``$UNDERSTUDY_SHARED_DATA``, defaulting to
``<repo>/../shared/data``. Pure csv + numpy, so tests may import it without
pulling in scikit-learn.

Which measurement: the ``throughput_simulation_steps_per_s`` column, the one
Gavel's EXPERIMENTS.md names as *the* measured throughputs of its workloads.
The physical-cluster column is a re-measurement of 73 entries under other
conditions that disagrees by up to 10x (Recommendation on V100) and would make
the same configuration bimodal; it is kept on the rows for reporting only.

Rows dropped, and why:

- scale factor 1 with ``consolidated = 0``: an exact duplicate of the
  consolidated row (one GPU cannot be spread), so it would double-count;
- throughput 0: Gavel's marker for "cannot run" (ResNet-50 batch 128 on K80
  at scale >= 2, out of memory). That is a feasibility question, answered by
  the contract's memory rule, not a throughput to regress.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from service.contract import KNOWN_HARDWARE, HardwareClass
from service.policies.predictor_features import (
    JobType,
    compute_predictor_features,
    job_columns,
    parse_job_type,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
WORKER_CLASS: dict[str, str] = {"k80": "K80", "p100": "P100", "v100": "V100"}
"""Gavel worker type -> `KNOWN_HARDWARE` class name."""


def shared_data_dir() -> Path:
    """``$UNDERSTUDY_SHARED_DATA`` or ``<repo>/../shared/data``."""
    env = os.environ.get("UNDERSTUDY_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


def isolated_csv_path() -> Path:
    """Path of the Gavel isolated-throughput CSV (may not exist)."""
    return shared_data_dir() / "gavel-throughputs" / "isolated_throughputs.csv"


@dataclass(frozen=True, eq=False)
class GavelTable:
    """Gavel measurements as aligned arrays, one entry per kept row.

    Attributes:
        job_type: Gavel's job type string, e.g. ``"ResNet-50 (batch size 64)"``.
        family: model family of each row.
        hardware: `KNOWN_HARDWARE` class name (``K80`` / ``P100`` / ``V100``).
        scale: GPUs (1, 2, 4, 8).
        consolidated: whether all workers were on one server.
        throughput: steps/s of the whole job (simulation column), > 0.
        throughput_physical: the physical-cluster column, for reporting.
        features: float32, shape ``(n, N_PREDICTOR_FEATURES)``.
        log_shape_factor: log of each row's gang-shape factor (0 for one server)
            when the rows come from `shape_rows.with_shape_rows`, else None.
        per_node, localities: each row's GPUs per server and localities spanned
            (`shape_rows` rows only, else None), for tests that rebuild the row
            from a contract request.
    """

    job_type: NDArray[np.str_]
    family: NDArray[np.str_]
    hardware: NDArray[np.str_]
    scale: NDArray[np.int64]
    consolidated: NDArray[np.bool_]
    throughput: NDArray[np.float64]
    throughput_physical: NDArray[np.float64]
    features: NDArray[np.float32]
    log_shape_factor: NDArray[np.float64] | None = None
    per_node: tuple[tuple[int, ...], ...] | None = None
    localities: tuple[int, ...] | None = None

    def __len__(self) -> int:
        return len(self.throughput)

    @property
    def group(self) -> NDArray[np.str_]:
        """``"<job type>|<scale>"`` per row: the unit held out together."""
        return np.char.add(np.char.add(self.job_type, "|"), self.scale.astype(str))


def gavel_features(
    jobs: list[JobType],
    hardware: list[HardwareClass],
    scale: list[int],
    consolidated: list[bool],
    per_node: list[tuple[int, ...]] | None = None,
    localities: list[int] | None = None,
) -> NDArray[np.float32]:
    """Predictor rows for Gavel configurations, via the serving-time function.

    `per_node` (GPUs on each server) and `localities` give a row its gang
    shape (`shape_rows`); without them a row has the shape the serving
    function assumes for a Gavel row (one server, or one GPU per server).
    """
    shape: tuple[NDArray[np.float64] | None, ...] = (None, None, None, None)
    if per_node is not None:
        shape = (
            np.array([len(p) for p in per_node], dtype=np.float64),
            np.array([min(p) for p in per_node], dtype=np.float64),
            np.array([max(p) for p in per_node], dtype=np.float64),
            np.array(localities or [1] * len(per_node), dtype=np.float64),
        )
    return compute_predictor_features(
        np.stack([job_columns(j) for j in jobs]) if jobs else np.zeros((0, 8)),
        np.array([h.peak_dense_tflops for h in hardware], dtype=np.float64),
        np.array([h.memory_bandwidth_gbps for h in hardware], dtype=np.float64),
        np.array([h.accelerator_memory_gb for h in hardware], dtype=np.float64),
        np.array([h.interconnect_gbps for h in hardware], dtype=np.float64),
        np.array(scale, dtype=np.float64),
        np.array(consolidated, dtype=np.float64),
        *shape,
    )


def load_gavel(path: Path | None = None) -> GavelTable:
    """Read, filter (see module docstring) and featurise the isolated throughputs."""
    rows = []
    with (path or isolated_csv_path()).open(newline="") as fh:
        for row in csv.DictReader(fh):
            scale, consolidated = int(row["scale_factor"]), row["consolidated"] == "1"
            value = float(row["throughput_simulation_steps_per_s"])
            if value <= 0.0 or (scale == 1 and not consolidated):
                continue
            rows.append((row, scale, consolidated, value))
    jobs = [parse_job_type(r["job_type"]) for r, *_ in rows]
    hardware = [KNOWN_HARDWARE[WORKER_CLASS[r["worker_type"]]] for r, *_ in rows]
    return GavelTable(
        job_type=np.array([r["job_type"] for r, *_ in rows]),
        family=np.array([j.family for j in jobs]),
        hardware=np.array([h.name for h in hardware]),
        scale=np.array([s for _, s, _, _ in rows], dtype=np.int64),
        consolidated=np.array([c for _, _, c, _ in rows], dtype=bool),
        throughput=np.array([v for *_, v in rows], dtype=np.float64),
        throughput_physical=np.array(
            [float(r["throughput_physical_cluster_steps_per_s"]) for r, *_ in rows]
        ),
        features=gavel_features(
            jobs, hardware, [s for _, s, _, _ in rows], [c for _, _, c, _ in rows]
        ),
    )


def fastest_single_gpu_class(table: GavelTable) -> dict[str, str]:
    """Per job type, the hardware class with the highest measured 1-GPU throughput."""
    best: dict[str, tuple[float, str]] = {}
    for jt, hw, scale, value in zip(
        table.job_type, table.hardware, table.scale, table.throughput, strict=True
    ):
        if scale == 1 and value > best.get(str(jt), (-1.0, ""))[0]:
            best[str(jt)] = (float(value), str(hw))
    return {jt: hw for jt, (_, hw) in best.items()}
