"""Sample mirrored requests built from the real data in ``../shared/data``.

Until the simulator drives traffic, the demo and the transport tests mirror
these: nodes drawn from the Alibaba PAI machine inventory
(``alibaba-gpu-v2020-machine-spec``), jobs from a Gavel/Philly trace
(``gavel-philly-derived-traces``: job type, steps, GPU count).

What the data does not say is stated, not invented: machines of type ``MISC``
(no GPU model given) are left out; the per-accelerator memory a job needs and
model sizes are rough assumptions (`_FAMILY_ASSUMPTIONS`), labelled as such.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike, NDArray

from service.contract import (
    KNOWN_HARDWARE,
    SCHEMA_VERSION,
    ClusterState,
    MirrorRequest,
    PlacementOptions,
    ProductionDecision,
    Workload,
    WorkloadKind,
)
from service.contract.state import frozen_array

_PAI_CLASS = {"P100": "P100", "T4": "T4", "V100": "V100", "V100M32": "V100-32GB", "CPU": "CPU"}

# (model size in billions of parameters, GB per accelerator). The sizes are the
# models' published parameter counts where the architecture fixes them
# (ResNet-18 11.7M and ResNet-50 25.6M, He et al. 2016; Transformer base 65M,
# Vaswani et al. 2017; CycleGAN's two generators and two discriminators 28M,
# Zhu et al. 2017; A3C's Atari network 1.1M, Mnih et al. 2016) and assumptions
# for the two whose size depends on a vocabulary (LM: 30M, Recommendation: 20M).
# They are the figures the synthetic requests of `service.policies.synthetic`
# use too (tests/environment/test_env_request_content.py checks they agree),
# so tests' random clusters and the simulator describe the same models. The memory
# column is an assumption, not data: the traces say nothing about memory.
_FAMILY_ASSUMPTIONS = {
    "ResNet-50": (0.0256, 10.0),
    "ResNet-18": (0.0117, 6.0),
    "Transformer": (0.065, 12.0),
    "LM": (0.03, 8.0),
    "Recommendation": (0.02, 6.0),
    "A3C": (0.0011, 2.0),
    "CycleGAN": (0.028, 8.0),
}
_DEFAULT_FAMILY = (0.03, 8.0)
"""A family outside the table (none of Gavel's): a mid-sized model, 8 GB."""

HOST_USE_PER_DEVICE = 0.5
"""Share of a server's per-device host CPU and memory (``cpu_total / devices``)
that a job uses for each device (or share of one) it holds: an assumption, not
data (the traces record no host use); input pipelines of GPU training commonly
keep a few cores per GPU busy. It only varies the free fractions Runtime would
report: the simulator's jobs ask for no host CPU or memory, so it binds nothing."""


def family_model_size_b(job_type: str) -> float:
    """Model size (billions of parameters) of a job of `job_type` (`_FAMILY_ASSUMPTIONS`)."""
    return _FAMILY_ASSUMPTIONS.get(job_type.split(" (")[0], _DEFAULT_FAMILY)[0]


def host_free(total: ArrayLike, devices: ArrayLike, used_devices: ArrayLike) -> NDArray[np.float64]:
    """Free host CPU (or memory) per server when jobs hold `used_devices` of its `devices`.

    ``total * (1 - HOST_USE_PER_DEVICE * used / devices)``: a busy server still
    has half its host free, an idle one all of it (`HOST_USE_PER_DEVICE`).
    """
    used = np.asarray(used_devices, dtype=np.float64) / np.maximum(np.asarray(devices), 1)
    out: NDArray[np.float64] = np.asarray(total, dtype=np.float64) * (
        1.0 - HOST_USE_PER_DEVICE * np.clip(used, 0.0, 1.0)
    )
    return out


def family_memory_gb(job_type: str) -> float:
    """Device memory (GB) a job of `job_type` is assumed to need (`_FAMILY_ASSUMPTIONS`).

    An assumption, not data: the traces say nothing about memory. The
    simulator's share jobs ask for this much memory on their device.
    """
    return _FAMILY_ASSUMPTIONS.get(job_type.split(" (")[0], _DEFAULT_FAMILY)[1]


def shared_data_dir() -> Path:
    """``$UNDERSTUDY_SHARED_DATA`` or ``<repo>/../shared/data``."""
    env = os.environ.get("UNDERSTUDY_SHARED_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "shared" / "data"


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a Gavel trace line."""

    job_type: str
    steps: float
    arrival_s: float
    gpus: int

    @property
    def family(self) -> str:
        """Model family: the job type without its batch size."""
        return self.job_type.split(" (")[0]


def read_trace(path: Path, limit: int | None = None) -> list[TraceJob]:
    """Jobs of a Gavel trace file (tab-separated: type, command, -, -, steps, arrival, gpus)."""
    jobs = []
    with path.open() as handle:
        for line in handle:
            parts = line.rstrip("\n").split("\t")
            jobs.append(TraceJob(parts[0], float(parts[4]), float(parts[5]), int(parts[6])))
            if limit is not None and len(jobs) >= limit:
                break
    return jobs


def read_inventory(
    n_nodes: int, rng: np.random.Generator
) -> list[tuple[str, str, float, float, int]]:
    """`n_nodes` machines sampled from PAI's spec: (id, class, cpu, memory GB, gpus)."""
    path = shared_data_dir() / "alibaba-gpu-v2020-machine-spec" / "pai_machine_spec.csv"
    with path.open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["gpu_type"] in _PAI_CLASS]
    picks = rng.choice(len(rows), size=n_nodes, replace=False)
    return [
        (
            rows[i]["machine"][:12],
            _PAI_CLASS[rows[i]["gpu_type"]],
            float(rows[i]["cap_cpu"]),
            float(rows[i]["cap_mem"]),
            int(rows[i]["cap_gpu"]),
        )
        for i in picks
    ]


def sample_state(n_nodes: int, rng: np.random.Generator) -> ClusterState:
    """A cluster snapshot over sampled PAI machines with random current load."""
    machines = read_inventory(n_nodes, rng)
    classes = sorted({m[1] for m in machines})
    total = np.array([m[4] for m in machines], dtype=np.int32)
    free = rng.integers(0, total + 1).astype(np.int32)
    cpu_total = np.array([m[2] for m in machines], dtype=np.float32)
    mem_total = np.array([m[3] for m in machines], dtype=np.float32)
    return ClusterState(
        node_ids=tuple(f"{m[0]}-{i}" for i, m in enumerate(machines)),
        hardware=tuple(KNOWN_HARDWARE[c] for c in classes),
        node_hardware=frozen_array([classes.index(m[1]) for m in machines], np.int32),
        accelerators_free=frozen_array(free, np.int32),
        accelerators_total=frozen_array(total, np.int32),
        cpu_free=frozen_array(cpu_total * rng.uniform(0.2, 1.0, n_nodes), np.float32),
        cpu_total=frozen_array(cpu_total, np.float32),
        memory_free_gb=frozen_array(mem_total * rng.uniform(0.2, 1.0, n_nodes), np.float32),
        memory_total_gb=frozen_array(mem_total, np.float32),
        utilisation=frozen_array(1.0 - free / np.maximum(total, 1), np.float32),
        queue_length=frozen_array(rng.poisson(1.0, n_nodes), np.int32),
        healthy=frozen_array(rng.random(n_nodes) > 0.02, np.bool_),
        draining=frozen_array(rng.random(n_nodes) < 0.05, np.bool_),
        zone=tuple(f"zone-{i % 3}" for i in range(n_nodes)),
        locality=tuple(f"rack-{i % 8}" for i in range(n_nodes)),
        labels=tuple(frozenset({f"pool={m[1].lower()}"}) for m in machines),
    )


def sample_requests(
    count: int, seed: int = 0, n_nodes: int = 64, max_options: int = 50
) -> Iterator[MirrorRequest]:
    """`count` mirror requests: trace jobs placed against sampled cluster snapshots.

    Production's decision is uniform over the feasible single-node options
    with enough free accelerators (propensity 1/k), mirrored after deciding.
    """
    rng = np.random.default_rng(seed)
    trace = shared_data_dir() / "gavel-philly-derived-traces" / "0e4a51.trace"
    jobs = read_trace(trace, limit=count)
    for i, job in enumerate(jobs):
        state = sample_state(n_nodes, rng)
        size_b, mem_gb = _FAMILY_ASSUMPTIONS.get(job.family, _DEFAULT_FAMILY)
        workload = Workload(
            workload_id=f"job-{i}",
            kind=WorkloadKind.TRAIN,
            model_family=job.family,
            model_size_b=size_b,
            accelerators=job.gpus,
            accelerator_memory_gb=mem_gb,
            cpu_per_node=4.0,
            memory_per_node_gb=16.0,
            gang_size=1,
            priority=int(rng.integers(0, 5)),
            tenant=f"tenant-{i % 4}",
            slo_seconds=float(job.steps) * 2.0,
            work_units=job.steps,
        )
        nodes = np.flatnonzero(state.accelerators_total >= job.gpus)[:max_options]
        if len(nodes) == 0:
            nodes = np.arange(min(max_options, state.n_nodes))
        options = PlacementOptions(
            node_offsets=frozen_array(np.arange(len(nodes) + 1), np.int64),
            node_index=frozen_array(nodes, np.int32),
            accelerators=frozen_array(np.full(len(nodes), job.gpus), np.int32),
            option_ids=tuple(state.node_ids[n] for n in nodes),
        )
        fits = np.flatnonzero(
            (state.accelerators_free[nodes] >= job.gpus)
            & state.healthy[nodes]
            & ~state.draining[nodes]
        )
        production = (
            ProductionDecision(int(rng.choice(fits)), 1.0 / len(fits))
            if len(fits)
            else ProductionDecision(-1, 1.0)
        )
        yield MirrorRequest(
            schema_version=SCHEMA_VERSION,
            request_id=f"sample-{seed}-{i}",
            request_time=1_700_000_000.0 + job.arrival_s,
            state=state,
            workload=workload,
            options=options,
            production=production,
        )
