"""The batched feature function gives, bit for bit, the rows of the per-request one.

Online scoring featurises a whole micro-batch at once (`FeatureFunction.batch`);
offline tools featurise one request at a time. A policy must see the same float32
inputs either way, so every comparison here is exact (byte equality of the
arrays), over sample, synthetic and simulator requests and over hand-made edge
cases, in batches of every size and composition.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from service.contract import (
    DEFAULT_FEATURES,
    KNOWN_HARDWARE,
    N_FEATURES,
    ClusterState,
    HardwareClass,
    MirrorRequest,
    PlacementOptions,
    Workload,
    WorkloadKind,
)
from service.contract import features as features_module
from service.contract.hardware import CAPABILITIES
from service.contract.state import frozen_array
from service.contract.validation import MAX_QUANTITY, validate_request
from service.contract.workload import KNOWN_QOS_CLASSES
from service.environment import World, load_scenario
from service.environment.recording import log_episode
from service.policies.synthetic import random_requests

Item = tuple[ClusterState, Workload, PlacementOptions]


def _items(requests: Sequence[MirrorRequest]) -> list[Item]:
    return [(r.state, r.workload, r.options) for r in requests]


def assert_batch_matches(items: Sequence[Item]) -> None:
    """`batch(items)` equals the per-request rows stacked, byte for byte."""
    expected = (
        np.concatenate([DEFAULT_FEATURES(s, w, o) for s, w, o in items])
        if items
        else np.zeros((0, N_FEATURES), dtype=np.float32)
    )
    got = DEFAULT_FEATURES.batch(items)
    assert got.dtype == np.float32
    assert got.shape == expected.shape
    if got.tobytes() != expected.tobytes():
        row, col = np.argwhere(got.view(np.uint32) != expected.view(np.uint32))[0]
        pytest.fail(
            f"row {row} column {DEFAULT_FEATURES.names[col]}: batched {got[row, col]!r},"
            f" per request {expected[row, col]!r}"
        )


def _random_hardware(rng: np.random.Generator, i: int) -> HardwareClass:
    """A known class, a known name with other numbers, or a class never seen."""
    known = list(KNOWN_HARDWARE.values())
    pick = rng.integers(0, 3)
    if pick == 0:
        return known[int(rng.integers(0, len(known)))]
    base = known[int(rng.integers(0, len(known)))]
    numbers = rng.uniform(0.0, 2000.0, 4)
    numbers[rng.random(4) < 0.1] = 0.0
    name = base.name if pick == 1 else f"future-{i}"
    return HardwareClass(name, *(float(x) for x in numbers))


def _random_request(rng: np.random.Generator, i: int, max_nodes: int = 120) -> MirrorRequest:
    """A valid request with random sizes, classes, zones, gang options and workload."""
    n = int(rng.integers(1, max_nodes + 1))
    n_hw = int(rng.integers(1, 5))
    hardware = tuple(_random_hardware(rng, k) for k in range(n_hw))
    total = rng.integers(0, 17, n)
    cpu_total = rng.uniform(0.5, 256.0, n).astype(np.float32)
    mem_total = rng.uniform(1.0, 2048.0, n).astype(np.float32)
    zones = rng.integers(0, int(rng.integers(1, 5)), n)
    localities = rng.integers(0, int(rng.integers(1, 9)), n)
    node_hardware = rng.integers(0, n_hw, n)
    # a class stated to have no accelerator memory is a CPU pool: its nodes have no
    # accelerators (contract v2 refuses the contradiction, issue 22)
    cpu_pool = np.array([h.accelerator_memory_gb == 0 for h in hardware])
    total = np.where(cpu_pool[node_hardware], 0, total)
    state = ClusterState(
        node_ids=tuple(f"n{i}-{k}" for k in range(n)),
        hardware=hardware,
        node_hardware=frozen_array(node_hardware, np.int32),
        accelerators_free=frozen_array(rng.integers(0, total + 1), np.int32),
        accelerators_total=frozen_array(total, np.int32),
        cpu_free=frozen_array(cpu_total * rng.random(n).astype(np.float32), np.float32),
        cpu_total=frozen_array(cpu_total, np.float32),
        memory_free_gb=frozen_array(mem_total * rng.random(n).astype(np.float32), np.float32),
        memory_total_gb=frozen_array(mem_total, np.float32),
        utilisation=frozen_array(rng.random(n), np.float32),
        queue_length=frozen_array(rng.poisson(2.0, n), np.int32),
        healthy=frozen_array(rng.random(n) > 0.1, np.bool_),
        draining=frozen_array(rng.random(n) < 0.1, np.bool_),
        zone=tuple(f"zone-{z}" for z in zones),
        locality=tuple(f"rack-{x}" for x in localities),
        labels=tuple(frozenset() for _ in range(n)),
    )
    n_opt = int(rng.integers(1, 60))
    sizes = np.where(rng.random(n_opt) < 0.3, rng.integers(2, 9, n_opt), 1)
    sizes = np.minimum(sizes, n)
    node_index = np.concatenate([rng.choice(n, size=int(s), replace=False) for s in sizes])
    options = PlacementOptions(
        node_offsets=frozen_array(np.concatenate([[0], np.cumsum(sizes)]), np.int64),
        node_index=frozen_array(node_index, np.int32),
        accelerators=frozen_array(rng.integers(0, 9, len(node_index)), np.int32),
        option_ids=(),
    )
    kinds = list(WorkloadKind)
    workload = Workload(
        workload_id=f"w{i}",
        kind=kinds[int(rng.integers(0, len(kinds)))],
        model_family="LM",
        model_size_b=float(rng.choice([0.0, rng.uniform(0, 1), rng.uniform(0, 500)])),
        accelerators=int(rng.integers(0, 65)),
        accelerator_memory_gb=float(rng.uniform(0, 100)),
        cpu_per_node=float(rng.uniform(0, 16)),
        memory_per_node_gb=float(rng.uniform(0, 64)),
        gang_size=1,
        priority=int(rng.integers(-5, 20)),
        tenant="t",
        slo_seconds=None if rng.random() < 0.3 else float(rng.uniform(1e-3, 1e7)),
    )
    request = MirrorRequest(1, f"r{i}", 1.7e9, state, workload, options)
    validate_request(request)
    return request


KINDS_V2 = (*(k.value for k in WorkloadKind), "serve", "Inference-v2", "notebook")
QOS_V2 = ("", *KNOWN_QOS_CLASSES, "gold", "system-critical")


def _v2_hardware(rng: np.random.Generator, hardware: HardwareClass) -> HardwareClass:
    """`hardware` with some capability numbers unknown (None), as contract v2 allows."""
    numbers = [getattr(hardware, a) for a in CAPABILITIES]
    unknown = rng.random(4) < 0.3
    return HardwareClass(
        hardware.name, *(None if u else v for u, v in zip(unknown, numbers, strict=True))
    )


def _v2_request(rng: np.random.Generator, i: int) -> MirrorRequest:
    """A random request with every v2 input: open kinds and QoS, share jobs, unknown
    capabilities, per-device state (sent or derived) and options naming devices."""
    base = _random_request(rng, i, max_nodes=40)
    state, options = base.state, base.options
    hardware = tuple(_v2_hardware(rng, h) if rng.random() < 0.5 else h for h in state.hardware)
    state = dataclasses.replace(state, hardware=hardware)
    if rng.random() < 0.6:  # devices sent per device
        per_node = rng.integers(0, 9, state.n_nodes)
        offsets = np.concatenate([[0], np.cumsum(per_node)]).astype(np.int64)
        n_dev = int(offsets[-1])
        dev_hw = np.repeat(state.node_hardware, per_node)
        swap = rng.random(n_dev) < 0.2  # a partition: its own class
        dev_hw = np.where(swap, rng.integers(0, len(hardware), n_dev), dev_hw)
        share = rng.choice([0.0, 1.0, 0.19, 0.5, 0.75], n_dev).astype(np.float32)
        memory = (share * rng.uniform(0.0, 80.0, n_dev)).astype(np.float32)
        wholly = np.bincount(
            np.repeat(np.arange(state.n_nodes), per_node),
            weights=share >= 1,
            minlength=state.n_nodes,
        )
        state = dataclasses.replace(
            state,
            device_offsets=frozen_array(offsets, np.int64),
            device_hardware=frozen_array(dev_hw, np.int32),
            device_free_share=frozen_array(share, np.float32),
            device_free_memory_gb=frozen_array(memory, np.float32),
            accelerators_total=frozen_array(per_node, np.int32),
            accelerators_free=frozen_array(wholly, np.int32),
        )
        if rng.random() < 0.5:  # options name the devices of each entry's node
            lists = []
            for node, k in zip(options.node_index, options.accelerators, strict=True):
                own = np.arange(offsets[node], offsets[node + 1])
                lists.append(rng.choice(own, size=min(int(k), len(own)), replace=False))
            sizes = [len(x) for x in lists]
            options = dataclasses.replace(
                options,
                device_offsets=frozen_array(np.concatenate([[0], np.cumsum(sizes)]), np.int64),
                device_index=frozen_array(
                    np.concatenate([*lists, np.zeros(0)]).astype(np.int32), np.int32
                ),
            )
    share_job = rng.random() < 0.4
    allowed = (
        frozenset({hardware[int(rng.integers(0, len(hardware)))].name})
        if rng.random() < 0.3
        else frozenset()
    )
    workload = dataclasses.replace(
        base.workload,
        kind=str(rng.choice(KINDS_V2)),
        qos_class=str(rng.choice(QOS_V2)),
        accelerator_share=float(rng.choice([0.44, 0.19, 1.0])) if share_job else None,
        accelerators=0 if share_job else base.workload.accelerators,
        allowed_hardware=allowed,
    )
    return dataclasses.replace(base, state=state, workload=workload, options=options)


@pytest.fixture(scope="module")
def v2_pool() -> list[MirrorRequest]:
    rng = np.random.default_rng(20261203)
    return [_v2_request(rng, i) for i in range(300)]


@pytest.mark.parametrize("size", [1, 5, 32, 300])
def test_v2_inputs_in_batches_of_every_size(v2_pool: list[MirrorRequest], size: int) -> None:
    """Open kinds and QoS, shares, unknown numbers, sent and named devices: still bit-identical."""
    assert any(r.state.has_devices for r in v2_pool)
    assert any(r.options.names_devices for r in v2_pool)
    for start in range(0, len(v2_pool), size):
        assert_batch_matches(_items(v2_pool[start : start + size]))


def test_v2_rows_are_finite(v2_pool: list[MirrorRequest]) -> None:
    x = DEFAULT_FEATURES.batch(_items(v2_pool))
    assert np.isfinite(x).all()


@pytest.fixture(scope="module")
def random_pool() -> list[MirrorRequest]:
    rng = np.random.default_rng(20261129)
    return [_random_request(rng, i) for i in range(400)]


@pytest.fixture(scope="module")
def simulator_requests() -> list[MirrorRequest]:
    world = World(load_scenario("train").replace(jobs_per_episode=40))
    return [r for e in range(2) for r in log_episode(world, seed=3, episode=e).requests]


def test_empty_batch_has_no_rows() -> None:
    assert_batch_matches([])


@pytest.mark.parametrize("size", [1, 2, 7, 16, 64, 256])
def test_random_requests_in_batches_of_every_size(
    random_pool: list[MirrorRequest], size: int
) -> None:
    for start in range(0, len(random_pool), size):
        assert_batch_matches(_items(random_pool[start : start + size]))


def test_random_batch_compositions(random_pool: list[MirrorRequest]) -> None:
    """Shuffled and repeated requests: a row never depends on its neighbours."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        picks = rng.integers(0, len(random_pool), int(rng.integers(1, 80)))
        assert_batch_matches(_items([random_pool[int(i)] for i in picks]))


def test_the_random_pool_holds_every_interconnect_class(
    random_pool: list[MirrorRequest],
) -> None:
    """The bit-identity tests above cover one-node, one-locality and cross-locality rows."""
    x = DEFAULT_FEATURES.batch(_items(random_pool))
    classes = x[:, DEFAULT_FEATURES.names.index("interconnect_class")]
    assert set(np.unique(classes).tolist()) == {0.0, 1.0, 2.0}


def test_sample_requests(requests_sample: list[MirrorRequest]) -> None:
    assert_batch_matches(_items(requests_sample))


def test_synthetic_requests() -> None:
    for seed in range(3):
        requests = random_requests(seed, 96)
        assert any((np.diff(r.options.node_offsets) > 1).any() for r in requests)
        assert_batch_matches(_items(requests))


def test_simulator_requests(simulator_requests: list[MirrorRequest]) -> None:
    assert len(simulator_requests) > 20
    assert_batch_matches(_items(simulator_requests))
    for start in range(0, len(simulator_requests), 16):
        assert_batch_matches(_items(simulator_requests[start : start + 16]))


def _one_node_request(hardware: HardwareClass) -> MirrorRequest:
    rng = np.random.default_rng(1)
    base = _random_request(rng, 0, max_nodes=1)
    state = dataclasses.replace(base.state, hardware=(hardware,))
    return dataclasses.replace(base, state=state)


@pytest.mark.parametrize(
    "hardware",
    [
        KNOWN_HARDWARE["H100-SXM"],
        KNOWN_HARDWARE["CPU"],
        HardwareClass("H100-SXM", 80.0, 990.0, 3350.0, 900.0),
        HardwareClass("never-seen", 0.0, 0.0, 0.0, 0.0),
        HardwareClass("negative-zero", -0.0, -0.0, -0.0, -0.0),
        HardwareClass("huge", MAX_QUANTITY, MAX_QUANTITY, MAX_QUANTITY, MAX_QUANTITY),
    ],
    ids=["known", "cpu", "known-name-other-numbers", "zeros", "negative-zero", "huge"],
)
def test_one_node_clusters_and_unusual_classes(hardware: HardwareClass) -> None:
    request = _one_node_request(hardware)
    assert request.state.n_nodes == 1
    assert_batch_matches(_items([request]))
    assert_batch_matches(_items([request, *random_requests(0, 3)]))


def test_many_nodes_and_wide_gangs() -> None:
    rng = np.random.default_rng(5)
    big = _random_request(rng, 0, max_nodes=5000)
    n = big.state.n_nodes
    width = min(n, 1024)
    gang = PlacementOptions(
        node_offsets=frozen_array([0, width, width + 1, n + width + 1], np.int64),
        node_index=frozen_array(np.concatenate([np.arange(width), [0], np.arange(n)]), np.int32),
        accelerators=frozen_array(np.ones(n + width + 1), np.int32),
        option_ids=(),
    )
    wide = dataclasses.replace(big, options=gang)
    assert_batch_matches(_items([wide]))
    assert_batch_matches(_items([wide, big, wide]))


def test_extreme_workloads(random_pool: list[MirrorRequest]) -> None:
    base = random_pool[0]
    extremes = [
        dataclasses.replace(base.workload, model_size_b=MAX_QUANTITY, accelerators=2**31 - 1),
        dataclasses.replace(base.workload, slo_seconds=MAX_QUANTITY, priority=2**31 - 1),
        dataclasses.replace(base.workload, slo_seconds=None, priority=-(2**31)),
        dataclasses.replace(base.workload, accelerator_memory_gb=MAX_QUANTITY),
        *(dataclasses.replace(base.workload, kind=k) for k in WorkloadKind),
    ]
    items = [(base.state, w, base.options) for w in extremes]
    assert_batch_matches(items)


def test_mixed_precision_states_fall_back_exactly(random_pool: list[MirrorRequest]) -> None:
    """A hand-built float64 state beside float32 ones keeps each state's own precision."""
    base = random_pool[1]
    wide = dataclasses.replace(
        base.state,
        cpu_free=base.state.cpu_free.astype(np.float64),
        cpu_total=base.state.cpu_total.astype(np.float64),
    )
    assert_batch_matches(
        [(wide, base.workload, base.options), (base.state, base.workload, base.options)]
    )


def test_editing_the_batched_computation_changes_the_hash(tmp_path: Path) -> None:
    """The batched form is part of the definition: one edited literal, another hash."""
    source = Path(features_module.__file__).read_text()
    edited = source.replace(
        "out[:, 27] = np.log2(1.0 + w[:, 2])", "out[:, 27] = np.log2(2.0 + w[:, 2])"
    )
    assert edited != source
    path = tmp_path / "features_batch_edited.py"
    path.write_text(edited)
    spec = importlib.util.spec_from_file_location("features_batch_edited", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["features_batch_edited"] = module
    try:
        spec.loader.exec_module(module)
        assert module.FeatureFunction().definition_hash != DEFAULT_FEATURES.definition_hash
    finally:
        del sys.modules["features_batch_edited"]
