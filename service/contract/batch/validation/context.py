"""The facts of one validation pass that several rule families share.

The batch's columns as int64 / bool views, the per-snapshot and per-request
row counts, the CSR maps from rows to their owners, and the two ways a rule
over rows refuses: per snapshot (`node_rule`) or per request (`request_rule`).
Computed once per batch, so that each rule family is a few mask operations
over the whole batch rather than a loop over its requests.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from service.contract.batch import RequestBatch
from service.contract.batch.validation.arrays import I64, Mask, _segment_first
from service.contract.batch.validation.utf8 import _Text
from service.contract.batch.validation.verdicts import _Verdicts
from service.contract.validation import RequestLimits


class _Pass:
    """One validation pass: the batch's columns and facts shared by several rules.

    The rule families (`_SchemaRules`, `_SnapshotRules`, ...) are its subclasses,
    one per module, and `requests._Run` combines them in validate_request's order.
    The attributes annotated here without a value are set by the rule that
    computes them (state, device count) before the later rules that read them.
    """

    node_ids: _Text  # state(): the snapshots' node ids, read again by texts()
    dev_bad_step: Mask  # device_count(): snapshots whose device offsets step back
    dev_first_step: I64
    dev_off: I64  # device offsets made monotone (bad snapshots flattened)
    state_dev: I64  # device offsets at snapshot boundaries
    sizes: I64  # options(): entries per option

    def __init__(self, batch: RequestBatch, limits: RequestLimits) -> None:
        self.b = batch
        self.limits = limits
        self.n = batch.n_requests
        self.v = _Verdicts(batch, self.n)
        st = batch.states
        self.st = st
        self.n_states = st.n_states
        self.node_off = (
            np.asarray(st.node_offsets, np.int64) if len(st.node_offsets) else np.zeros(1, np.int64)
        )
        self.n_nodes = self.node_off[1:] - self.node_off[:-1]  # per snapshot
        self.hw_off = np.asarray(st.hardware_offsets, np.int64)
        self.n_hw = self.hw_off[1:] - self.hw_off[:-1]
        self.si = np.asarray(batch.state_index, np.int64)
        self.node_state = np.repeat(np.arange(self.n_states, dtype=np.int64), self.n_nodes)
        # per hardware class (a handful per snapshot: `HardwareClass` objects)
        self.hw_memory = np.array(
            [
                math.nan if h.accelerator_memory_gb is None else h.accelerator_memory_gb
                for h in st.hardware
            ],
            dtype=np.float64,
        )
        self.sent = (
            np.asarray(st.devices_sent, np.bool_)
            if len(st.devices_sent)
            else np.zeros(self.n_states, np.bool_)
        )
        o = batch.options
        self.opt_off = np.asarray(o.option_offsets, np.int64)
        self.n_opts = self.opt_off[1:] - self.opt_off[:-1]  # per request
        self.req_entry = o.entry_offsets[self.opt_off]  # entry boundaries per request
        self.n_entries_r = self.req_entry[1:] - self.req_entry[:-1]
        self.entry_req = np.repeat(np.arange(self.n, dtype=np.int64), self.n_entries_r)
        self.option_req = np.repeat(np.arange(self.n, dtype=np.int64), self.n_opts)
        self.pp = batch.production
        self.present = (
            np.asarray(self.pp.present, np.bool_)
            if len(self.pp.present)
            else np.zeros(self.n, bool)
        )
        po = self.pp.probability_offsets
        self.n_probs = (po[1:] - po[:-1]) if len(po) else np.zeros(self.n, np.int64)
        self.has_probs = self.present & (self.n_probs > 0)
        self.defer = (
            np.asarray(self.pp.defer_probability, np.float64)
            if len(self.pp.present)
            else np.full(self.n, math.nan)
        )

    def per_node(self, mask: Mask) -> tuple[Mask, I64]:
        return _segment_first(mask, self.node_off, self.n_states)

    def node_rule(self, mask: Mask, problem: Callable[[int, int], tuple[str, str]]) -> None:
        """A rule over nodes: the snapshot's first offending node (local, global) names it."""
        if not mask.any():
            return
        bad, first = self.per_node(mask)
        base = self.node_off
        self.v.snapshot(bad, lambda s: problem(int(first[s]), int(base[s] + first[s])))

    def request_rule(
        self, mask: Mask, offsets: I64, problem: Callable[[int, int, int], tuple[str, str]]
    ) -> None:
        """A rule over rows owned per request by `offsets`: (r, local, global) names it."""
        if not mask.any():
            return
        bad, first = _segment_first(mask, offsets, self.n)
        self.v.request(bad, lambda r: problem(r, int(first[r]), int(offsets[r] + first[r])))
