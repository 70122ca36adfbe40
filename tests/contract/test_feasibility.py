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
