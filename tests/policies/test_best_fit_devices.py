"""best-fit with devices: whole jobs count wholly free devices, share jobs fit the tightest device.

Three nodes that send devices; their node counts say otherwise on purpose
(node 0 claims 5 free), so a score read from the counts would pick wrong.
The synthetic option enumerator gives a share job one device on one node.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from service.contract import (
    KNOWN_HARDWARE,
    ClusterState,
    MirrorRequest,
    Workload,
    WorkloadKind,
    single_node_options,
)
from service.contract.state import frozen_array
from service.policies.baselines import BestFit
from service.policies.batching import make_batch
from service.policies.synthetic import enumerate_options, random_cluster

SHARES = [[0.5, 0.2], [0.9], [1.0, 1.0]]


def cluster() -> ClusterState:
    n = len(SHARES)
    flat = [x for node in SHARES for x in node]
    return ClusterState(
        node_ids=tuple(f"n{i}" for i in range(n)),
        hardware=(KNOWN_HARDWARE["A100-80GB"],),
        node_hardware=frozen_array([0] * n, np.int32),
        accelerators_free=frozen_array([5, 0, 0], np.int32),
        accelerators_total=frozen_array([len(d) for d in SHARES], np.int32),
        cpu_free=frozen_array([32.0] * n, np.float32),
        cpu_total=frozen_array([64.0] * n, np.float32),
        memory_free_gb=frozen_array([256.0] * n, np.float32),
        memory_total_gb=frozen_array([512.0] * n, np.float32),
        utilisation=frozen_array([0.5] * n, np.float32),
        queue_length=frozen_array([0] * n, np.int32),
        healthy=frozen_array([True] * n, np.bool_),
        draining=frozen_array([False] * n, np.bool_),
        zone=("z",) * n,
        locality=("r",) * n,
        labels=(frozenset(),) * n,
        device_offsets=frozen_array(np.cumsum([0, *map(len, SHARES)]), np.int64),
        device_hardware=frozen_array([0] * len(flat), np.int32),
        device_free_share=frozen_array(flat, np.float32),
        device_free_memory_gb=frozen_array([80.0 * x for x in flat], np.float32),
        device_ids=tuple(f"gpu{k}" for k in range(len(flat))),
    )


def job(accelerators: int, share: float | None) -> Workload:
    return Workload(
        workload_id="j",
        kind=WorkloadKind.INFER,
        model_family="ResNet-50",
        model_size_b=0.025,
        accelerators=accelerators,
        accelerator_memory_gb=4.0,
        cpu_per_node=1.0,
        memory_per_node_gb=1.0,
        gang_size=1,
        priority=0,
        tenant="t",
        accelerator_share=share,
    )


def scores_of(workload: Workload, k: int) -> list[float]:
    options = single_node_options(np.arange(len(SHARES), dtype=np.int32), k)
    request = MirrorRequest(2, "r", 1.7e9, cluster(), workload, options)
    return BestFit().score(make_batch([request])).tolist()


def test_a_share_goes_to_the_tightest_device_it_fits() -> None:
    # 0.44: node 0's 0.5 device keeps 0.06, node 1 keeps 0.46, node 2 keeps 0.56.
    s = scores_of(job(0, 0.44), 1)
    assert int(np.argmax(s)) == 0
    assert s == pytest.approx([-0.06, -0.46, -0.56], abs=1e-6)
    # 0.6 fits no device of node 0: it ranks below both nodes it fits on.
    s = scores_of(job(0, 0.6), 1)
    assert int(np.argmax(s)) == 1 and s[0] < min(s[1:]) and s[0] <= -1e6


def test_whole_devices_count_wholly_free_devices_not_the_node_counts() -> None:
    s = scores_of(job(2, None), 2)
    assert int(np.argmax(s)) == 2  # node 2: two wholly free devices, none left over
    assert s[2] == 0.0 and s[0] <= -1e6  # node 0's "5 free" is not believed


def test_the_node_counts_still_rule_without_devices() -> None:
    bare = dataclasses.replace(
        cluster(),
        device_offsets=frozen_array([], np.int64),
        device_hardware=frozen_array([], np.int32),
        device_free_share=frozen_array([], np.float32),
        device_free_memory_gb=frozen_array([], np.float32),
        device_ids=(),
    )
    options = single_node_options(np.arange(len(SHARES), dtype=np.int32), 2)
    request = MirrorRequest(2, "r", 1.7e9, bare, job(2, None), options)
    s = BestFit().score(make_batch([request])).tolist()
    assert s[0] == -3.0 and s[1] <= -1e6


def test_synthetic_options_for_a_share_job_take_one_device_on_one_node() -> None:
    state = dataclasses.replace(
        random_cluster(np.random.default_rng(0), 8),
        accelerators_total=frozen_array([0, 8, 4, 0, 8, 8, 4, 8], np.int32),
    )
    share = job(0, 0.5)
    options = enumerate_options(state, share, np.random.default_rng(1), 24)
    assert options.nodes_per_option.tolist() == [1] * 6
    assert options.accelerators.tolist() == [1] * 6
    assert options.node_index.tolist() == [1, 2, 4, 5, 6, 7]  # nodes with devices only
