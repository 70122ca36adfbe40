"""Accelerator devices per node: sent by Runtime, or derived from node counts.

Contract v2 describes a node's accelerators as devices (CSR over nodes), each
with its class, its free share of compute and its free memory, so that a
shared GPU ("GPU 3 has 19% free") and a MIG-style partition (a device with its
own class) can be said. Senders without per-device data (every version-1
sender) keep the node-level shortcut, mapped onto devices by one rule, written
in docs/contract.md ("Devices") and implemented only here:

    node i has ``accelerators_total[i]`` devices of class ``node_hardware[i]``;
    the first ``accelerators_free[i]`` of them are wholly free (share 1, free
    memory = the class's accelerator memory, NaN when that is unknown), the
    others wholly taken (share 0, free memory 0).

Feasibility and features read devices only through `node_devices`, so both
forms are treated alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.contract.state import ClusterState


@dataclass(frozen=True, eq=False)
class Devices:
    """The devices of a snapshot, in CSR form over nodes.

    Attributes:
        offsets: int64 ``(n_nodes + 1,)``; node i owns devices ``offsets[i]:offsets[i+1]``.
        node: int64 ``(n_devices,)``, the node of each device.
        hardware: int32 ``(n_devices,)``, index into ``state.hardware``.
        free_share: float32 ``(n_devices,)`` in [0, 1].
        free_memory_gb: float32 ``(n_devices,)``; NaN = unknown (derived from a class
            whose memory is unknown).
        derived: True when built from node counts by the shortcut rule.
    """

    offsets: NDArray[np.int64]
    node: NDArray[np.int64]
    hardware: NDArray[np.int32]
    free_share: NDArray[np.float32]
    free_memory_gb: NDArray[np.float32]
    derived: bool

    @property
    def n_devices(self) -> int:
        """Number of devices in the snapshot."""
        return len(self.node)


def _class_memory(state: ClusterState) -> NDArray[np.float32]:
    """Per-class accelerator memory as float32, NaN where unknown."""
    return np.array(
        [
            np.nan if h.accelerator_memory_gb is None else h.accelerator_memory_gb
            for h in state.hardware
        ],
        dtype=np.float32,
    )


def node_devices(state: ClusterState) -> Devices:
    """The snapshot's devices: as sent, or derived from node counts by the shortcut rule."""
    if state.has_devices:
        offsets = np.asarray(state.device_offsets, dtype=np.int64)
        node = np.repeat(np.arange(state.n_nodes, dtype=np.int64), np.diff(offsets))
        return Devices(
            offsets=offsets,
            node=node,
            hardware=np.asarray(state.device_hardware, dtype=np.int32),
            free_share=np.asarray(state.device_free_share, dtype=np.float32),
            free_memory_gb=np.asarray(state.device_free_memory_gb, dtype=np.float32),
            derived=False,
        )
    total = np.maximum(np.asarray(state.accelerators_total, dtype=np.int64), 0)
    free = np.minimum(np.maximum(np.asarray(state.accelerators_free, dtype=np.int64), 0), total)
    offsets = np.zeros(state.n_nodes + 1, dtype=np.int64)
    np.cumsum(total, out=offsets[1:])
    node = np.repeat(np.arange(state.n_nodes, dtype=np.int64), total)
    rank = np.arange(len(node), dtype=np.int64) - offsets[:-1][node]
    wholly_free = rank < free[node]
    hardware = np.asarray(state.node_hardware, dtype=np.int32)[node]
    memory = _class_memory(state)[hardware] if len(node) else np.zeros(0, np.float32)
    return Devices(
        offsets=offsets,
        node=node,
        hardware=hardware,
        free_share=wholly_free.astype(np.float32),
        free_memory_gb=np.where(wholly_free, memory, np.float32(0.0)).astype(np.float32),
        derived=True,
    )
