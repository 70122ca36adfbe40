"""Cluster state: a columnar snapshot of the nodes Runtime can place on.

Columnar (one array per attribute, index = node) because that is how the wire
format carries it and how features are computed: vectorised over nodes and
options, never per node in Python.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from service.contract.csr import check_offsets
from service.contract.errors import InvalidInput
from service.contract.hardware import HardwareClass

_Scalar = TypeVar("_Scalar", bound=np.generic)
_INT32_MAX = int(np.iinfo(np.int32).max)


def _empty(dtype: type[_Scalar]) -> NDArray[_Scalar]:
    array: NDArray[_Scalar] = np.zeros(0, dtype=dtype)
    array.flags.writeable = False
    return array


EMPTY_I64 = _empty(np.int64)
EMPTY_I32 = _empty(np.int32)
EMPTY_F32 = _empty(np.float32)


def frozen_array(values: object, dtype: type[_Scalar]) -> NDArray[_Scalar]:
    """A read-only 1-D copy of `values`, so frozen dataclasses stay frozen.

    Called a dozen times per decoded request: one conversion, and a reshape only
    when the input is not already 1-D.
    """
    array: NDArray[_Scalar] = np.array(values, dtype=dtype, copy=True)
    if array.ndim != 1:
        array = array.reshape(-1)
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class ClusterState:
    """Nodes at the moment Runtime asked for a placement.

    All arrays have shape ``(n_nodes,)``. ``node_hardware[i]`` indexes
    ``hardware``, the classes present in this snapshot.

    Attributes:
        node_ids: unique node identifiers.
        hardware: hardware classes referenced by ``node_hardware``.
        node_hardware: int32 index into ``hardware`` per node.
        accelerators_free, accelerators_total: int32 accelerator counts.
        cpu_free, cpu_total: float32 host CPU cores.
        memory_free_gb, memory_total_gb: float32 host memory.
        utilisation: float32 accelerator utilisation in [0, 1].
        queue_length: int32 jobs queued on the node.
        healthy: bool, False when Runtime considers the node unhealthy.
        draining: bool, True when the node is cordoned for drain.
        zone: availability zone per node.
        locality: interconnect domain per node (rack / NVLink or IB island):
            nodes sharing it communicate fast.
        labels: ``"key=value"`` labels per node, for affinity rules.
        device_offsets: int64, shape ``(n_nodes + 1,)``, or empty: the node's
            accelerator devices in CSR form, node i owns devices
            ``device_offsets[i]:device_offsets[i + 1]`` of the ``device_*`` columns.
            Empty = the sender has no per-device data; `service.contract.devices`
            then derives devices from the node counts by the documented rule.
        device_hardware: int32 per device, index into ``hardware`` (a MIG-style
            partition is a device with its own class).
        device_free_share: float32 per device, free share of its compute in [0, 1]
            (1 = wholly free, 0 = wholly taken).
        device_free_memory_gb: float32 per device, free device memory, GB.
        device_ids: Runtime's id per device (e.g. ``"gpu3"``); empty or one per device.
    """

    node_ids: tuple[str, ...]
    hardware: tuple[HardwareClass, ...]
    node_hardware: NDArray[np.int32]
    accelerators_free: NDArray[np.int32]
    accelerators_total: NDArray[np.int32]
    cpu_free: NDArray[np.float32]
    cpu_total: NDArray[np.float32]
    memory_free_gb: NDArray[np.float32]
    memory_total_gb: NDArray[np.float32]
    utilisation: NDArray[np.float32]
    queue_length: NDArray[np.int32]
    healthy: NDArray[np.bool_]
    draining: NDArray[np.bool_]
    zone: tuple[str, ...]
    locality: tuple[str, ...]
    labels: tuple[frozenset[str], ...]
    device_offsets: NDArray[np.int64] = dataclasses.field(default_factory=lambda: EMPTY_I64)
    device_hardware: NDArray[np.int32] = dataclasses.field(default_factory=lambda: EMPTY_I32)
    device_free_share: NDArray[np.float32] = dataclasses.field(default_factory=lambda: EMPTY_F32)
    device_free_memory_gb: NDArray[np.float32] = dataclasses.field(
        default_factory=lambda: EMPTY_F32
    )
    device_ids: tuple[str, ...] = ()

    @property
    def has_devices(self) -> bool:
        """Whether the sender gave per-device data (else devices are derived from node counts)."""
        return len(self.device_offsets) > 0

    @property
    def n_nodes(self) -> int:
        """Number of nodes in the snapshot."""
        return len(self.node_ids)

    def hardware_of(self, node: int) -> HardwareClass:
        """The hardware class of node index `node`."""
        return self.hardware[int(self.node_hardware[node])]


@functools.lru_cache(maxsize=16)
def _one_each(n_nodes: int) -> list[int]:
    """Label offsets ``[0, 1, ..., n_nodes]`` (one label per node); never mutated."""
    return list(range(n_nodes + 1))


def labels_from_csr(
    offsets: Sequence[int], labels: Sequence[str], n_nodes: int
) -> tuple[frozenset[str], ...]:
    """Per-node label sets from the wire's CSR form (node i owns labels[o[i]:o[i+1]])."""
    if not offsets:
        if labels:
            raise InvalidInput("state.label_offsets", "must be set when labels are given")
        empty: frozenset[str] = frozenset()
        return (empty,) * n_nodes
    # Plain lists first: slicing and indexing a protobuf repeated field costs far more.
    bounds, values = list(offsets), list(labels)
    if len(values) == n_nodes and bounds == _one_each(n_nodes):
        # The common shape, every node exactly one label: no per-node loop, one
        # frozenset per distinct label (what the general path below builds too).
        alone = {value: frozenset((value,)) for value in set(values)}
        return tuple(map(alone.__getitem__, values))
    if len(bounds) != n_nodes + 1 or bounds[0] != 0 or bounds[-1] != len(values):
        raise InvalidInput(
            "state.label_offsets",
            f"must have n_nodes + 1 ({n_nodes + 1}) entries from 0 to len(labels)",
        )
    if any(b < a for a, b in itertools.pairwise(bounds)):
        raise InvalidInput("state.label_offsets", "must be non-decreasing")
    # Nodes mostly carry one label, shared by many: one frozenset per distinct label.
    single: dict[str, frozenset[str]] = {}
    out: list[frozenset[str]] = []
    for a, b in itertools.pairwise(bounds):
        if b - a == 1:
            value = values[a]
            one = single.get(value)
            if one is None:
                one = single[value] = frozenset((value,))
            out.append(one)
        else:
            out.append(frozenset(values[a:b]))
    return tuple(out)


def node_hardware_array(
    values: Sequence[int], n_hardware: int, field: str = "state.node_hardware"
) -> NDArray[np.int32]:
    """A hardware index column (`field`) as int32; an index beyond int32 is refused, not wrapped."""
    wide = np.asarray(values, dtype=np.int64)
    if wide.ndim != 1:
        wide = wide.reshape(-1)
    if len(wide) and np.maximum.reduce(wide) > _INT32_MAX:
        bad = np.flatnonzero(wide > _INT32_MAX)
        raise InvalidInput(
            f"{field}[{bad[0]}]",
            f"must index state.hardware (< {n_hardware}), got {wide[bad[0]]}",
        )
    narrow = wide.astype(np.int32)
    narrow.flags.writeable = False
    return narrow


def hardware_from_columns(src: Any) -> tuple[HardwareClass, ...]:
    """Hardware classes as the object carries them: a None capability is unknown.

    The HTTP forms carry None for an unknown (absent or null) number; the protobuf
    form needs its presence bits and the schema version (service.wire.convert).
    """
    return tuple(
        HardwareClass(
            h.name,
            h.accelerator_memory_gb,
            h.peak_dense_tflops,
            h.memory_bandwidth_gbps,
            h.interconnect_gbps,
        )
        for h in src.hardware
    )


DEVICE_COLUMNS = "the state.device_* columns"
"""How refusals name the per-device columns that state.device_offsets indexes."""


def check_device_layout(
    offsets: NDArray[np.int64], n_nodes: int, n_devices: int, n_shares: int
) -> None:
    """The device CSR over nodes and the share column's length: what deriving node counts
    needs, checked the same way by the validator (one message whichever finds it)."""
    check_offsets("state.device_offsets", offsets, n_nodes, n_devices, DEVICE_COLUMNS, "n_nodes")
    if n_shares != n_devices:
        raise InvalidInput(
            "state.device_free_share",
            f"must have one value per device ({n_devices}), got {n_shares}",
        )


def _node_counts(
    offsets: NDArray[np.int64], free_share: NDArray[np.float32], n_nodes: int, n_devices: int
) -> tuple[NDArray[np.int32], NDArray[np.int32]]:
    """(wholly free, total) devices per node: what the node columns say when left empty.

    Wholly free = free share >= 1, the same test feasibility uses for whole devices.
    """
    check_device_layout(offsets, n_nodes, n_devices, len(free_share))
    counts = offsets[1:] - offsets[:-1]
    node = np.repeat(np.arange(n_nodes, dtype=np.int64), counts)
    free = np.bincount(node, weights=free_share >= 1.0, minlength=n_nodes)
    return frozen_array(free, np.int32), frozen_array(counts, np.int32)


def state_from_columns(src: Any, hardware: tuple[HardwareClass, ...] | None = None) -> ClusterState:
    """A `ClusterState` from any object with the wire's columnar field names.

    Both wire forms — the protobuf message and the HTTP JSON model — carry the
    same attribute names (docs/contract.md), so one function builds the state
    from either; column lengths and values are checked by the validator.

    Args:
        src: the wire object.
        hardware: the decoded hardware classes, when the caller had to decode
            them itself (protobuf presence bits); default: read from `src`.

    With devices (``device_offsets`` non-empty), ``accelerators_free`` and
    ``accelerators_total`` may be left empty: they are derived from the devices
    (total = the node's devices, free = its wholly free ones); when sent, the
    validator checks that they agree.
    """
    n_nodes = len(src.node_ids)
    hardware = hardware_from_columns(src) if hardware is None else hardware
    accelerators_free = frozen_array(src.accelerators_free, np.int32)
    accelerators_total = frozen_array(src.accelerators_total, np.int32)
    devices: dict[str, Any] = {}
    if len(src.device_offsets):
        offsets = frozen_array(src.device_offsets, np.int64)
        share = frozen_array(src.device_free_share, np.float32)
        if not len(accelerators_free) or not len(accelerators_total):
            free, total = _node_counts(offsets, share, n_nodes, len(src.device_hardware))
            accelerators_free = accelerators_free if len(accelerators_free) else free
            accelerators_total = accelerators_total if len(accelerators_total) else total
        devices = {
            "device_offsets": offsets,
            "device_hardware": node_hardware_array(
                src.device_hardware, len(hardware), "state.device_hardware"
            ),
            "device_free_share": share,
            "device_free_memory_gb": frozen_array(src.device_free_memory_gb, np.float32),
            "device_ids": tuple(src.device_ids),
        }
    elif any(
        len(getattr(src, name))
        for name in ("device_hardware", "device_free_share", "device_free_memory_gb", "device_ids")
    ):
        raise InvalidInput("state.device_offsets", "must be set when device columns are given")
    return ClusterState(
        node_ids=tuple(src.node_ids),
        hardware=hardware,
        node_hardware=node_hardware_array(src.node_hardware, len(hardware)),
        accelerators_free=accelerators_free,
        accelerators_total=accelerators_total,
        cpu_free=frozen_array(src.cpu_free, np.float32),
        cpu_total=frozen_array(src.cpu_total, np.float32),
        memory_free_gb=frozen_array(src.memory_free_gb, np.float32),
        memory_total_gb=frozen_array(src.memory_total_gb, np.float32),
        utilisation=frozen_array(src.utilisation, np.float32),
        queue_length=frozen_array(src.queue_length, np.int32),
        healthy=frozen_array(src.healthy, np.bool_),
        draining=frozen_array(src.draining, np.bool_),
        zone=tuple(src.zone),
        locality=tuple(src.locality),
        labels=labels_from_csr(src.label_offsets, src.labels, n_nodes),
        **devices,
    )
