"""Whole-batch layout: what must hold for the columns to be read into requests at all.

Column lengths, CSR offsets that run from 0 to their values' count and are
monotone between requests (snapshots), and state indexes within range. Such a
fault is not one request's (invariant 3): `check_layout` and
`check_outcome_layout` raise `InvalidInput` for the whole batch before any
rule runs. Vectorised: a handful of reductions per column, whatever the size.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from service.contract.batch import (
    OutcomeColumns,
    ProductionColumns,
    RequestBatch,
    Strings,
)
from service.contract.batch.columns import NODE_FLAG_COLUMNS, NODE_NUMBER_COLUMNS
from service.contract.batch.validation.arrays import I64
from service.contract.errors import InvalidInput


def _layout_offsets(field: str, offsets: I64, n_rows: int, n_values: int) -> None:
    if len(offsets) != n_rows + 1:
        raise InvalidInput(field, f"must have {n_rows + 1} entries, got {len(offsets)}")
    if offsets[0] != 0 or offsets[-1] != n_values:
        raise InvalidInput(field, f"must run from 0 to {n_values}")


def _layout_monotone(field: str, offsets: I64) -> None:
    if len(offsets) > 1 and np.minimum.reduce(offsets[1:] - offsets[:-1]) < 0:
        raise InvalidInput(field, "must be non-decreasing")


def _layout_csr(field: str, offsets: I64, n_rows: int, n_values: int) -> None:
    """CSR offsets of `n_rows` rows over `n_values` values: they index, and never step back."""
    _layout_offsets(field, offsets, n_rows, n_values)
    _layout_monotone(field, offsets)


def _layout_strings(field: str, s: Strings, n: int) -> None:
    if n == 0 and not len(s.offsets) and not s.utf8:
        return
    _layout_csr(f"{field}.offsets", s.offsets, n, len(s.utf8))


def _layout_length(field: str, column: NDArray[np.generic], n: int, optional: bool = False) -> None:
    if len(column) != n and not (optional and len(column) == 0):
        raise InvalidInput(field, f"must have {n} values, got {len(column)}")


def _layout_set(field: str, offsets: I64, values: Strings, n: int) -> None:
    if not len(offsets):
        if len(values):
            raise InvalidInput(f"{field}_offsets", f"must be set when {field} is given")
        return
    _layout_csr(f"{field}_offsets", offsets, n, len(values))
    _layout_strings(field, values, len(values))


def check_layout(batch: RequestBatch) -> None:
    """Raise `InvalidInput` (the whole batch) unless its columns can be read into requests:
    lengths, CSR offsets that index, and ids within range (invariant 3).

    Offsets may step backwards *inside* one request's (or snapshot's) rows: that is
    a fault of that request, refused by index as validate_request refuses it; the
    boundaries between requests (snapshots) must be monotone.
    """
    n = batch.n_requests
    _layout_strings("request_id", batch.request_id, n)
    _layout_length("request_time", batch.request_time, n)
    _layout_length("state_index", batch.state_index, n)
    _layout_length("quota_remaining", batch.quota_remaining, n, optional=True)
    st = batch.states
    n_states = st.n_states
    if n and (
        np.minimum.reduce(batch.state_index) < 0 or np.maximum.reduce(batch.state_index) >= n_states
    ):
        raise InvalidInput("state_index", f"must index the batch's states (< {n_states})")
    if n_states == 0 and len(st.node_offsets) not in (0, 1):
        raise InvalidInput("states.node_offsets", "must be empty with no states")
    if len(st.node_offsets):
        if st.node_offsets[0] != 0:
            raise InvalidInput("states.node_offsets", "must start at 0")
        _layout_monotone("states.node_offsets", st.node_offsets)
    nn = st.n_nodes
    _layout_csr("states.hardware_offsets", st.hardware_offsets, n_states, len(st.hardware))
    for name in (*NODE_NUMBER_COLUMNS, *NODE_FLAG_COLUMNS):
        _layout_length(f"states.{name}", getattr(st, name), nn)
    for name in ("node_ids", "zone", "locality"):
        _layout_strings(f"states.{name}", getattr(st, name), nn)
    if len(st.label_offsets):
        _layout_csr("states.label_offsets", st.label_offsets, nn, len(st.labels))
        _layout_strings("states.labels", st.labels, len(st.labels))
    elif len(st.labels):
        raise InvalidInput("states.label_offsets", "must be set when labels are given")
    _layout_length("states.devices_sent", st.devices_sent, n_states, optional=True)
    sent = bool(len(st.devices_sent) and st.devices_sent.any())
    if sent:
        nd = len(st.device_hardware)
        _layout_offsets("states.device_offsets", st.device_offsets, nn, nd)
        per_state = st.device_offsets[st.node_offsets]
        _layout_monotone("states.device_offsets", per_state)
        counts = per_state[1:] - per_state[:-1]
        if (counts[~st.devices_sent] != 0).any():
            raise InvalidInput("states.device_offsets", "a state that sends no devices owns none")
        for name in ("device_free_share", "device_free_memory_gb"):
            _layout_length(f"states.{name}", getattr(st, name), nd)
        _layout_length("states.device_ids_sent", st.device_ids_sent, n_states, optional=True)
        with_ids = (
            st.device_ids_sent & st.devices_sent
            if len(st.device_ids_sent)
            else np.zeros(n_states, np.bool_)
        )
        _layout_strings("states.device_ids", st.device_ids, int(counts[with_ids].sum()))
    elif len(st.device_offsets) or len(st.device_hardware) or len(st.device_ids):
        raise InvalidInput("states.device_offsets", "must be empty when no state sends devices")
    w = batch.workloads
    for name in ("workload_id", "kind", "model_family", "tenant", "qos_class"):
        _layout_strings(f"workloads.{name}", getattr(w, name), n)
    for name in (
        "model_size_b",
        "accelerators",
        "accelerator_memory_gb",
        "cpu_per_node",
        "memory_per_node_gb",
        "gang_size",
        "priority",
        "slo_seconds",
        "work_units",
        "accelerator_share",
    ):
        _layout_length(f"workloads.{name}", getattr(w, name), n)
    for name in ("allowed_hardware", "affinity", "anti_affinity"):
        _layout_set(f"workloads.{name}", getattr(w, f"{name}_offsets"), getattr(w, name), n)
    o = batch.options
    n_options = max(len(o.entry_offsets) - 1, 0)
    _layout_csr("options.option_offsets", o.option_offsets, n, n_options)
    n_entries = len(o.node_index)
    if len(o.entry_offsets) == 0 or o.entry_offsets[0] != 0 or o.entry_offsets[-1] != n_entries:
        raise InvalidInput("options.entry_offsets", f"must run from 0 to {n_entries}")
    _layout_monotone("options.entry_offsets", o.entry_offsets[o.option_offsets])
    _layout_length("options.accelerators", o.accelerators, n_entries)
    _layout_length("options.option_ids_sent", o.option_ids_sent, n, optional=True)
    per_request = np.diff(o.option_offsets)
    ids = int(per_request[o.option_ids_sent].sum()) if len(o.option_ids_sent) else 0
    _layout_strings("options.option_ids", o.option_ids, ids)
    _layout_length("options.devices_named", o.devices_named, n, optional=True)
    if len(o.devices_named) and o.devices_named.any():
        _layout_offsets("options.device_offsets", o.device_offsets, n_entries, len(o.device_index))
        at_request = o.device_offsets[o.entry_offsets[o.option_offsets]]
        _layout_monotone("options.device_offsets", at_request)
        if (np.diff(at_request)[~o.devices_named] != 0).any():
            raise InvalidInput("options.device_offsets", "a request naming no devices names none")
    elif len(o.device_offsets) or len(o.device_index):
        raise InvalidInput("options.device_offsets", "must be empty when no request names devices")
    _layout_production(batch.production, n)


def _layout_production(p: ProductionColumns, n: int) -> None:
    if not len(p.present):
        return
    _layout_length("production.present", p.present, n)
    for name in ("option", "propensity", "defer_probability"):
        _layout_length(f"production.{name}", getattr(p, name), n)
    if len(p.probability_offsets):
        _layout_csr(
            "production.probability_offsets", p.probability_offsets, n, len(p.probabilities)
        )
    elif len(p.probabilities):
        raise InvalidInput("production.probability_offsets", "must be set with probabilities")


def check_outcome_layout(cols: OutcomeColumns) -> None:
    """Raise `InvalidInput` (the whole batch) unless the columns can be read into outcomes."""
    n = cols.n_outcomes
    _layout_strings("request_id", cols.request_id, n)
    _layout_length("observed_at", cols.observed_at, n)
    _layout_length("failure", cols.failure, n)
    for name in ("queue_delay_s", "throughput", "completion_time_s", "slo_met"):
        _layout_length(name, getattr(cols, name), n, optional=True)
    _layout_production(cols.production, n)
