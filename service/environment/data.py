"""The real measurements the simulator rests on, read from the shared data folder.

Nothing here is invented: every number comes from a file under the shared data
folder (see its README and each folder's SOURCE.md). Where the data has no
entry, the loaders say so (NaN, or a dropped row that is counted) instead of
filling it in.

- `ThroughputTable`: Gavel's measured steps/s per job type, GPU count, class
  (K80 / P100 / V100) and consolidated-vs-spread, and the co-located
  single-GPU pair measurements (``gavel-throughputs``).
- `load_trace`: one Philly-derived Gavel trace (``gavel-philly-derived-traces``).
- `philly_surge_factor`: how much busier a busy day is than a typical one in
  the real Philly trace (``philly-trace-pollux``).
- `machine_shape`: GPUs, CPU cores and memory of an Alibaba PAI machine type
  (``alibaba-gpu-v2020-machine-spec``).

The folder is ``$UNDERSTUDY_SHARED_DATA`` if set, else ``../shared/data``
relative to the repository root.
"""

from __future__ import annotations

import csv
import math
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

import numpy as np
from numpy.typing import NDArray

DATA_ENV_VAR = "UNDERSTUDY_SHARED_DATA"

GAVEL_WORKER_TYPES: Mapping[str, str] = MappingProxyType(
    {"K80": "k80", "P100": "p100", "V100": "v100"}
)
"""Contract hardware-class name -> Gavel worker type. Only these classes were measured."""

SCALE_FACTORS: tuple[int, ...] = (1, 2, 4, 8)
"""GPU counts Gavel profiled; trace rows asking for others have no measurement."""


class SharedDataMissing(FileNotFoundError):
    """Raised when a shared data file the simulator needs is not where it should be."""


def data_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The shared data folder: `override`, else ``$UNDERSTUDY_SHARED_DATA``, else
    ``../shared/data`` next to the repository root."""
    if override is not None:
        return Path(override)
    env = os.environ.get(DATA_ENV_VAR)
    if env:
        return Path(env)
    repo_root = Path(__file__).resolve().parents[2]
    return repo_root.parent / "shared" / "data"


def _file(root: Path, *parts: str) -> Path:
    path = root.joinpath(*parts)
    if not path.is_file():
        raise SharedDataMissing(
            f"`{path}` is missing: set {DATA_ENV_VAR} to the shared data folder "
            "(see shared/data/README.md)"
        )
    return path


@dataclass(frozen=True, eq=False)
class ThroughputTable:
    """Gavel's measured training throughput, steps per second for the whole job.

    Attributes:
        job_types: Gavel job types, sorted; index = type id.
        classes: contract class names measured, ``("K80", "P100", "V100")``.
        isolated: float64, shape ``(n_types, len(SCALE_FACTORS), n_classes, 2)``;
            ``[..., 1]`` consolidated (one server), ``[..., 0]`` spread across
            servers. NaN = not measured; 0 = measured as unable to run.
        physical: same shape, the physical-cluster re-measurement.
        pair: float64, shape ``(n_types, n_types, n_classes)``: throughput of the
            row type when it shares one GPU with the column type (single-GPU
            jobs only; Gavel measured no multi-GPU pair). 0 = cannot share.
    """

    job_types: tuple[str, ...]
    classes: tuple[str, ...]
    isolated: NDArray[np.float64]
    physical: NDArray[np.float64]
    pair: NDArray[np.float64]

    def type_index(self, job_type: str) -> int:
        """Index of `job_type`; raises KeyError naming it when Gavel did not profile it."""
        try:
            return self.job_types.index(job_type)
        except ValueError:
            raise KeyError(f"`job_type` {job_type!r} is not a Gavel job type") from None

    def class_index(self, hardware: str) -> int:
        """Index of contract class `hardware`; KeyError when it was never measured."""
        try:
            return self.classes.index(hardware)
        except ValueError:
            raise KeyError(f"`hardware` {hardware!r} has no Gavel measurement") from None

    def rate(self, job_type: str, gpus: int, hardware: str, consolidated: bool = True) -> float:
        """Measured steps/s (NaN when not measured)."""
        sf = SCALE_FACTORS.index(gpus)
        cls = self.class_index(hardware)
        return float(self.isolated[self.type_index(job_type), sf, cls, int(consolidated)])

    def noise_sigma(self) -> float:
        """Run-to-run spread of a throughput, from the two Gavel measurement files.

        The median of ``|log(physical / simulation)|`` over the isolated entries
        the two files disagree on: the typical size of a re-measurement's
        change. Used as the default log-sd of each job's speed multiplier.
        """
        a, b = self.isolated.reshape(-1), self.physical.reshape(-1)
        ok = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
        log_ratio = np.abs(np.log(b[ok] / a[ok]))
        return float(np.median(log_ratio[log_ratio > 1e-12]))

    def mean_pair_ratio(self) -> NDArray[np.float64]:
        """Mean over partner types of pair / isolated rate, shape ``(n_types, n_classes)``.

        What a policy that knows the measurements, but not who it would share
        with, can expect from sharing a GPU. Pairs measured as unable to run count as 0.
        """
        alone = self.isolated[:, 0, :, 1]
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = self.pair / alone[:, None, :]
        ratio = np.where(np.isfinite(ratio), ratio, np.nan)
        out: NDArray[np.float64] = np.nanmean(ratio, axis=1)
        return out


@lru_cache(maxsize=4)
def load_throughputs(root: str | None = None) -> ThroughputTable:
    """Read ``gavel-throughputs/*.csv`` (the flattened JSON; see its SOURCE.md)."""
    base = data_dir(root)
    with _file(base, "gavel-throughputs", "isolated_throughputs.csv").open() as f:
        iso_rows = list(csv.DictReader(f))
    with _file(base, "gavel-throughputs", "colocated_pair_throughputs.csv").open() as f:
        pair_rows = list(csv.DictReader(f))
    types = tuple(sorted({r["job_type"] for r in iso_rows}))
    classes = tuple(GAVEL_WORKER_TYPES)
    worker_to_class = {w: c for c, w in GAVEL_WORKER_TYPES.items()}
    shape = (len(types), len(SCALE_FACTORS), len(classes), 2)
    isolated = np.full(shape, np.nan)
    physical = np.full(shape, np.nan)
    for r in iso_rows:
        key = (
            types.index(r["job_type"]),
            SCALE_FACTORS.index(int(r["scale_factor"])),
            classes.index(worker_to_class[r["worker_type"]]),
            int(r["consolidated"]),
        )
        isolated[key] = float(r["throughput_simulation_steps_per_s"])
        physical[key] = float(r["throughput_physical_cluster_steps_per_s"])
    pair = np.full((len(types), len(types), len(classes)), np.nan)
    for r in pair_rows:
        if r["scale_factor"] != "1" or r["other_scale_factor"] != "1":
            continue  # multi-GPU pairs are all 0.0 in the data: never shared
        key2 = (
            types.index(r["job_type"]),
            types.index(r["other_job_type"]),
            classes.index(worker_to_class[r["worker_type"]]),
        )
        pair[key2] = float(r["throughput_self_steps_per_s"])
    for arr in (isolated, physical, pair):
        arr.flags.writeable = False
    return ThroughputTable(types, classes, isolated, physical, pair)


@dataclass(frozen=True, eq=False)
class Trace:
    """One Gavel Philly-derived trace, sorted by arrival; arrays have shape ``(n_jobs,)``.

    Attributes:
        vc: Philly virtual-cluster hash (the file name).
        job_type: Gavel job type per job.
        total_steps: iterations the job must run.
        arrival_s: seconds since the trace's first job.
        gpus: GPUs requested (scale factor).
        dropped: rows removed because Gavel never measured their (job type,
            GPU count): multi-GPU Recommendation / A3C / CycleGAN and more than
            8 GPUs (SOURCE.md "Caveat"); they are dropped, never mapped.
        n_rows: rows in the file.
    """

    vc: str
    job_type: tuple[str, ...]
    total_steps: NDArray[np.float64]
    arrival_s: NDArray[np.float64]
    gpus: NDArray[np.int64]
    dropped: int
    n_rows: int


@lru_cache(maxsize=16)
def load_trace(vc: str, root: str | None = None) -> Trace:
    """Read ``gavel-philly-derived-traces/<vc>.trace`` and drop unmeasured rows."""
    table = load_throughputs(root)
    path = _file(data_dir(root), "gavel-philly-derived-traces", f"{vc}.trace")
    types: list[str] = []
    steps: list[float] = []
    arrivals: list[float] = []
    gpus: list[int] = []
    n_rows = 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        n_rows += 1
        fields = line.split("\t")
        job_type, sf = fields[0], int(fields[6])
        if sf not in SCALE_FACTORS or job_type not in table.job_types:
            continue
        rates = table.isolated[table.type_index(job_type), SCALE_FACTORS.index(sf), :, 1]
        if not np.any(np.isfinite(rates) & (rates > 0)):
            continue
        types.append(job_type)
        steps.append(float(fields[4]))
        arrivals.append(float(fields[5]))
        gpus.append(sf)
    order = np.argsort(np.asarray(arrivals), kind="stable")
    return Trace(
        vc=vc,
        job_type=tuple(types[i] for i in order),
        total_steps=np.asarray(steps)[order],
        arrival_s=np.asarray(arrivals)[order],
        gpus=np.asarray(gpus, dtype=np.int64)[order],
        dropped=n_rows - len(types),
        n_rows=n_rows,
    )


@lru_cache(maxsize=4)
def philly_surge_factor(
    quantile: float = 0.95, min_jobs: int = 300, root: str | None = None
) -> float:
    """How much busier a busy day is than a typical day in the real Philly trace.

    For each virtual cluster with at least `min_jobs` jobs in ``philly.csv``:
    the `quantile` of its daily arrival counts over its median daily count
    (days with arrivals only). Returns the median of that ratio over clusters.
    """
    by_vc: dict[str, list[float]] = {}
    with _file(data_dir(root), "philly-trace-pollux", "philly.csv").open() as f:
        for row in csv.DictReader(f):
            stamp = datetime.fromisoformat(row["timestamp"]).timestamp()
            by_vc.setdefault(row["cluster"], []).append(stamp)
    ratios = []
    for stamps in by_vc.values():
        if len(stamps) < min_jobs:
            continue
        t = np.sort(np.asarray(stamps))
        days = np.bincount(((t - t[0]) // 86400).astype(np.int64))
        days = days[days > 0]
        ratios.append(float(np.quantile(days, quantile) / np.median(days)))
    if not ratios:
        raise ValueError(f"no Philly cluster has >= {min_jobs} jobs")
    return float(np.median(ratios))


@dataclass(frozen=True, slots=True)
class MachineShape:
    """One Alibaba PAI machine type: the most common (GPUs, cores, GB) row of a `gpu_type`."""

    gpu_type: str
    gpus: int
    cpu_cores: float
    memory_gb: float
    machines: int


@lru_cache(maxsize=16)
def machine_shape(gpu_type: str, root: str | None = None) -> MachineShape:
    """The most common shape of Alibaba machines of `gpu_type` (``pai_machine_spec.csv``)."""
    path = _file(data_dir(root), "alibaba-gpu-v2020-machine-spec", "pai_machine_spec.csv")
    with path.open() as f:
        shapes = Counter(
            (int(r["cap_gpu"]), float(r["cap_cpu"]), float(r["cap_mem"]))
            for r in csv.DictReader(f)
            if r["gpu_type"] == gpu_type
        )
    if not shapes:
        raise KeyError(f"`machine` {gpu_type!r} is not an Alibaba PAI gpu_type")
    (gpus, cpu, mem), count = shapes.most_common(1)[0]
    if gpus <= 0 or not math.isfinite(cpu):
        raise KeyError(f"`machine` {gpu_type!r} has no GPUs")
    return MachineShape(gpu_type, gpus, cpu, mem, count)
