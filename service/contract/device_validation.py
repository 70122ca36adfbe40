"""Validation of the contract-v2 device columns and of the devices options name.

Kept apart from `service.contract.validation` because only requests that send
devices pay for it: a request without devices skips this module entirely, so
the per-node fast path (`_columns_clean`) stays what every other request costs.

Rules (docs/contract.md, "Devices" and "Bad input for every new field"):

- ``state.device_offsets``: n_nodes + 1 entries, from 0, non-decreasing, ending
  at the device count (``len(state.device_hardware)``); every other device
  column has one value per device, ``device_ids`` may be empty.
- ``device_hardware`` indexes ``state.hardware``, and the class is an
  accelerator class (a stated accelerator memory of 0 is a CPU pool).
- ``device_free_share`` finite in [0, 1]; ``device_free_memory_gb`` finite,
  >= 0 and at most the class's accelerator memory when that is known.
- The node columns agree with the devices: ``accelerators_total[i]`` = node i's
  devices, ``accelerators_free[i]`` = its wholly free ones (share >= 1).
- Named devices (``options.device_offsets`` / ``device_index``): a CSR over
  option entries, each index a device of the state, on its entry's node; they
  need devices in the state.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from service.contract.csr import check_offsets
from service.contract.errors import InvalidInput
from service.contract.request import MirrorRequest
from service.contract.state import ClusterState, check_device_layout
from service.contract.text import check_text

_DERIVE = "or leave it empty to derive it from the devices"
UNKNOWN_MEMORY_HINT = "leave it unset if unknown"


def _first(mask: NDArray[np.bool_]) -> int | None:
    bad = np.flatnonzero(mask)
    return int(bad[0]) if len(bad) else None


def class_memory(s: ClusterState) -> NDArray[np.float64]:
    """Accelerator memory per class as float64, NaN where unknown."""
    return np.array(
        [
            np.nan if h.accelerator_memory_gb is None else h.accelerator_memory_gb
            for h in s.hardware
        ],
        dtype=np.float64,
    )


def check_devices(s: ClusterState, n: int, max_id_length: int) -> None:
    """Raise `InvalidInput` naming the first device field that breaks a rule (module docstring)."""
    n_devices = len(s.device_hardware)
    check_device_layout(s.device_offsets, n, n_devices, len(s.device_free_share))
    if len(s.device_free_memory_gb) != n_devices:
        raise InvalidInput(
            "state.device_free_memory_gb",
            f"must have one value per device ({n_devices}), got {len(s.device_free_memory_gb)}",
        )
    if len(s.device_ids) not in (0, n_devices):
        raise InvalidInput("state.device_ids", f"must be empty or one per device ({n_devices})")
    hw = s.device_hardware
    bad = _first((hw < 0) | (hw >= len(s.hardware)))
    if bad is not None:
        raise InvalidInput(
            f"state.device_hardware[{bad}]",
            f"must index state.hardware (< {len(s.hardware)}), got {hw[bad]}",
        )
    share = s.device_free_share
    bad = _first(~(np.isfinite(share) & (share >= 0.0) & (share <= 1.0)))
    if bad is not None:
        raise InvalidInput(
            f"state.device_free_share[{bad}]", f"must be finite and in [0, 1], got {share[bad]}"
        )
    memory = s.device_free_memory_gb
    bad = _first(~(np.isfinite(memory) & (memory >= 0.0)))
    if bad is not None:
        raise InvalidInput(
            f"state.device_free_memory_gb[{bad}]", f"must be finite and >= 0, got {memory[bad]}"
        )
    capacity = class_memory(s)[hw]
    bad = _first(capacity == 0.0)
    if bad is not None:
        raise InvalidInput(
            f"state.hardware[{hw[bad]}].accelerator_memory_gb",
            f"is 0 (a CPU pool) but device {bad} is of this class: give the device memory, "
            f"or {UNKNOWN_MEMORY_HINT}",
        )
    bad = _first(memory > capacity)  # NaN (unknown) compares False: no bound
    if bad is not None:
        raise InvalidInput(
            f"state.device_free_memory_gb[{bad}]",
            f"must be <= state.hardware[{hw[bad]}].accelerator_memory_gb "
            f"({capacity[bad]:g}), got {memory[bad]:g}",
        )
    _check_node_counts(s, n)
    for i, device_id in enumerate(s.device_ids):
        if len(device_id) > max_id_length:
            raise InvalidInput(
                f"state.device_ids[{i}]", f"must be at most {max_id_length} characters"
            )
        check_text(f"state.device_ids[{i}]", device_id)


def _check_node_counts(s: ClusterState, n: int) -> None:
    offsets = s.device_offsets
    counts = offsets[1:] - offsets[:-1]
    bad = _first(s.accelerators_total != counts)
    if bad is not None:
        raise InvalidInput(
            f"state.accelerators_total[{bad}]",
            f"must equal node {bad}'s devices in state.device_offsets ({counts[bad]}), "
            f"got {s.accelerators_total[bad]} ({_DERIVE})",
        )
    node = np.repeat(np.arange(n, dtype=np.int64), counts)
    free = np.bincount(node, weights=s.device_free_share >= 1.0, minlength=n).astype(np.int64)
    bad = _first(s.accelerators_free != free)
    if bad is not None:
        raise InvalidInput(
            f"state.accelerators_free[{bad}]",
            f"must equal node {bad}'s wholly free devices (state.device_free_share >= 1: "
            f"{free[bad]}), got {s.accelerators_free[bad]} ({_DERIVE})",
        )


def check_accelerator_classes(s: ClusterState) -> None:
    """A class stated to have no accelerator memory (a CPU pool) on a node with accelerators
    is refused: zero would silently make the GPUs unusable (issue 22)."""
    zero = [h.accelerator_memory_gb == 0 for h in s.hardware]
    if not any(zero):
        return
    # one lookup per node (np.isin costs ~100 us here; this ~3 us): validated indices
    used = np.array(zero)[s.node_hardware] & (s.accelerators_total > 0)
    if not np.logical_or.reduce(used):
        return
    bad = _first(used)
    if bad is not None:
        h = int(s.node_hardware[bad])
        raise InvalidInput(
            f"state.hardware[{h}].accelerator_memory_gb",
            f"is 0 (a CPU pool) but node {bad} of this class has "
            f"{s.accelerators_total[bad]} accelerators: give the accelerator memory, "
            f"or {UNKNOWN_MEMORY_HINT}",
        )


def check_named_devices(request: MirrorRequest) -> None:
    """Raise `InvalidInput` unless the devices the options name are a CSR over entries, each
    a device of the state on its entry's node."""
    o, s = request.options, request.state
    if not o.names_devices:
        if len(o.device_index):
            raise InvalidInput("options.device_offsets", "must be set when device_index is given")
        return
    if not s.has_devices:
        raise InvalidInput(
            "options.device_offsets",
            "names devices, so the state must send them (state.device_offsets is empty)",
        )
    n_entries = len(o.node_index)
    check_offsets(
        "options.device_offsets",
        o.device_offsets,
        n_entries,
        len(o.device_index),
        "options.device_index",
        "n_entries",
    )
    n_devices = len(s.device_hardware)
    index = o.device_index
    bad = _first((index < 0) | (index >= n_devices))
    if bad is not None:
        raise InvalidInput(
            f"options.device_index[{bad}]",
            f"must index the state's devices (< {n_devices}), got {index[bad]}",
        )
    device_node = np.repeat(
        np.arange(s.n_nodes, dtype=np.int64), s.device_offsets[1:] - s.device_offsets[:-1]
    )
    entry = np.repeat(np.arange(n_entries, dtype=np.int64), np.diff(o.device_offsets))
    wanted = o.node_index[entry]
    bad = _first(device_node[index] != wanted)
    if bad is not None:
        raise InvalidInput(
            f"options.device_index[{bad}]",
            f"device {index[bad]} is on node {device_node[index[bad]]}, not on its entry's "
            f"node {wanted[bad]} (options.node_index[{entry[bad]}])",
        )
