"""The decode and validation rules as they were before the fast path (commit 16b4252).

Kept as an oracle for `test_state_decode_equivalence`: what it computes is the
previous implementation's, line for line where the rules live (the state and
options rules, the label and hardware-index decoding); the pieces that did not
change (workload, production, id and time checks) are called from the service.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from service.contract import (
    ClusterState,
    HardwareClass,
    InvalidInput,
    MirrorRequest,
    PlacementOptions,
    ProductionDecision,
    RequestLimits,
    UnsupportedSchemaVersion,
)
from service.contract.request import SUPPORTED_SCHEMA_VERSIONS
from service.contract.validation import (
    _check_id,
    _check_production,
    _check_time,
    validate_request,
    validate_workload,
)
from service.wire.convert import mirror_request_from_pb, workload_from_pb
from service.wire.understudy.v1 import contract_pb2

Proto = contract_pb2.MirrorRequest

# --------------------------------------------------------------------------- oracle
# The decode and validation rules as they were before the fast path (commit 16b4252).


def _ref_frozen(values: object, dtype: Any) -> Any:
    array = np.array(values, dtype=dtype, copy=True).reshape(-1)
    array.flags.writeable = False
    return array


def _ref_labels(offsets: Sequence[int], labels: Sequence[str], n_nodes: int) -> Any:
    if not offsets:
        if labels:
            raise InvalidInput("state.label_offsets", "must be set when labels are given")
        return (frozenset(),) * n_nodes
    bounds, values = list(offsets), list(labels)
    if len(bounds) != n_nodes + 1 or bounds[0] != 0 or bounds[-1] != len(values):
        raise InvalidInput(
            "state.label_offsets",
            f"must have n_nodes + 1 ({n_nodes + 1}) entries from 0 to len(labels)",
        )
    if any(b < a for a, b in itertools.pairwise(bounds)):
        raise InvalidInput("state.label_offsets", "must be non-decreasing")
    return tuple(frozenset(values[a:b]) for a, b in itertools.pairwise(bounds))


def _ref_node_hardware(values: Sequence[int], n_hardware: int) -> Any:
    wide = np.asarray(values, dtype=np.int64).reshape(-1)
    if len(wide) and wide.max() > np.iinfo(np.int32).max:
        bad = np.flatnonzero(wide > np.iinfo(np.int32).max)
        raise InvalidInput(
            f"state.node_hardware[{bad[0]}]",
            f"must index state.hardware (< {n_hardware}), got {wide[bad[0]]}",
        )
    narrow = wide.astype(np.int32)
    narrow.flags.writeable = False
    return narrow


def ref_state(src: Any) -> ClusterState:
    return ClusterState(
        node_ids=tuple(src.node_ids),
        hardware=tuple(
            HardwareClass(
                h.name,
                h.accelerator_memory_gb,
                h.peak_dense_tflops,
                h.memory_bandwidth_gbps,
                h.interconnect_gbps,
            )
            for h in src.hardware
        ),
        node_hardware=_ref_node_hardware(src.node_hardware, len(src.hardware)),
        accelerators_free=_ref_frozen(src.accelerators_free, np.int32),
        accelerators_total=_ref_frozen(src.accelerators_total, np.int32),
        cpu_free=_ref_frozen(src.cpu_free, np.float32),
        cpu_total=_ref_frozen(src.cpu_total, np.float32),
        memory_free_gb=_ref_frozen(src.memory_free_gb, np.float32),
        memory_total_gb=_ref_frozen(src.memory_total_gb, np.float32),
        utilisation=_ref_frozen(src.utilisation, np.float32),
        queue_length=_ref_frozen(src.queue_length, np.int32),
        healthy=_ref_frozen(src.healthy, np.bool_),
        draining=_ref_frozen(src.draining, np.bool_),
        zone=tuple(src.zone),
        locality=tuple(src.locality),
        labels=_ref_labels(src.label_offsets, src.labels, len(src.node_ids)),
    )


def _ref_first_bad(mask: Any) -> int | None:
    bad = np.flatnonzero(mask)
    return int(bad[0]) if len(bad) else None


def _ref_column(field: str, values: Any, n: int, minimum: float | None = 0.0) -> None:
    if len(values) != n:
        raise InvalidInput(field, f"must have one value per node ({n}), got {len(values)}")
    if values.dtype.kind == "f":
        bad = _ref_first_bad(~np.isfinite(values))
        if bad is not None:
            raise InvalidInput(f"{field}[{bad}]", f"must be finite, got {values[bad]}")
    if minimum is not None:
        bad = _ref_first_bad(values < minimum)
        if bad is not None:
            raise InvalidInput(f"{field}[{bad}]", f"must be >= {minimum:g}, got {values[bad]}")


def _ref_validate_state(request: MirrorRequest, limits: RequestLimits) -> None:
    s = request.state
    n = s.n_nodes
    if n == 0:
        raise InvalidInput("state.node_ids", "must list at least one node")
    if n > limits.max_nodes:
        raise InvalidInput("state.node_ids", f"must list at most {limits.max_nodes} nodes, got {n}")
    if len(set(s.node_ids)) != n:
        seen: set[str] = set()
        for i, node_id in enumerate(s.node_ids):
            if node_id in seen:
                raise InvalidInput(f"state.node_ids[{i}]", f"duplicates node id {node_id!r}")
            seen.add(node_id)
    for i, node_id in enumerate(s.node_ids):
        if not node_id:
            raise InvalidInput(f"state.node_ids[{i}]", "must be a non-empty string")
    if not s.hardware:
        raise InvalidInput("state.hardware", "must describe at least one hardware class")
    for i, hw in enumerate(s.hardware):
        hw.validate(f"state.hardware[{i}]")
        for name in (
            "accelerator_memory_gb",
            "peak_dense_tflops",
            "memory_bandwidth_gbps",
            "interconnect_gbps",
        ):
            value = getattr(hw, name)
            if value > 1e12:
                raise InvalidInput(
                    f"state.hardware[{i}].{name}", f"must be at most {1e12:g}, got {value}"
                )
    _ref_column("state.node_hardware", s.node_hardware, n)
    bad = _ref_first_bad(s.node_hardware >= len(s.hardware))
    if bad is not None:
        raise InvalidInput(
            f"state.node_hardware[{bad}]",
            f"must index state.hardware (< {len(s.hardware)}), got {s.node_hardware[bad]}",
        )
    for name in ("accelerators_free", "accelerators_total", "cpu_free", "cpu_total"):
        _ref_column(f"state.{name}", getattr(s, name), n)
    for name in ("memory_free_gb", "memory_total_gb", "queue_length"):
        _ref_column(f"state.{name}", getattr(s, name), n)
    _ref_column("state.utilisation", s.utilisation, n)
    bad = _ref_first_bad(s.utilisation > 1.0)
    if bad is not None:
        raise InvalidInput(f"state.utilisation[{bad}]", f"must be <= 1, got {s.utilisation[bad]}")
    for free, total in (
        ("accelerators_free", "accelerators_total"),
        ("cpu_free", "cpu_total"),
        ("memory_free_gb", "memory_total_gb"),
    ):
        bad = _ref_first_bad(getattr(s, free) > getattr(s, total))
        if bad is not None:
            raise InvalidInput(f"state.{free}[{bad}]", f"must be <= state.{total}[{bad}]")
    for name in ("healthy", "draining"):
        _ref_column(f"state.{name}", getattr(s, name), n, minimum=None)
    for name in ("zone", "locality", "labels"):
        if len(getattr(s, name)) != n:
            raise InvalidInput(f"state.{name}", f"must have one entry per node ({n})")
    # contract v2 (issue 22): at most max_devices devices (the node shortcut makes one
    # entry per accelerator)
    total = int(sum(int(t) for t in s.accelerators_total))
    if total > limits.max_devices:
        raise InvalidInput(
            "state.accelerators_total",
            f"must sum to at most {limits.max_devices} devices in one snapshot, got {total}",
        )
    # contract v2 (issue 22): a class stated to have no accelerator memory on a node
    # with accelerators is refused (it silently turned GPUs into a CPU pool)
    for i in range(n):
        h = int(s.node_hardware[i])
        if s.hardware[h].accelerator_memory_gb == 0 and s.accelerators_total[i] > 0:
            raise InvalidInput(
                f"state.hardware[{h}].accelerator_memory_gb",
                f"is 0 (a CPU pool) but node {i} of this class has "
                f"{s.accelerators_total[i]} accelerators: give the accelerator memory, "
                "or leave it unset if unknown",
            )


def _ref_validate_options(request: MirrorRequest, limits: RequestLimits) -> None:
    o = request.options
    n_options = o.n_options
    if n_options < 1:
        raise InvalidInput("options", "must list at least one placement option")
    if n_options > limits.max_options:
        raise InvalidInput("options", f"must list at most {limits.max_options}, got {n_options}")
    if o.node_offsets[0] != 0 or o.node_offsets[-1] != len(o.node_index):
        raise InvalidInput("options.node_offsets", "must start at 0 and end at len(node_index)")
    sizes = np.diff(o.node_offsets)
    bad = _ref_first_bad(sizes < 1)
    if bad is not None:
        raise InvalidInput(f"options[{bad}]", "must place on at least one node")
    bad = _ref_first_bad(sizes > limits.max_nodes_per_option)
    if bad is not None:
        raise InvalidInput(
            f"options[{bad}]", f"spans more than {limits.max_nodes_per_option} nodes"
        )
    gang = request.workload.gang_size  # issue 23: the most nodes one option may span (v2)
    bad = _ref_first_bad(sizes > gang) if request.schema_version != 1 else None
    if bad is not None:
        raise InvalidInput(
            f"options[{bad}]",
            f"spans {int(sizes[bad])} nodes, more than `workload.gang_size` ({gang}), "
            "the most nodes one option of the job may span",
        )
    if len(o.accelerators) != len(o.node_index):
        raise InvalidInput("options.accelerators", "must have one count per node entry")
    bad = _ref_first_bad((o.node_index < 0) | (o.node_index >= request.state.n_nodes))
    if bad is not None:
        raise InvalidInput(
            f"options.node_index[{bad}]",
            f"must index state nodes (< {request.state.n_nodes}), got {o.node_index[bad]}",
        )
    bad = _ref_first_bad(o.accelerators < 0)
    if bad is not None:
        raise InvalidInput(
            f"options.accelerators[{bad}]", f"must be >= 0, got {o.accelerators[bad]}"
        )


def _ref_validate(request: MirrorRequest, limits: RequestLimits) -> None:
    """`validate_request` as it was; the helpers it calls from the module are unchanged."""
    if request.schema_version not in SUPPORTED_SCHEMA_VERSIONS:
        raise UnsupportedSchemaVersion(
            "schema_version",
            f"must be one of {sorted(SUPPORTED_SCHEMA_VERSIONS)}, got {request.schema_version}",
        )
    _check_id("request_id", request.request_id, limits)
    _check_time("request_time", request.request_time)
    _ref_validate_state(request, limits)
    validate_workload(request)
    _ref_validate_options(request, limits)
    n_options = request.options.n_options
    if len(request.options.option_ids) not in (0, n_options):
        raise InvalidInput("options.option_ids", f"must be empty or one per option ({n_options})")
    if request.production is not None:
        _check_production("production", request.production, n_options)
    q = request.quota_remaining
    if q is not None and not (math.isfinite(q) and q >= 0):
        raise InvalidInput("quota_remaining", f"must be finite and >= 0, got {q}")


def _ref_decode(msg: Proto) -> MirrorRequest:
    """`mirror_request_from_pb` as it was (workload and production converters unchanged)."""
    for part in ("state", "workload", "options"):
        if not msg.HasField(part):
            raise InvalidInput(part, "is required")
    state = ref_state(msg.state)
    workload = workload_from_pb(msg.workload)
    offsets = _ref_frozen(msg.options.node_offsets, np.int64)
    if len(offsets) == 0:
        raise InvalidInput("options", "must list at least one placement option")
    options = PlacementOptions(
        node_offsets=offsets,
        node_index=_ref_frozen(msg.options.node_index, np.int32),
        accelerators=_ref_frozen(msg.options.accelerators, np.int32),
        option_ids=tuple(msg.options.option_ids),
    )
    p = msg.production
    return MirrorRequest(
        schema_version=msg.schema_version,
        request_id=msg.request_id,
        request_time=msg.request_time,
        state=state,
        workload=workload,
        options=options,
        production=(
            ProductionDecision(p.option, p.propensity if p.HasField("propensity") else None)
            if msg.HasField("production")
            else None
        ),
        quota_remaining=msg.quota_remaining if msg.HasField("quota_remaining") else None,
    )


def reference(msg: Proto, limits: RequestLimits) -> Any:
    try:
        request = _ref_decode(msg)
        _ref_validate(request, limits)
    except InvalidInput as exc:
        return _refusal(exc)
    return request


def _refusal(exc: InvalidInput) -> tuple[str, str, str]:
    return (type(exc).__name__, exc.field, str(exc))


def current(msg: Proto, limits: RequestLimits) -> Any:
    try:
        request = mirror_request_from_pb(msg)
        validate_request(request, limits)
    except InvalidInput as exc:
        return _refusal(exc)
    return request


# --------------------------------------------------------------------------- comparison

_STATE_ARRAYS = (
    "node_hardware",
    "accelerators_free",
    "accelerators_total",
    "cpu_free",
    "cpu_total",
    "memory_free_gb",
    "memory_total_gb",
    "utilisation",
    "queue_length",
    "healthy",
    "draining",
)


def _same_array(name: str, got: Any, want: Any) -> None:
    assert isinstance(got, np.ndarray), name
    assert got.dtype == want.dtype, name
    assert got.shape == want.shape, name
    assert got.tobytes() == want.tobytes(), name
    assert not got.flags.writeable, f"{name} must be read-only"


def assert_same_state(got: ClusterState, want: ClusterState) -> None:
    for name in _STATE_ARRAYS:
        _same_array(f"state.{name}", getattr(got, name), getattr(want, name))
    for name in ("node_ids", "hardware", "zone", "locality", "labels"):
        value = getattr(got, name)
        assert type(value) is tuple, name
        assert value == getattr(want, name), name
    assert all(type(labels) is frozenset for labels in got.labels)


def assert_same_request(got: Any, want: Any) -> None:
    if isinstance(want, tuple):
        assert got == want
        return
    assert isinstance(got, MirrorRequest), f"accepted now, refused before with {want}"
    assert_same_state(got.state, want.state)
    for name in ("node_offsets", "node_index", "accelerators"):
        _same_array(f"options.{name}", getattr(got.options, name), getattr(want.options, name))
    assert got.options.option_ids == want.options.option_ids
    for name in ("schema_version", "request_id", "request_time", "workload", "production"):
        assert getattr(got, name) == getattr(want, name), name
    assert got.quota_remaining == want.quota_remaining
