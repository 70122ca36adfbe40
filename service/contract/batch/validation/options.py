"""Option rules: `_check_options` and `check_named_devices` per request.

Option counts, option sizes and the gang bound, node indexes within the
request's snapshot, accelerator counts, and the devices an option names (the
state sends them, offsets monotone, indexes in range, on the entry's node). The
options of all requests are one CSR across the batch, so each rule is a mask
over all entries (or named devices) mapped back to requests by offsets.
"""

from __future__ import annotations

import numpy as np

from service.contract.batch.validation.arrays import _repair
from service.contract.batch.validation.context import _Pass
from service.contract.schema_versions import V1_SCHEMA


class _OptionRules(_Pass):
    """`_check_options` and `check_named_devices`, per request over its CSR rows."""

    def options(self) -> None:
        v, limits, o = self.v, self.limits, self.b.options
        k = self.n_opts
        v.request(k < 1, lambda r: ("options", "must list at least one placement option"))
        v.request(
            k > limits.max_options,
            lambda r: ("options", f"must list at most {limits.max_options}, got {int(k[r])}"),
        )
        eo = np.asarray(o.entry_offsets, np.int64)
        sizes = eo[1:] - eo[:-1]
        self.sizes = sizes
        opt_off = self.opt_off
        self.request_rule(
            sizes < 1, opt_off, lambda r, i, g: (f"options[{i}]", "must place on at least one node")
        )
        cap = limits.max_nodes_per_option
        self.request_rule(
            sizes > cap, opt_off, lambda r, i, g: (f"options[{i}]", f"spans more than {cap} nodes")
        )
        if self.b.schema_version != V1_SCHEMA:
            gang = self.b.workloads.gang_size.astype(np.int64)
            gang_of = gang[self.option_req]
            self.request_rule(
                sizes > gang_of,
                opt_off,
                lambda r, i, g: (
                    f"options[{i}]",
                    f"spans {int(sizes[g])} nodes, more than `workload.gang_size` "
                    f"({int(gang[r])}), the most nodes one option of the job may span",
                ),
            )
        entry_off = self.req_entry
        n_nodes_r = self.n_nodes[self.si]
        ni = o.node_index.astype(np.int64)
        limit_e = n_nodes_r[self.entry_req]
        self.request_rule(
            (ni < 0) | (ni >= limit_e),
            entry_off,
            lambda r, i, g: (
                f"options.node_index[{i}]",
                f"must index state nodes (< {int(n_nodes_r[r])}), got {o.node_index[g]}",
            ),
        )
        acc = o.accelerators
        self.request_rule(
            acc < 0,
            entry_off,
            lambda r, i, g: (f"options.accelerators[{i}]", f"must be >= 0, got {acc[g]}"),
        )
        if len(o.devices_named) and o.devices_named.any():
            self.named_devices()

    def named_devices(self) -> None:
        """`check_named_devices` for the requests whose options name devices."""
        v, o, st = self.v, self.b.options, self.st
        named = np.asarray(o.devices_named, np.bool_)
        state_sent = self.sent[self.si]
        v.request(
            named & ~state_sent,
            lambda r: (
                "options.device_offsets",
                "names devices, so the state must send them (state.device_offsets is empty)",
            ),
        )
        raw = np.asarray(o.device_offsets, np.int64)
        bad_step, first_step, fixed = _repair(raw, self.req_entry)
        entry_off = self.req_entry
        v.request(
            named & bad_step,
            lambda r: (
                f"options.device_offsets[{int(first_step[r])}]",
                "must be non-decreasing, got "
                f"{raw[entry_off[r] + first_step[r]] - raw[entry_off[r]]}",
            ),
        )
        index = o.device_index.astype(np.int64)
        if not len(index):
            return
        req_dev = fixed[entry_off]  # per request, its first named device row
        row_req = np.minimum(
            np.searchsorted(req_dev, np.arange(len(index)), side="right") - 1, self.n - 1
        )
        state_dev = (
            st.device_offsets[self.node_off]
            if len(st.device_offsets)
            else np.zeros(self.n_states + 1, np.int64)
        )
        n_dev_state = state_dev[1:] - state_dev[:-1]
        n_dev_r = n_dev_state[self.si]
        limit = n_dev_r[row_req]
        self.request_rule(
            (index < 0) | (index >= limit),
            req_dev,
            lambda r, j, g: (
                f"options.device_index[{j}]",
                f"must index the state's devices (< {int(n_dev_r[r])}), got {o.device_index[g]}",
            ),
        )
        # the node of each named device (local to the snapshot) against its entry's node
        s_of = self.si[row_req]
        dev_global = np.clip(index, 0, np.maximum(limit - 1, 0)) + state_dev[s_of]
        dev_global = np.clip(dev_global, 0, max(len(st.device_hardware) - 1, 0))
        if not len(st.device_hardware):
            return
        node_global = np.searchsorted(self.dev_off, dev_global, side="right") - 1
        device_node = node_global - self.node_off[s_of]
        entry = np.searchsorted(fixed, np.arange(len(index)), side="right") - 1  # global entry
        wanted = o.node_index.astype(np.int64)[np.clip(entry, 0, len(o.node_index) - 1)]
        local_entry = entry - entry_off[row_req]
        self.request_rule(
            device_node != wanted,
            req_dev,
            lambda r, j, g: (
                f"options.device_index[{j}]",
                f"device {o.device_index[g]} is on node {device_node[g]}, not on its entry's "
                f"node {wanted[g]} (options.node_index[{local_entry[g]}])",
            ),
        )
