"""Synthetic clusters and Gavel-like requests, built from contract objects.

Used where real traffic does not exist yet: the registry's probe batch (every
loaded policy must pass `check_policy` on it), the build script's training
rows for the scoring policy, and latency measurements. Seeded, so the same
seed gives the same requests.

The workloads are Gavel's 26 job types (the families the predictor was fitted
on). Model sizes and per-accelerator memory needs are illustrative figures,
not measurements: they only need to be plausible enough that some options
fail the memory rule (K80 has 12 GB) and the size feature varies by family.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from service.contract import (
    KNOWN_HARDWARE,
    SCHEMA_VERSION,
    ClusterState,
    MirrorRequest,
    PlacementOptions,
    ProductionDecision,
    Workload,
    WorkloadKind,
    check_feasibility,
)
from service.contract.devices import node_devices

BATCH_SIZES: Mapping[str, tuple[int, ...]] = MappingProxyType(
    {
        "ResNet-18": (16, 32, 64, 128, 256),
        "ResNet-50": (16, 32, 64, 128),
        "Transformer": (16, 32, 64, 128, 256),
        "LM": (5, 10, 20, 40, 80),
        "Recommendation": (512, 1024, 2048, 4096, 8192),
        "A3C": (),
        "CycleGAN": (),
    }
)
MULTI_GPU_FAMILIES = frozenset({"ResNet-18", "ResNet-50", "Transformer", "LM"})
JOB_TYPES: tuple[str, ...] = tuple(
    f"{family} (batch size {b})" if sizes else family
    for family, sizes in BATCH_SIZES.items()
    for b in (sizes or (0,))
)
"""Gavel's 26 job types, spelled as Gavel spells them."""

_SIZE_B = {"ResNet-18": 0.0117, "ResNet-50": 0.0256, "Transformer": 0.065, "LM": 0.03,
           "Recommendation": 0.02, "A3C": 0.0011, "CycleGAN": 0.028}  # fmt: skip
_MEMORY = {"ResNet-18": (1.5, 0.02), "ResNet-50": (2.0, 0.09), "Transformer": (2.0, 0.04),
           "LM": (1.5, 0.1), "Recommendation": (1.0, 0.001), "A3C": (1.0, 0.0),
           "CycleGAN": (6.0, 0.0)}  # fmt: skip
_NODE_SIZE = {"K80": 8, "P100": 4, "V100": 8}


def random_cluster(
    rng: np.random.Generator, n_nodes: int, classes: tuple[str, ...] = ("K80", "P100", "V100")
) -> ClusterState:
    """A cluster of `n_nodes` nodes of the named `KNOWN_HARDWARE` classes.

    About 5% of nodes drain and 3% are unhealthy; utilisation, queues and free
    capacity vary, so feasibility and load-based baselines have work to do.
    """
    hardware = tuple(KNOWN_HARDWARE[c] for c in classes)
    cls = rng.integers(0, len(classes), n_nodes).astype(np.int32)
    total = np.array([_NODE_SIZE.get(classes[c], 8) for c in cls], dtype=np.int32)
    free = np.minimum(total, rng.integers(0, total + 1) + (rng.random(n_nodes) < 0.4) * total)
    cpu_total = np.full(n_nodes, 64.0, dtype=np.float32)
    mem_total = np.full(n_nodes, 512.0, dtype=np.float32)
    return ClusterState(
        node_ids=tuple(f"node-{i:03d}" for i in range(n_nodes)),
        hardware=hardware,
        node_hardware=cls,
        accelerators_free=free.astype(np.int32),
        accelerators_total=total,
        cpu_free=(cpu_total * rng.uniform(0.2, 1.0, n_nodes)).astype(np.float32),
        cpu_total=cpu_total,
        memory_free_gb=(mem_total * rng.uniform(0.2, 1.0, n_nodes)).astype(np.float32),
        memory_total_gb=mem_total,
        utilisation=rng.uniform(0.0, 1.0, n_nodes).astype(np.float32),
        queue_length=rng.poisson(1.5, n_nodes).astype(np.int32),
        healthy=rng.random(n_nodes) >= 0.03,
        draining=rng.random(n_nodes) < 0.05,
        zone=tuple(f"zone-{z}" for z in rng.integers(0, 2, n_nodes)),
        locality=tuple(f"rack-{r}" for r in rng.integers(0, 4, n_nodes)),
        labels=tuple(frozenset({"pool=shared"}) for _ in range(n_nodes)),
    )


def random_workload(rng: np.random.Generator, index: int) -> Workload:
    """A Gavel job type at a scale Gavel measured for it (1, 2, 4 or 8 GPUs)."""
    job_type = JOB_TYPES[int(rng.integers(0, len(JOB_TYPES)))]
    family = job_type.split(" (")[0]
    scales = (1, 2, 4, 8) if family in MULTI_GPU_FAMILIES else (1,)
    accelerators = int(rng.choice(scales))
    sizes = BATCH_SIZES[family]
    batch = int(job_type.split("batch size ")[1].rstrip(")")) if sizes else 0
    base, per_sample = _MEMORY[family]
    return Workload(
        workload_id=f"job-{index:05d}",
        kind=WorkloadKind.TRAIN,
        model_family=job_type,
        model_size_b=_SIZE_B[family],
        accelerators=accelerators,
        accelerator_memory_gb=float(min(base + per_sample * batch, 15.0)),
        cpu_per_node=4.0,
        memory_per_node_gb=32.0,
        # the most nodes an option may span (contract): `enumerate_options` offers
        # two-node gangs from 2 accelerators on
        gang_size=2 if accelerators >= 2 else 1,
        priority=int(rng.integers(0, 10)),
        tenant=f"tenant-{int(rng.integers(0, 3))}",
        slo_seconds=float(rng.choice([3600.0, 86400.0])) if rng.random() < 0.5 else None,
        work_units=float(rng.integers(1_000, 100_000)),
    )


def enumerate_options(
    state: ClusterState, workload: Workload, rng: np.random.Generator, max_options: int
) -> PlacementOptions:
    """Single-node options on nodes big enough, plus two-node gangs for >= 2 GPUs.

    Like Runtime, it enumerates by size only; feasibility (free capacity,
    drain, memory) is the contract's job. At most `max_options`, sampled.
    A share job (`Workload.is_share`) gets one single-node option per node
    with at least one device, taking that one device (k = 1): a share never
    spans devices or nodes.
    """
    a = workload.accelerators
    candidates: list[tuple[tuple[int, ...], tuple[int, ...]]]
    if workload.is_share:
        per_node = np.diff(node_devices(state).offsets)
        candidates = [((i,), (1,)) for i in range(state.n_nodes) if per_node[i] > 0]
    else:
        candidates = [
            ((i,), (a,)) for i in range(state.n_nodes) if state.accelerators_total[i] >= a
        ]
    if a >= 2:
        half = a // 2
        pairs = rng.integers(0, state.n_nodes, size=(max_options, 2))
        candidates += [((int(i), int(j)), (half, a - half)) for i, j in pairs if i != j]
    if not candidates:
        candidates = [((0,), (a,))]
    pick = rng.permutation(len(candidates))[:max_options]
    chosen = [candidates[int(k)] for k in sorted(pick)]
    return PlacementOptions(
        node_offsets=np.concatenate([[0], np.cumsum([len(n) for n, _ in chosen])]).astype(np.int64),
        node_index=np.array([i for n, _ in chosen for i in n], dtype=np.int32),
        accelerators=np.array([x for _, t in chosen for x in t], dtype=np.int32),
        option_ids=tuple(f"opt-{k}" for k in range(len(chosen))),
    )


def random_request(
    rng: np.random.Generator, index: int, state: ClusterState, max_options: int = 24
) -> MirrorRequest:
    """A request on `state` with production's decision: uniform over feasible, else defer."""
    workload = random_workload(rng, index)
    options = enumerate_options(state, workload, rng, max_options)
    feasible = np.flatnonzero(check_feasibility(state, workload, options).mask)
    production = (
        ProductionDecision(int(rng.choice(feasible)), 1.0 / len(feasible))
        if len(feasible)
        else ProductionDecision(-1, 1.0)
    )
    return MirrorRequest(
        schema_version=SCHEMA_VERSION,
        request_id=f"req-{index:05d}",
        request_time=1_700_000_000.0 + index,
        state=state,
        workload=workload,
        options=options,
        production=production,
    )


def random_requests(
    seed: int, n_requests: int, n_nodes: int = 32, max_options: int = 24
) -> list[MirrorRequest]:
    """`n_requests` requests, a fresh cluster every 8 requests, all from `seed`."""
    rng = np.random.default_rng(seed)
    out: list[MirrorRequest] = []
    state = random_cluster(rng, n_nodes)
    for i in range(n_requests):
        if i and i % 8 == 0:
            state = random_cluster(rng, n_nodes)
        out.append(random_request(rng, i, state, max_options))
    return out
