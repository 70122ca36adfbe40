"""Random feasibility cases for contract v2: shared and partitioned devices, shares, names.

Used by the acceptance property test (tests/contract/test_feasibility_property.py,
against a brute-force check) and by the batch-equivalence test (the batched form
against the per-request one). States are built directly as dataclasses: devices
sent per node (classes, including a MIG-style partition class, a class of unknown
memory and a CPU class; free shares of 0, 1 and in between; free memory, some
unknown) or the node-level shortcut; workloads asking for whole devices, a share
of one device, or no accelerators, with allow-lists, labels and quotas; options
on one node or a gang, some naming their devices (now and then one on another
node, one named twice, or one that does not exist).
"""

from __future__ import annotations

import itertools

import numpy as np

from service.contract import (
    KNOWN_HARDWARE,
    ClusterState,
    HardwareClass,
    PlacementOptions,
    Workload,
    WorkloadKind,
)
from service.contract.state import frozen_array

FeasibilityCase = tuple[ClusterState, Workload, PlacementOptions, float | None]

CLASSES: tuple[HardwareClass, ...] = (
    KNOWN_HARDWARE["A100-80GB"],
    HardwareClass("A100-80GB-3g.40gb", 40.0, 156.0, 1000.0, None),
    HardwareClass("A100-80GB-1g.10gb", 10.0, 40.0, 250.0, None),
    KNOWN_HARDWARE["V100"],
    HardwareClass("mystery-gpu", None, None, None, None),
    KNOWN_HARDWARE["CPU"],
)
LABELS = ("pool=gpu", "ssd=yes", "old=yes")
_SHARES = (0.0, 0.1, 0.25, 0.44, 0.5, 0.75, 1.0)


def _pick(rng: np.random.Generator, values: tuple[float, ...]) -> float:
    return float(values[int(rng.integers(0, len(values)))])


def random_state(rng: np.random.Generator, sent: bool) -> ClusterState:
    """1 to 6 nodes; devices sent per node (`sent`) or the node counts alone."""
    n = int(rng.integers(1, 7))
    picks = rng.choice(len(CLASSES), size=int(rng.integers(1, 5)), replace=False)
    hardware = tuple(CLASSES[int(i)] for i in picks)
    n_hw = len(hardware)
    node_hw = rng.integers(0, n_hw, n)
    per_node = rng.integers(0, 5, n)
    extra: dict[str, object] = {}
    if sent:
        n_dev = int(per_node.sum())
        own = np.repeat(node_hw, per_node)
        dev_hw = np.where(rng.random(n_dev) < 0.7, own, rng.integers(0, n_hw, n_dev))
        share = np.array([_pick(rng, _SHARES) for _ in range(n_dev)])
        share = np.where(rng.random(n_dev) < 0.2, rng.random(n_dev), share)
        memory = np.array(
            [
                np.nan
                if hardware[h].accelerator_memory_gb is None
                else float(hardware[h].accelerator_memory_gb or 0.0)
                for h in dev_hw
            ]
        )
        memory = memory * np.where(share >= 1.0, 1.0, rng.random(n_dev))
        memory[rng.random(n_dev) < 0.1] = np.nan
        extra = {
            "device_offsets": frozen_array(np.concatenate([[0], np.cumsum(per_node)]), np.int64),
            "device_hardware": frozen_array(dev_hw, np.int32),
            "device_free_share": frozen_array(share, np.float32),
            "device_free_memory_gb": frozen_array(memory, np.float32),
            "device_ids": tuple(f"gpu{k}" for k in range(n_dev)),
        }
        free = np.bincount(np.repeat(np.arange(n), per_node), share >= 1.0, minlength=n)
    else:
        free = rng.integers(0, per_node + 1)
    cpu_total = rng.choice([4.0, 16.0, 64.0], n)
    mem_total = rng.choice([16.0, 64.0, 512.0], n)
    return ClusterState(
        node_ids=tuple(f"n{k}" for k in range(n)),
        hardware=hardware,
        node_hardware=frozen_array(node_hw, np.int32),
        accelerators_free=frozen_array(free, np.int32),
        accelerators_total=frozen_array(per_node, np.int32),
        cpu_free=frozen_array(cpu_total * rng.choice([0.0, 0.25, 0.5, 1.0], n), np.float32),
        cpu_total=frozen_array(cpu_total, np.float32),
        memory_free_gb=frozen_array(mem_total * rng.choice([0.0, 0.25, 0.5, 1.0], n), np.float32),
        memory_total_gb=frozen_array(mem_total, np.float32),
        utilisation=frozen_array(rng.random(n), np.float32),
        queue_length=frozen_array(rng.integers(0, 3, n), np.int32),
        healthy=frozen_array(rng.random(n) > 0.1, np.bool_),
        draining=frozen_array(rng.random(n) < 0.1, np.bool_),
        zone=tuple("z" for _ in range(n)),
        locality=tuple(f"r{k % 2}" for k in range(n)),
        labels=tuple(frozenset(lab for lab in LABELS if rng.random() < 0.5) for _ in range(n)),
        **extra,  # type: ignore[arg-type]
    )


def random_workload(rng: np.random.Generator, state: ClusterState, i: int) -> Workload:
    """Whole devices (1-4), a share of one device, or a CPU job, with random rules."""
    form = int(rng.integers(0, 3))
    names = [h.name for h in state.hardware]
    allowed = frozenset(str(x) for x in rng.choice(names, int(rng.integers(1, len(names) + 1))))
    return Workload(
        workload_id=f"w{i}",
        kind=WorkloadKind.INFER if form == 1 else WorkloadKind.TRAIN,
        model_family="ResNet-50",
        model_size_b=0.025,
        accelerators=int(rng.integers(1, 5)) if form == 0 else 0,
        accelerator_memory_gb=_pick(rng, (0.0, 5.0, 10.0, 16.0, 40.0, 80.0, 100.0)),
        cpu_per_node=_pick(rng, (0.0, 4.0, 8.0, 16.0)),
        memory_per_node_gb=_pick(rng, (0.0, 8.0, 32.0, 128.0)),
        gang_size=1,
        priority=0,
        tenant="t",
        allowed_hardware=allowed if rng.random() < 0.3 else frozenset(),
        affinity=frozenset({"pool=gpu"}) if rng.random() < 0.2 else frozenset(),
        anti_affinity=frozenset({"old=yes"}) if rng.random() < 0.2 else frozenset(),
        accelerator_share=_pick(rng, (0.1, 0.25, 0.44, 0.5, 1.0)) if form == 1 else None,
    )


def _node_devices(state: ClusterState) -> list[list[int]]:
    """Global device indices per node, from the sent offsets or the node totals."""
    if state.has_devices:
        bounds = state.device_offsets.tolist()
    else:
        bounds = np.concatenate([[0], np.cumsum(state.accelerators_total)]).tolist()
    return [list(range(a, b)) for a, b in itertools.pairwise(bounds)]


def random_options(
    rng: np.random.Generator, state: ClusterState, workload: Workload, name: bool
) -> PlacementOptions:
    """1-10 options, single node or a gang of 2-3; each entry names devices when `name`."""
    owned = _node_devices(state)
    n_devices = sum(len(d) for d in owned)
    sizes, nodes, taken, named, named_offsets = [], [], [], [], [0]
    for _ in range(int(rng.integers(1, 11))):
        size = 1 if rng.random() < 0.6 else min(state.n_nodes, int(rng.integers(2, 4)))
        picked = rng.choice(state.n_nodes, size=size, replace=False)
        sizes.append(size)
        for node in picked:
            if workload.is_share:
                k = int(rng.choice([0, 1, 1, 2]) if rng.random() < 0.1 else rng.integers(0, 2))
            elif workload.accelerators:
                k = int(rng.integers(0, 5)) if rng.random() < 0.3 else workload.accelerators // size
            else:
                k = int(rng.integers(0, 2)) if rng.random() < 0.1 else 0
            nodes.append(int(node))
            taken.append(k)
            if name:
                mine = owned[int(node)]
                want = max(k, 1) if workload.is_share else k
                if rng.random() < 0.2:
                    want += int(rng.choice([-1, 1]))
                chosen = [int(x) for x in rng.permutation(mine)[: max(want, 0)]]
                roll = rng.random()
                if roll < 0.05 and len(chosen) > 1:
                    chosen[-1] = chosen[0]  # named twice, the count still k
                elif roll < 0.05 and chosen:
                    chosen.append(chosen[0])  # named twice
                elif roll < 0.1 and n_devices:
                    chosen[:1] = [int(rng.integers(0, n_devices))]  # maybe another node's
                elif roll < 0.12:
                    chosen[:1] = [n_devices + 3]  # no such device
                named += chosen
                named_offsets.append(len(named))
    extra: dict[str, object] = {}
    if name:
        extra = {
            "device_offsets": frozen_array(named_offsets, np.int64),
            "device_index": frozen_array(named, np.int32),
        }
    return PlacementOptions(
        node_offsets=frozen_array(np.concatenate([[0], np.cumsum(sizes)]), np.int64),
        node_index=frozen_array(nodes, np.int32),
        accelerators=frozen_array(taken, np.int32),
        option_ids=tuple("" for _ in sizes),
        **extra,  # type: ignore[arg-type]
    )


def random_case(rng: np.random.Generator, i: int) -> FeasibilityCase:
    """One (state, workload, options, quota_remaining)."""
    state = random_state(rng, sent=bool(rng.random() < 0.5))
    workload = random_workload(rng, state, i)
    options = random_options(rng, state, workload, name=bool(rng.random() < 0.3))
    quota = None if rng.random() < 0.5 else _pick(rng, (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0))
    return state, workload, options, quota


def random_cases(seed: int, n: int) -> list[FeasibilityCase]:
    """`n` cases from `seed`."""
    rng = np.random.default_rng(seed)
    return [random_case(rng, i) for i in range(n)]
