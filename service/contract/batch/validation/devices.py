"""Device rules of the snapshots: the device bound and `check_devices`.

For snapshots that send devices: offsets that do not step back, each device's
class index, free share and free memory in range and within its class's
memory, node counts that equal the devices listed, device ids' length and text.
A fault refuses every request on its snapshot (`_Verdicts.snapshot`). Vectorised
over all devices of the batch at once; rows map to snapshots by binary search.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from service.contract.batch.validation.arrays import (
    I64,
    Mask,
    _counts_in,
    _counts_sum,
    _repair,
    _segment_first,
)
from service.contract.batch.validation.context import _Pass
from service.contract.batch.validation.utf8 import _Text, _text_refusal
from service.contract.device_validation import _DERIVE, UNKNOWN_MEMORY_HINT


class _DeviceRules(_Pass):
    """The device count bound and `check_devices`, per snapshot."""

    def device_count(self) -> None:
        st, limit = self.st, self.limits.max_devices
        if self.sent.any():
            bad_step, first_step, fixed = _repair(
                np.asarray(st.device_offsets, np.int64), self.node_off
            )
            self.dev_bad_step, self.dev_first_step, self.dev_off = bad_step, first_step, fixed
            state_dev = st.device_offsets[self.node_off]
            self.state_dev = state_dev
            counts = np.maximum(state_dev[1:] - state_dev[:-1], 0)
            self.v.snapshot(
                self.sent & (counts > limit),
                lambda s: (
                    "state.device_hardware",
                    f"must describe at most {limit} devices, got {int(counts[s])}",
                ),
            )
        totals = _counts_sum(st.accelerators_total, self.node_off)
        self.v.snapshot(
            totals > limit,
            lambda s: (
                "state.accelerators_total",
                f"must sum to at most {limit} devices in one snapshot, got {int(totals[s])}",
            ),
        )

    def devices(self) -> None:
        """`check_devices` for the snapshots that send devices."""
        st, v = self.st, self.v
        sent = self.sent
        state_dev = self.state_dev
        # state.device_offsets: a backward step inside a snapshot (local positions)
        fs = self.dev_first_step
        raw_offsets = np.asarray(st.device_offsets, np.int64)
        v.snapshot(
            sent & self.dev_bad_step,
            lambda s: (
                f"state.device_offsets[{int(fs[s])}]",
                "must be non-decreasing, got "
                f"{raw_offsets[self.node_off[s] + fs[s]] - raw_offsets[self.node_off[s]]}",
            ),
        )
        nd = len(st.device_hardware)
        if nd == 0:
            self.node_counts()
            return
        dev_state = np.minimum(
            np.searchsorted(state_dev, np.arange(nd), side="right") - 1, self.n_states - 1
        )
        hw = st.device_hardware.astype(np.int64)
        n_hw_dev = self.n_hw[dev_state]

        def dev_rule(mask: Mask, problem: Callable[[int, int], tuple[str, str]]) -> None:
            if not mask.any():
                return
            bad, first = _segment_first(mask, state_dev, self.n_states)
            v.snapshot(bad, lambda s: problem(int(first[s]), int(state_dev[s] + first[s])))

        dev_rule(
            (hw < 0) | (hw >= n_hw_dev),
            lambda d, g: (
                f"state.device_hardware[{d}]",
                f"must index state.hardware (< {int(n_hw_dev[g])}), got {st.device_hardware[g]}",
            ),
        )
        share = st.device_free_share
        dev_rule(
            ~(np.isfinite(share) & (share >= 0.0) & (share <= 1.0)),
            lambda d, g: (
                f"state.device_free_share[{d}]",
                f"must be finite and in [0, 1], got {share[g]}",
            ),
        )
        memory = st.device_free_memory_gb
        dev_rule(
            ~(np.isfinite(memory) & (memory >= 0.0)),
            lambda d, g: (
                f"state.device_free_memory_gb[{d}]",
                f"must be finite and >= 0, got {memory[g]}",
            ),
        )
        cls = np.clip(hw, 0, max(self.n_hw.max(initial=0) - 1, 0)) + self.hw_off[dev_state]
        cls = np.minimum(cls, max(len(self.hw_memory) - 1, 0))
        capacity = self.hw_memory[cls] if len(self.hw_memory) else np.full(nd, math.nan)
        dev_rule(
            capacity == 0.0,
            lambda d, g: (
                f"state.hardware[{hw[g]}].accelerator_memory_gb",
                f"is 0 (a CPU pool) but device {d} is of this class: give the device memory, "
                f"or {UNKNOWN_MEMORY_HINT}",
            ),
        )
        dev_rule(
            memory > capacity,
            lambda d, g: (
                f"state.device_free_memory_gb[{d}]",
                f"must be <= state.hardware[{hw[g]}].accelerator_memory_gb "
                f"({capacity[g]:g}), got {memory[g]:g}",
            ),
        )
        self.node_counts()
        self.device_ids(state_dev, dev_state)

    def node_counts(self) -> None:
        st = self.st
        off = self.dev_off  # monotone (bad snapshots flattened; they are refused already)
        raw = np.asarray(st.device_offsets, np.int64)
        counts = raw[1:] - raw[:-1]
        node_sent = self.sent[self.node_state]
        total = st.accelerators_total
        self.node_rule(
            node_sent & (total != counts),
            lambda i, g: (
                f"state.accelerators_total[{i}]",
                f"must equal node {i}'s devices in state.device_offsets ({counts[g]}), "
                f"got {total[g]} ({_DERIVE})",
            ),
        )
        free = _counts_in(np.asarray(st.device_free_share >= 1.0), off)
        acc_free = st.accelerators_free
        self.node_rule(
            node_sent & (acc_free != free),
            lambda i, g: (
                f"state.accelerators_free[{i}]",
                f"must equal node {i}'s wholly free devices (state.device_free_share >= 1: "
                f"{free[g]}), got {acc_free[g]} ({_DERIVE})",
            ),
        )

    def device_ids(self, state_dev: I64, dev_state: I64) -> None:
        st = self.st
        if not len(st.device_ids_sent) or not (st.device_ids_sent & self.sent).any():
            return
        text = _Text(st.device_ids)
        with_ids = st.device_ids_sent & self.sent
        per_state = np.where(with_ids, state_dev[1:] - state_dev[:-1], 0)
        id_off = np.zeros(self.n_states + 1, np.int64)
        np.cumsum(per_state, out=id_off[1:])
        limit = self.limits.max_id_length
        too_long = text.chars() > limit
        control = text.control()
        bad, first = _segment_first(too_long | control, id_off, self.n_states)

        def problem(s: int) -> tuple[str, str]:
            i = int(first[s])
            g = int(id_off[s]) + i
            if too_long[g]:
                return f"state.device_ids[{i}]", f"must be at most {limit} characters"
            return f"state.device_ids[{i}]", _text_refusal(text.value(g))

        self.v.snapshot(bad, problem)
