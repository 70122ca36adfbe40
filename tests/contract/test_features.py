"""The feature function: shape, finiteness, identity (version + hash)."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from service.contract import (
    DEFAULT_FEATURES,
    FEATURE_NAMES,
    KNOWN_HARDWARE,
    N_FEATURES,
    ClusterState,
    FeatureConstants,
    FeatureFunction,
    HardwareClass,
    MirrorRequest,
    PlacementOptions,
    Workload,
)
from service.contract import features as features_module
from service.contract.imputation import IMPUTED_CAPABILITIES
from service.contract.state import frozen_array

col = FEATURE_NAMES.index


def test_features_are_float32_finite_one_row_per_option(
    requests_sample: list[MirrorRequest],
) -> None:
    for r in requests_sample:
        x = DEFAULT_FEATURES(r.state, r.workload, r.options)
        assert (
            x.shape
            == (r.options.n_options, N_FEATURES)
            == (r.options.n_options, len(FEATURE_NAMES))
        )
        assert x.dtype == np.float32
        assert np.isfinite(x).all()


def test_features_follow_the_data(requests_sample: list[MirrorRequest]) -> None:
    """Columns mean what the docstring says: checked against the raw state."""
    r = requests_sample[0]
    x = DEFAULT_FEATURES(r.state, r.workload, r.options)
    nodes = r.options.node_index
    mem = np.array([r.state.hardware_of(n).accelerator_memory_gb for n in nodes])
    np.testing.assert_allclose(x[:, col("accel_memory")], mem / 80.0, rtol=1e-6)
    np.testing.assert_allclose(x[:, col("utilisation")], r.state.utilisation[nodes], rtol=1e-6)
    unavailable = r.state.draining[nodes] | ~r.state.healthy[nodes]
    np.testing.assert_array_equal(x[:, col("unavailable")], unavailable)


def test_changing_one_constant_changes_the_hash() -> None:
    base = DEFAULT_FEATURES.definition_hash
    assert FeatureFunction().definition_hash == base, "the hash must be deterministic"
    for field in dataclasses.fields(FeatureConstants):
        changed = dataclasses.replace(
            FeatureConstants(), **{field.name: getattr(FeatureConstants(), field.name) + 1.0}
        )
        assert FeatureFunction(constants=changed).definition_hash != base, field.name


def test_editing_the_computation_changes_the_hash(tmp_path: Path) -> None:
    """A copy of the module with one literal edited in the computation hashes differently."""
    source = Path(features_module.__file__).read_text()
    edited = source.replace(
        "out[:, 27] = np.log2(1.0 + workload.accelerators)",
        "out[:, 27] = np.log2(2.0 + workload.accelerators)",
    )
    assert edited != source
    path = tmp_path / "features_edited.py"
    path.write_text(edited)
    spec = importlib.util.spec_from_file_location("features_edited", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["features_edited"] = module
    try:
        spec.loader.exec_module(module)
        assert module.FeatureFunction().definition_hash != DEFAULT_FEATURES.definition_hash
    finally:
        del sys.modules["features_edited"]


def test_version_is_features_v2_with_its_own_hash() -> None:
    assert DEFAULT_FEATURES.version == "features-v2"
    assert len(FEATURE_NAMES) == len(set(FEATURE_NAMES)) == N_FEATURES == 39


def _cluster(hardware: tuple[HardwareClass, ...], **devices: object) -> ClusterState:
    """Four nodes of 4 accelerators (all free), class i % len(hardware), two localities."""
    n = 4
    return ClusterState(
        node_ids=tuple(f"n{k}" for k in range(n)),
        hardware=hardware,
        node_hardware=frozen_array([k % len(hardware) for k in range(n)], np.int32),
        accelerators_free=frozen_array([4] * n, np.int32),
        accelerators_total=frozen_array([4] * n, np.int32),
        cpu_free=frozen_array([32.0] * n, np.float32),
        cpu_total=frozen_array([64.0] * n, np.float32),
        memory_free_gb=frozen_array([256.0] * n, np.float32),
        memory_total_gb=frozen_array([512.0] * n, np.float32),
        utilisation=frozen_array([0.0] * n, np.float32),
        queue_length=frozen_array([0] * n, np.int32),
        healthy=frozen_array([True] * n, np.bool_),
        draining=frozen_array([False] * n, np.bool_),
        zone=("z",) * n,
        locality=("rack-a", "rack-a", "rack-b", "rack-b"),
        labels=tuple(frozenset() for _ in range(n)),
        **devices,  # type: ignore[arg-type]
    )


def _options(groups: list[list[tuple[int, int]]]) -> PlacementOptions:
    """Options from lists of (node, accelerators taken)."""
    sizes = [len(g) for g in groups]
    return PlacementOptions(
        node_offsets=frozen_array(np.concatenate([[0], np.cumsum(sizes)]), np.int64),
        node_index=frozen_array([n for g in groups for n, _ in g], np.int32),
        accelerators=frozen_array([k for g in groups for _, k in g], np.int32),
        option_ids=tuple("" for _ in groups),
    )


def _workload(**changes: object) -> Workload:
    base = Workload("w", "train", "LM", 1.0, 4, 16.0, 1.0, 1.0, 1, 0, "t")
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


V100 = KNOWN_HARDWARE["V100"]


def test_unknown_kinds_are_other_and_known_kinds_one_hot() -> None:
    state, options = _cluster((V100,)), _options([[(0, 4)]])
    kinds = ("kind_train", "kind_finetune", "kind_infer", "kind_batch", "kind_other")
    for kind, hot in [
        ("train", "kind_train"),
        ("batch", "kind_batch"),
        ("serve", "kind_other"),
        ("TRAIN", "kind_other"),
    ]:
        x = DEFAULT_FEATURES(state, _workload(kind=kind), options)[0]
        assert [x[col(k)] for k in kinds] == [1.0 if k == hot else 0.0 for k in kinds], kind


def test_qos_classes_map_to_their_groups_and_unset_is_all_zero() -> None:
    state, options = _cluster((V100,)), _options([[(0, 4)]])
    groups = ("qos_latency_sensitive", "qos_best_effort", "qos_burstable", "qos_other")
    expected = {
        "": None,
        "LS": "qos_latency_sensitive",
        "Guaranteed": "qos_latency_sensitive",
        "BE": "qos_best_effort",
        "BestEffort": "qos_best_effort",
        "Burstable": "qos_burstable",
        "gold": "qos_other",
    }
    for qos, hot in expected.items():
        x = DEFAULT_FEATURES(state, _workload(qos_class=qos), options)[0]
        assert [x[col(g)] for g in groups] == [1.0 if g == hot else 0.0 for g in groups], qos


def test_unknown_capabilities_are_imputed_and_flagged() -> None:
    """A class with None numbers gets the documented median and its indicators, never NaN."""
    mystery = HardwareClass("mystery", None, None, 1000.0, None)
    state = _cluster((V100, mystery))
    options = _options([[(0, 4)], [(1, 4)], [(0, 2), (1, 2)]])
    x = DEFAULT_FEATURES(state, _workload(), options)
    assert np.isfinite(x).all()
    assert x[:, col("capability_unknown")].tolist() == [0.0, 1.0, 1.0]
    assert x[:, col("accel_memory_unknown")].tolist() == [0.0, 1.0, 1.0]
    imputed = IMPUTED_CAPABILITIES
    assert dict(imputed) == {
        "accelerator_memory_gb": 24.0,
        "peak_dense_tflops": 125.0,
        "memory_bandwidth_gbps": 900.0,
        "interconnect_gbps": 300.0,
    }
    np.testing.assert_allclose(x[1, col("accel_memory")], 24.0 / 80.0, rtol=1e-6)
    np.testing.assert_allclose(x[1, col("memory_bandwidth")], 1000.0 / 3350.0, rtol=1e-6)
    np.testing.assert_allclose(x[1, col("interconnect")], 300.0 / 900.0, rtol=1e-6)
    # a gang with the unknown member: min over V100 (16 GB) and the imputed 24 GB
    np.testing.assert_allclose(x[2, col("accel_memory")], 16.0 / 80.0, rtol=1e-6)
    assert x[1, col("known_hardware")] == 0.0


def test_share_requests_and_device_fit() -> None:
    """Per-device state: the best free share and memory headroom among compatible devices."""
    partition = HardwareClass("A100-80GB-3g.40gb", 40.0, 156.0, 1000.0, 0.0)
    a100 = KNOWN_HARDWARE["A100-80GB"]
    devices = {
        # node 0: two A100s 19% / 60% free; node 1: one partition wholly free;
        # nodes 2-3: no devices
        "device_offsets": frozen_array([0, 2, 3, 3, 3], np.int64),
        "device_hardware": frozen_array([0, 0, 1], np.int32),
        "device_free_share": frozen_array([0.19, 0.6, 1.0], np.float32),
        "device_free_memory_gb": frozen_array([10.0, 50.0, 40.0], np.float32),
    }
    state = _cluster((a100, partition), **devices)
    options = _options([[(0, 1)], [(1, 1)], [(2, 0)]])
    share = _workload(accelerators=0, accelerator_share=0.44, accelerator_memory_gb=20.0)
    x = DEFAULT_FEATURES(state, share, options)
    assert x[:, col("accelerator_share")].tolist() == pytest.approx([0.44] * 3)
    assert x[:, col("device_free_share")].tolist() == pytest.approx([0.6, 1.0, 0.0])
    headroom = x[:, col("device_memory_headroom")]
    assert headroom.tolist() == pytest.approx([(50 - 20) / 80, (40 - 20) / 80, -20 / 80])
    # the partition's class not allowed: node 1 has no compatible device
    only_a100 = dataclasses.replace(share, allowed_hardware=frozenset({"A100-80GB"}))
    x = DEFAULT_FEATURES(state, only_a100, options)
    assert x[1, col("device_free_share")] == 0.0
    # options naming the 19% device only see that one
    named = dataclasses.replace(
        options,
        device_offsets=frozen_array([0, 1, 2, 2], np.int64),
        device_index=frozen_array([0, 2], np.int32),
    )
    x = DEFAULT_FEATURES(state, share, named)
    assert x[0, col("device_free_share")] == pytest.approx(0.19)
    # whole-device jobs: derived devices (no per-device data), all free
    x = DEFAULT_FEATURES(_cluster((V100,)), _workload(), _options([[(0, 4)]]))
    assert x[0, col("accelerator_share")] == 0.0
    assert x[0, col("device_free_share")] == 1.0
    assert x[0, col("device_memory_headroom")] == pytest.approx((16 - 16) / 80)


def test_gang_shapes_4_22_1111_differ() -> None:
    """The options alone tell one node of 4, two nodes of 2 and four nodes of 1 apart."""
    state = _cluster((V100,))
    options = _options(
        [
            [(0, 4)],
            [(0, 2), (1, 2)],
            [(0, 1), (1, 1), (2, 1), (3, 1)],
            [(0, 3), (2, 1)],
        ]
    )
    x = DEFAULT_FEATURES(state, _workload(), options)
    shape = x[
        :, [col("n_nodes"), col("accelerators_per_node_min"), col("accelerators_per_node_max")]
    ]
    assert len({tuple(row) for row in shape.tolist()}) == 4
    assert x[:, col("accelerators_per_node_min")].tolist() == pytest.approx(
        np.log2(1.0 + np.array([4, 2, 1, 1])).tolist()
    )
    assert x[:, col("accelerators_per_node_max")].tolist() == pytest.approx(
        np.log2(1.0 + np.array([4, 2, 1, 3])).tolist()
    )
    assert x[:, col("localities_spanned")].tolist() == [0.0, 0.0, 1.0, 1.0]


def test_gang_shape_rows_4_22_1111_differ_and_locality_changes_them() -> None:
    """Whole rows of one request's `4`, `22` and `1111` options differ, and moving a gang
    across a locality boundary changes its row (localities spanned, interconnect class)
    while everything but the shape and the nodes' own numbers stays put.

    Nodes 0-1 are in rack-a, 2-3 in rack-b (`_cluster`), all alike.
    """
    state = _cluster((V100,))
    options = _options(
        [
            [(0, 4)],  # 4
            [(0, 2), (1, 2)],  # 22 in one locality
            [(0, 2), (2, 2)],  # 22 across localities
            [(0, 1), (1, 1), (2, 1), (3, 1)],  # 1111 (across)
        ]
    )
    x = DEFAULT_FEATURES(state, _workload(), options)
    assert len({tuple(row) for row in x.tolist()}) == 4
    assert x[:, col("interconnect_class")].tolist() == [0.0, 1.0, 2.0, 2.0]
    assert x[:, col("localities_spanned")].tolist() == [0.0, 0.0, 1.0, 1.0]
    one_rack, two_racks = x[1], x[2]
    changed = {FEATURE_NAMES[k] for k in np.flatnonzero(one_rack != two_racks)}
    assert changed == {"localities_spanned", "interconnect_class"}
    # the one-node option's link is its class's intra-node link (col `interconnect`)
    assert x[0, col("interconnect")] == pytest.approx(V100.interconnect_gbps / 900.0)


def test_interconnect_class_reads_only_the_request() -> None:
    """Same nodes, different locality labels: the class follows the labels; gang_size is
    not read (the options say the shape)."""
    options = _options([[(0, 1), (1, 1)]])
    same = _cluster((V100,))
    apart = dataclasses.replace(same, locality=("rack-a", "rack-b", "rack-b", "rack-b"))
    assert DEFAULT_FEATURES(same, _workload(), options)[0, col("interconnect_class")] == 1.0
    assert DEFAULT_FEATURES(apart, _workload(), options)[0, col("interconnect_class")] == 2.0
    for gang_size in (1, 2, 64):
        x = DEFAULT_FEATURES(same, _workload(gang_size=gang_size), options)
        assert x.tobytes() == DEFAULT_FEATURES(same, _workload(), options).tobytes()
