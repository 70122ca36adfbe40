"""Snapshot rules: `_check_state` and `_check_columns` per cluster state.

Node count bounds, unique non-empty node ids, hardware classes, the per-node
number columns (finite, >= 0, free <= total, indexes in range) and CPU pools
used by nodes with accelerators. The states of a batch are sent once each, so a
fault here refuses every request that uses the snapshot, with one field and
message. Vectorised over all nodes of all snapshots at once; the loop over
hardware classes is over a handful of `HardwareClass` objects per snapshot.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.contract.batch.validation.arrays import _segment_first
from service.contract.batch.validation.devices import _DeviceRules
from service.contract.batch.validation.utf8 import _Text
from service.contract.device_validation import UNKNOWN_MEMORY_HINT
from service.contract.hardware import CAPABILITIES, HardwareClass
from service.contract.validation import MAX_QUANTITY


class _SnapshotRules(_DeviceRules):
    """`_check_state` and `_check_columns`, per snapshot (devices: `_DeviceRules`)."""

    def state(self) -> None:
        st, v, limits = self.st, self.v, self.limits
        n = self.n_nodes
        v.snapshot(n == 0, lambda s: ("state.node_ids", "must list at least one node"))
        v.snapshot(
            n > limits.max_nodes,
            lambda s: (
                "state.node_ids",
                f"must list at most {limits.max_nodes} nodes, got {int(n[s])}",
            ),
        )
        ids = _Text(st.node_ids)
        self.node_ids = ids
        self.duplicates(ids)
        self.node_rule(
            ids.empty, lambda i, g: (f"state.node_ids[{i}]", "must be a non-empty string")
        )
        v.snapshot(
            self.n_hw == 0,
            lambda s: ("state.hardware", "must describe at least one hardware class"),
        )
        self.hardware()
        self.columns()
        self.device_count()
        if self.sent.any():
            self.devices()
        self.accelerator_classes()

    def duplicates(self, ids: _Text) -> None:
        """Node ids unique within a snapshot: sort (snapshot, length, hash, node) and look
        at neighbours; equal neighbours are compared byte for byte, so a hash collision
        never refuses a request."""
        if self.st.n_nodes < 2:
            return
        h = ids.hashes()
        order = np.lexsort((np.arange(len(h)), h, ids.nbytes, self.node_state))
        same = np.zeros(len(h), np.bool_)
        hs, ls, ss = h[order], ids.nbytes[order], self.node_state[order]
        same[order[1:]] = (hs[1:] == hs[:-1]) & (ls[1:] == ls[:-1]) & (ss[1:] == ss[:-1])
        if not same.any():
            return
        prev = np.empty(len(h), np.int64)
        prev[order[1:]] = order[:-1]
        raw = ids.s.utf8
        o = ids.offsets
        # a loop over duplicated ids only (each refuses its snapshot's requests)
        for i in np.flatnonzero(same).tolist():
            j = int(prev[i])
            if raw[o[i] : o[i + 1]] != raw[o[j] : o[j + 1]]:
                same[i] = False  # a collision: equal hashes, different ids
                collided = True
                break
        else:
            collided = False
        if collided:  # an adversarial collision: exact (slow) search, by Python set
            same[:] = False
            for s in range(self.n_states):
                a, b = int(self.node_off[s]), int(self.node_off[s + 1])
                seen: set[str] = set()
                for k, value in enumerate(ids.s.values(a, b)):
                    if value in seen:
                        same[a + k] = True
                    seen.add(value)
        self.node_rule(
            same, lambda i, g: (f"state.node_ids[{i}]", f"duplicates node id {ids.value(g)!r}")
        )

    def hardware(self) -> None:
        """`HardwareClass.validate` and the quantity bound, class by class in order."""
        st = self.st
        if not st.hardware:
            return
        # one row per class: the first failing check's text, or None (a loop over classes)
        found = [_hardware_problem(h) for h in st.hardware]
        bad = np.array([f is not None for f in found], dtype=np.bool_)
        if not bad.any():
            return
        has, first = _segment_first(bad, self.hw_off, self.n_states)

        def problem(s: int) -> tuple[str, str]:
            i = int(first[s])
            f = found[int(self.hw_off[s]) + i]
            assert f is not None
            return f"state.hardware[{i}].{f[0]}", f[1]

        self.v.snapshot(has, problem)

    def columns(self) -> None:
        """`_check_columns`, rule by rule in its order."""
        st = self.st
        n_hw_node = np.repeat(self.n_hw, self.n_nodes)
        nh = st.node_hardware
        self.column_min("node_hardware", nh)
        self.node_rule(
            nh >= n_hw_node,
            lambda i, g: (
                f"state.node_hardware[{i}]",
                f"must index state.hardware (< {int(n_hw_node[g])}), got {nh[g]}",
            ),
        )
        for name in ("accelerators_free", "accelerators_total", "cpu_free", "cpu_total"):
            self.column_min(name, getattr(st, name))
        for name in ("memory_free_gb", "memory_total_gb", "queue_length"):
            self.column_min(name, getattr(st, name))
        u = st.utilisation
        self.column_min("utilisation", u)
        self.node_rule(
            u > 1.0, lambda i, g: (f"state.utilisation[{i}]", f"must be <= 1, got {u[g]}")
        )
        for free, total in (
            ("accelerators_free", "accelerators_total"),
            ("cpu_free", "cpu_total"),
            ("memory_free_gb", "memory_total_gb"),
        ):
            self.at_most(free, total)

    def at_most(self, free: str, total: str) -> None:
        """``state.<free>[i] <= state.<total>[i]``."""
        self.node_rule(
            getattr(self.st, free) > getattr(self.st, total),
            lambda i, g: (f"state.{free}[{i}]", f"must be <= state.{total}[{i}]"),
        )

    def column_min(self, name: str, values: NDArray[Any]) -> None:
        if values.dtype.kind == "f":
            self.node_rule(
                ~np.isfinite(values),
                lambda i, g: (f"state.{name}[{i}]", f"must be finite, got {values[g]}"),
            )
        self.node_rule(
            values < 0, lambda i, g: (f"state.{name}[{i}]", f"must be >= 0, got {values[g]}")
        )

    def accelerator_classes(self) -> None:
        st = self.st
        if not (self.hw_memory == 0.0).any():
            return
        cls = st.node_hardware.astype(np.int64) + self.hw_off[:-1][self.node_state]
        cls = np.clip(cls, 0, len(self.hw_memory) - 1)  # validated indexes (refused otherwise)
        used = (self.hw_memory[cls] == 0.0) & (st.accelerators_total > 0)
        self.node_rule(
            used,
            lambda i, g: (
                f"state.hardware[{int(st.node_hardware[g])}].accelerator_memory_gb",
                f"is 0 (a CPU pool) but node {i} of this class has "
                f"{st.accelerators_total[g]} accelerators: give the accelerator memory, "
                f"or {UNKNOWN_MEMORY_HINT}",
            ),
        )


def _hardware_problem(h: HardwareClass) -> tuple[str, str] | None:
    """The first rule one hardware class breaks (`HardwareClass.validate`, then the
    quantity bound), as (attribute, problem); None when it breaks none."""
    name = h.name
    if not name or not name.strip():
        return "name", "must be a non-empty string"
    for attr in CAPABILITIES:
        value = getattr(h, attr)
        if value is None:
            continue
        if not math.isfinite(value):
            return attr, f"must be finite, got {value}"
        if value < 0:
            return attr, f"must be >= 0, got {value}"
    for attr in CAPABILITIES:
        value = getattr(h, attr)
        if value is not None and value > MAX_QUANTITY:
            return attr, f"must be at most {MAX_QUANTITY:g}, got {value}"
    return None
