"""Each constraint signal fires for exactly the reason it names."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from service.contract import (
    KNOWN_HARDWARE,
    SIGNALS,
    ClusterState,
    ConstraintSignal,
    HardwareClass,
    PlacementOptions,
    Workload,
    WorkloadKind,
    check_feasibility,
    single_node_options,
)
from service.contract.state import frozen_array


def cluster() -> ClusterState:
    """Four nodes: V100 x8 (free 8), K80 x4 (free 4), CPU, V100 draining."""
    return ClusterState(
        node_ids=("v100-a", "k80-a", "cpu-a", "v100-b"),
        hardware=(KNOWN_HARDWARE["V100"], KNOWN_HARDWARE["K80"], KNOWN_HARDWARE["CPU"]),
        node_hardware=frozen_array([0, 1, 2, 0], np.int32),
        accelerators_free=frozen_array([8, 4, 0, 8], np.int32),
        accelerators_total=frozen_array([8, 4, 0, 8], np.int32),
        cpu_free=frozen_array([32, 16, 64, 32], np.float32),
        cpu_total=frozen_array([64, 32, 64, 64], np.float32),
        memory_free_gb=frozen_array([200, 100, 400, 200], np.float32),
        memory_total_gb=frozen_array([384, 256, 512, 384], np.float32),
        utilisation=frozen_array([0.0, 0.0, 0.0, 0.0], np.float32),
        queue_length=frozen_array([0, 0, 0, 0], np.int32),
        healthy=frozen_array([True, True, True, True], np.bool_),
        draining=frozen_array([False, False, False, True], np.bool_),
        zone=("z1", "z1", "z2", "z2"),
        locality=("r1", "r1", "r2", "r2"),
        labels=(
            frozenset({"pool=gpu"}),
            frozenset({"pool=gpu", "old=yes"}),
            frozenset(),
            frozenset(),
        ),
    )


def job(**changes: object) -> Workload:
    base = Workload(
        workload_id="j",
        kind=WorkloadKind.TRAIN,
        model_family="ResNet-50",
        model_size_b=0.025,
        accelerators=2,
        accelerator_memory_gb=10.0,
        cpu_per_node=4.0,
        memory_per_node_gb=16.0,
        gang_size=1,
        priority=1,
        tenant="t",
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def signals_of(workload: Workload, quota: float | None = None) -> list[set[ConstraintSignal]]:
    options = single_node_options(np.arange(4, dtype=np.int32), workload.accelerators)
    f = check_feasibility(cluster(), workload, options, quota)
    assert f.mask.tolist() == [not f.failed(i) for i in range(4)]
    return [set(f.failed(i)) for i in range(4)]


@pytest.mark.parametrize(
    ("changes", "quota", "node", "signal"),
    [
        ({"accelerators": 6}, None, 1, ConstraintSignal.ACCELERATOR_COUNT),
        ({"accelerator_memory_gb": 14.0}, None, 1, ConstraintSignal.ACCELERATOR_MEMORY),
        (
            {"allowed_hardware": frozenset({"K80"})},
            None,
            0,
            ConstraintSignal.HARDWARE_COMPATIBILITY,
        ),
        ({}, None, 2, ConstraintSignal.HARDWARE_COMPATIBILITY),
        ({"affinity": frozenset({"pool=gpu"})}, None, 3, ConstraintSignal.AFFINITY),
        ({"anti_affinity": frozenset({"old=yes"})}, None, 1, ConstraintSignal.ANTI_AFFINITY),
        ({}, 1.0, 0, ConstraintSignal.QUOTA),
        ({}, None, 3, ConstraintSignal.DRAIN),
        ({"cpu_per_node": 20.0}, None, 1, ConstraintSignal.CPU),
        ({"memory_per_node_gb": 150.0}, None, 1, ConstraintSignal.MEMORY),
    ],
)
def test_signal_fires(
    changes: dict[str, object], quota: float | None, node: int, signal: ConstraintSignal
) -> None:
    assert signal in signals_of(job(**changes), quota)[node]


def test_v100_a_is_feasible_and_every_signal_column_exists() -> None:
    assert signals_of(job())[0] == set()
    assert len(SIGNALS) == 10


def test_gang_option_is_infeasible_if_any_member_is() -> None:
    options = PlacementOptions(
        node_offsets=frozen_array([0, 2, 4], np.int64),
        node_index=frozen_array([0, 1, 0, 3], np.int32),
        accelerators=frozen_array([2, 2, 2, 2], np.int32),
        option_ids=("a+k", "a+b"),
    )
    f = check_feasibility(cluster(), job(accelerators=4, gang_size=2), options)
    assert f.mask.tolist() == [True, False]
    assert f.failed(1) == (ConstraintSignal.DRAIN,)


MIG = HardwareClass("A100-80GB-3g.40gb", 40.0, 156.0, 1000.0, None)


def shared_node(shares: list[float], memory: list[float], classes: list[int]) -> ClusterState:
    """One A100 node whose devices are sent: free shares, free memory, class per device."""
    base = cluster()
    one = {
        f.name: getattr(base, f.name)[:1]
        for f in dataclasses.fields(base)
        if f.name.startswith(("node_ids", "accelerators_", "cpu_", "memory_"))
        or f.name in ("utilisation", "queue_length", "healthy", "draining", "zone", "locality")
    }
    one["labels"] = (frozenset(),)
    return dataclasses.replace(
        base,
        **one,
        hardware=(KNOWN_HARDWARE["A100-80GB"], MIG),
        node_hardware=frozen_array([0], np.int32),
        device_offsets=frozen_array([0, len(shares)], np.int64),
        device_hardware=frozen_array(classes, np.int32),
        device_free_share=frozen_array(shares, np.float32),
        device_free_memory_gb=frozen_array(memory, np.float32),
        device_ids=tuple(f"gpu{i}" for i in range(len(shares))),
    )


def share_job(share: float, memory: float, **changes: object) -> Workload:
    return job(accelerators=0, accelerator_share=share, accelerator_memory_gb=memory, **changes)


def test_a_share_needs_room_and_memory_on_one_device() -> None:
    # gpu0 has 19% free; gpu1 has 50% free but 10 GB; gpu2 is wholly taken.
    node = shared_node([0.19, 0.5, 0.0], [60.0, 10.0, 0.0], [0, 0, 0])
    one = single_node_options(np.array([0], dtype=np.int32), 1)
    S = ConstraintSignal
    assert check_feasibility(node, share_job(0.44, 8.0), one).failed(0) == ()
    assert check_feasibility(node, share_job(0.44, 20.0), one).failed(0) == (
        S.ACCELERATOR_MEMORY,
    )  # room on gpu1, memory on gpu0: not on one device
    assert check_feasibility(node, share_job(0.6, 20.0), one).failed(0) == (S.ACCELERATOR_SHARE,)
    assert set(check_feasibility(node, share_job(0.6, 70.0), one).failed(0)) == {
        S.ACCELERATOR_SHARE,
        S.ACCELERATOR_MEMORY,
    }
    two = single_node_options(np.array([0], dtype=np.int32), 2)
    assert check_feasibility(node, share_job(0.44, 8.0), two).failed(0) == (S.ACCELERATOR_COUNT,)


def test_a_partition_is_judged_by_its_own_class() -> None:
    """A job allowed only on the 3g.40gb partition fits the partition of an A100 node."""
    node = shared_node([1.0, 1.0], [80.0, 40.0], [0, 1])
    one = single_node_options(np.array([0], dtype=np.int32), 1)
    only_mig = job(accelerators=1, allowed_hardware=frozenset({MIG.name}))
    assert check_feasibility(node, only_mig, one).failed(0) == ()
    two = single_node_options(np.array([0], dtype=np.int32), 2)
    assert check_feasibility(node, only_mig, two).failed(0) == (ConstraintSignal.ACCELERATOR_COUNT,)
    cpu_only = job(accelerators=0, allowed_hardware=frozenset({MIG.name}))
    zero = single_node_options(np.array([0], dtype=np.int32), 0)
    assert check_feasibility(node, cpu_only, zero).failed(0) == (
        ConstraintSignal.HARDWARE_COMPATIBILITY,
    )  # no accelerators taken: the node's own class decides


def test_named_devices_must_be_the_entry_s_own_and_fit() -> None:
    node = shared_node([1.0, 0.3, 1.0], [80.0, 80.0, 80.0], [0, 0, 0])

    def named(devices: list[int], k: int) -> PlacementOptions:
        return PlacementOptions(
            node_offsets=frozen_array([0, 1], np.int64),
            node_index=frozen_array([0], np.int32),
            accelerators=frozen_array([k], np.int32),
            option_ids=("",),
            device_offsets=frozen_array([0, len(devices)], np.int64),
            device_index=frozen_array(devices, np.int32),
        )

    two = job(accelerators=2)
    assert check_feasibility(node, two, named([0, 2], 2)).failed(0) == ()
    for devices in ([0, 1], [0, 0], [0], [0, 7]):  # partly taken, twice, too few, no such
        assert check_feasibility(node, two, named(devices, 2)).failed(0) == (
            ConstraintSignal.ACCELERATOR_COUNT,
        ), devices
