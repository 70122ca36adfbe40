"""The feasibility function's joined columns, built from a batch's columns.

What `feasibility._batch` builds from request objects, column for column (each
request's snapshot nodes and devices, its entries, its needs), built instead by
gathering rows of the batch, so `feasibility_of_joined` can judge many requests
in one pass. Strings (allowed hardware, labels) are compared as exact integer
ids (`_string_ids`): fixed-width rows in numpy when every string is at most
`_PADDED_WIDTH` bytes, a Python dict otherwise (exact either way).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.contract.batch import (
    RequestBatch,
    Strings,
)
from service.contract.batch.validation.arrays import I64, Mask, _ragged
from service.contract.feasibility import _Batch as _FeasibilityColumns
from service.contract.feasibility import _device_sets

_PADDED_WIDTH = 64
"""Strings up to this many bytes are compared as fixed-width rows (exact, in numpy);
a longer one sends the whole comparison to a Python dict (exact, slower)."""


def _string_ids(columns: list[tuple[bytes, I64]]) -> list[I64]:
    """An integer per string, equal exactly when the strings are (over all `columns`,
    each ``(utf8, offsets)``)."""
    raws = [np.frombuffer(u, np.uint8) for u, _ in columns]
    lengths = [o[1:] - o[:-1] for _, o in columns]
    counts = [len(x) for x in lengths]
    width = max((int(x.max()) for x in lengths if len(x)), default=0)
    if width > _PADDED_WIDTH:  # a long string: exact ids by dict (a loop over strings)
        seen: dict[bytes, int] = {}
        out = []
        for (utf8, o), n in zip(columns, counts, strict=True):
            cut = o.tolist()
            out.append(
                np.array(
                    [seen.setdefault(utf8[cut[i] : cut[i + 1]], len(seen)) for i in range(n)],
                    dtype=np.int64,
                )
            )
        return out
    total = sum(counts)
    matrix = np.zeros((total, width + 8), dtype=np.uint8)  # + the length (8 bytes)
    base = 0
    for raw, (_, o), length in zip(raws, columns, lengths, strict=True):
        n = len(length)  # Strings offsets run from 0 (check_layout)
        if n and o[-1]:
            row = np.repeat(np.arange(base, base + n, dtype=np.int64), length)
            pos = np.arange(int(o[-1]), dtype=np.int64) - np.repeat(o[:-1], length)
            matrix[row, pos] = raw[: o[-1]]
        matrix[base : base + n, width:] = length.astype("<u8").view(np.uint8).reshape(n, 8)
        base += n
    keys = np.ascontiguousarray(matrix).view(np.dtype((np.void, width + 8))).reshape(-1)
    _, inverse = np.unique(keys, return_inverse=True)
    inverse = inverse.astype(np.int64).reshape(-1)
    return list(np.split(inverse, np.cumsum(counts)[:-1]))


def _snapshot_devices(b: RequestBatch) -> dict[str, NDArray[Any]]:
    """Every snapshot's devices as `service.contract.devices.node_devices` gives them
    (sent, or derived from the node counts by its shortcut rule), in node order:
    per node its device count; per device its node (global), class (local to the
    snapshot), free share and free memory (float32, NaN unknown)."""
    st = b.states
    nn = st.n_nodes
    n_states = st.n_states
    node_off = (
        np.asarray(st.node_offsets, np.int64) if len(st.node_offsets) else np.zeros(1, np.int64)
    )
    node_state = np.repeat(np.arange(n_states, dtype=np.int64), node_off[1:] - node_off[:-1])
    sent = (
        np.asarray(st.devices_sent, np.bool_) if len(st.devices_sent) else np.zeros(n_states, bool)
    )
    sent_node = sent[node_state]
    total = np.maximum(st.accelerators_total.astype(np.int64), 0)
    if sent.any():
        dev_off = np.asarray(st.device_offsets, np.int64)
        sent_counts = dev_off[1:] - dev_off[:-1]
    else:
        dev_off = np.zeros(nn + 1, np.int64)
        sent_counts = np.zeros(nn, np.int64)
    # (a snapshot whose device offsets step back is refused before this: clamped here
    # only so that its rows cannot disturb the others')
    counts = np.where(sent_node, np.maximum(sent_counts, 0), total)
    node = np.repeat(np.arange(nn, dtype=np.int64), counts)
    starts = np.zeros(nn + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    rank = np.arange(len(node), dtype=np.int64) - starts[:-1][node]
    from_columns = sent_node[node]
    source = np.where(from_columns, dev_off[:-1][node] + rank, 0)
    free = np.minimum(np.maximum(st.accelerators_free.astype(np.int64), 0), total)
    wholly_free = rank < free[node]
    hw_off = np.asarray(st.hardware_offsets, np.int64)
    memory = np.array(
        [
            math.nan if h.accelerator_memory_gb is None else h.accelerator_memory_gb
            for h in st.hardware
        ],
        dtype=np.float32,
    )  # a loop over hardware classes
    derived_class = st.node_hardware.astype(np.int64)[node]
    derived_memory = (
        memory[np.clip(derived_class + hw_off[:-1][node_state[node]], 0, len(memory) - 1)]
        if len(node) and len(memory)
        else np.full(len(node), np.nan, np.float32)
    )
    if sent.any() and len(st.device_hardware):
        pick = np.clip(source, 0, len(st.device_hardware) - 1)
        sent_class = st.device_hardware.astype(np.int64)[pick]
        sent_share = st.device_free_share[pick]
        sent_memory = st.device_free_memory_gb[pick]
    else:
        sent_class = np.zeros(len(node), np.int64)
        sent_share = sent_memory = np.zeros(len(node), np.float32)
    return {
        "per_node": counts,
        "node_start": starts,
        "node": node,
        "hardware": np.where(from_columns, sent_class, derived_class),
        "free_share": np.where(from_columns, sent_share, wholly_free.astype(np.float32)).astype(
            np.float32
        ),
        "free_memory_gb": np.where(
            from_columns, sent_memory, np.where(wholly_free, derived_memory, np.float32(0.0))
        ).astype(np.float32),
        "has_accelerators": ~(memory == 0.0),
    }


def joined_feasibility(b: RequestBatch, which: I64) -> _FeasibilityColumns:
    """The feasibility function's joined columns for requests `which` of `b` (in order),
    built from the batch's columns: what `feasibility._batch` builds from the request
    objects, column for column (each request's snapshot nodes and devices, its
    entries, its needs), so `feasibility_of_joined` gives the same result.

    Requests must have passed validation's earlier rules (indexes in range).
    """
    st, w, o = b.states, b.workloads, b.options
    which = np.asarray(which, np.int64)
    k = len(which)
    node_off = np.asarray(st.node_offsets, np.int64)
    hw_off = np.asarray(st.hardware_offsets, np.int64)
    s_of = np.asarray(b.state_index, np.int64)[which]
    n_nodes = (node_off[1:] - node_off[:-1])[s_of]
    n_hw = (hw_off[1:] - hw_off[:-1])[s_of]
    g_node = _ragged(node_off[s_of], n_nodes)  # joined node -> batch node
    node_base = np.cumsum(n_nodes) - n_nodes
    req_of_node = np.repeat(np.arange(k, dtype=np.int64), n_nodes)
    g_class = _ragged(hw_off[s_of], n_hw)  # joined class -> batch class
    class_base = np.cumsum(n_hw) - n_hw
    req_of_class = np.repeat(np.arange(k, dtype=np.int64), n_hw)

    devices = _snapshot_devices(b)
    per_state_dev = devices["node_start"][node_off]
    n_dev = (per_state_dev[1:] - per_state_dev[:-1])[s_of]
    g_dev = _ragged(per_state_dev[s_of], n_dev)
    dev_base = np.cumsum(n_dev) - n_dev
    req_of_dev = np.repeat(np.arange(k, dtype=np.int64), n_dev)

    share = np.asarray(w.accelerator_share, np.float64)[which]
    with np.errstate(over="ignore"):  # a need beyond float32 is a shortfall (inf)
        cpu_need = np.asarray(w.cpu_per_node, np.float64)[which].astype(np.float32)
        memory_need = np.asarray(w.memory_per_node_gb, np.float64)[which].astype(np.float32)
        threshold = np.where(np.isnan(share), 1.0, share).astype(np.float32)
        need = np.asarray(w.accelerator_memory_gb, np.float64)[which].astype(np.float32)

    allowed = _allowed_classes(b, which, g_class, req_of_class)
    usable = allowed & devices["has_accelerators"][g_class]
    affinity, anti = _label_rules(b, which, g_node, req_of_node)
    node_class = st.node_hardware.astype(np.int64)[g_node] + class_base[req_of_node]
    node_rules = np.stack(
        [
            st.cpu_free[g_node] < cpu_need[req_of_node],
            st.memory_free_gb[g_node] < memory_need[req_of_node],
            ~allowed[node_class],
            affinity,
            anti,
            st.draining[g_node] | ~st.healthy[g_node],
        ],
        axis=1,
    )
    dev_class = devices["hardware"][g_dev] + class_base[req_of_dev]
    device_sets = _device_sets(
        usable[dev_class],
        devices["free_share"][g_dev] >= threshold[req_of_dev],
        ~(devices["free_memory_gb"][g_dev] < need[req_of_dev]),
    )
    device_node = devices["node"][g_dev] - node_off[s_of][req_of_dev] + node_base[req_of_dev]

    opt_off = np.asarray(o.option_offsets, np.int64)
    n_opts = (opt_off[1:] - opt_off[:-1])[which]
    entry_offsets = np.asarray(o.entry_offsets, np.int64)
    req_entry = entry_offsets[opt_off]
    n_entries = (req_entry[1:] - req_entry[:-1])[which]
    g_entry = _ragged(req_entry[which], n_entries)
    req_of_entry = np.repeat(np.arange(k, dtype=np.int64), n_entries)
    nodes = o.node_index.astype(np.int64)[g_entry] + node_base[req_of_entry]
    g_opt = _ragged(opt_off[which], n_opts)
    per_option = (entry_offsets[1:] - entry_offsets[:-1])[g_opt]

    named = (
        np.asarray(o.devices_named, np.bool_)[which]
        if len(o.devices_named)
        else np.zeros(k, np.bool_)
    )
    if named.any():
        dev_offsets = np.asarray(o.device_offsets, np.int64)
        named_entries = g_entry[named[req_of_entry]]
        named_lengths = (dev_offsets[1:] - dev_offsets[:-1])[named_entries]
        rows_req = np.flatnonzero(named)
        first_row = dev_offsets[req_entry[which[rows_req]]]
        n_rows = dev_offsets[req_entry[which[rows_req] + 1]] - first_row
        g_row = _ragged(first_row, n_rows)
        row_req = np.repeat(rows_req, n_rows)  # position in `which`
        index = o.device_index.astype(np.int64)[g_row]
        valid = (index >= 0) & (index < n_dev[row_req])
        named_source = np.where(valid, index + dev_base[row_req], -1)
    else:
        named_lengths = named_source = np.zeros(0, np.int64)
    quota = (
        np.asarray(b.quota_remaining, np.float64)[which]
        if len(b.quota_remaining)
        else np.full(k, math.nan)
    )
    return _FeasibilityColumns(
        node_rules=node_rules,
        device_sets=np.concatenate([device_sets, np.zeros((1, 4), dtype=bool)]),
        device_node=np.concatenate([device_node, [-1]]).astype(np.int64),
        devices_per_node=devices["per_node"][g_node],
        nodes=nodes,
        taken=o.accelerators.astype(np.int64)[g_entry],
        named_lengths=named_lengths,
        named_source=named_source,
        per_option=per_option,
        entries=n_entries,
        options=n_opts,
        named=named,
        share=share,
        requested=w.accelerators.astype(np.float64)[which],
        quota=quota,
    )


def _allowed_classes(b: RequestBatch, which: I64, g_class: I64, req_of_class: I64) -> Mask:
    """Per joined class: allowed by its request's workload (an empty set allows all)."""
    w = b.workloads
    allowed = np.ones(len(g_class), np.bool_)
    if not len(w.allowed_hardware_offsets) or not len(g_class):
        return allowed
    a_off = np.asarray(w.allowed_hardware_offsets, np.int64)
    n_allowed = (a_off[1:] - a_off[:-1])[which]
    if not n_allowed.any():
        return allowed
    names = Strings.of(h.name for h in b.states.hardware)  # one per class, not per node
    rows = _ragged(a_off[which], n_allowed)
    values = w.allowed_hardware
    class_ids, value_ids = _string_ids(
        [
            (names.utf8, np.asarray(names.offsets, np.int64)),
            (values.utf8, np.asarray(values.offsets, np.int64)),
        ]
    )
    n_ids = int(max(class_ids.max(initial=0), value_ids.max(initial=0))) + 1
    wanted = np.repeat(np.arange(len(which), dtype=np.int64), n_allowed) * n_ids + value_ids[rows]
    have = req_of_class * n_ids + class_ids[g_class]
    restricted = (n_allowed > 0)[req_of_class]
    return ~restricted | np.isin(have, wanted)


def _label_rules(b: RequestBatch, which: I64, g_node: I64, req_of_node: I64) -> tuple[Mask, Mask]:
    """Per joined node: a label its request's workload requires is missing (affinity),
    and a label it forbids is present (anti-affinity). Labels are compared by exact
    ids (`_string_ids`); a node's labels count as a set (duplicates once)."""
    st, w = b.states, b.workloads
    n = len(g_node)
    k = len(which)
    affinity = np.zeros(n, np.bool_)
    anti = np.zeros(n, np.bool_)
    sets = {}
    for name in ("affinity", "anti_affinity"):
        offsets = getattr(w, f"{name}_offsets")
        if len(offsets):
            o = np.asarray(offsets, np.int64)
            counts = (o[1:] - o[:-1])[which]
            if counts.any():
                sets[name] = (o, counts)
    if not sets:
        return affinity, anti
    if len(st.label_offsets):
        lo = np.asarray(st.label_offsets, np.int64)
    else:
        lo = np.zeros(st.n_nodes + 1, np.int64)
    columns = [
        (
            st.labels.utf8,
            np.asarray(st.labels.offsets, np.int64)
            if len(st.labels.offsets)
            else np.zeros(1, np.int64),
        )
    ]
    for name in sets:
        values = getattr(w, name)
        columns.append((values.utf8, np.asarray(values.offsets, np.int64)))
    ids = _string_ids(columns)
    label_ids = ids[0]
    n_ids = int(max((x.max(initial=0) for x in ids), default=0)) + 1
    # (joined node, label id) of every label of every joined node, as one key
    n_labels = (lo[1:] - lo[:-1])[g_node]
    label_rows = _ragged(lo[:-1][g_node], n_labels)
    label_node = np.repeat(np.arange(n, dtype=np.int64), n_labels)
    for position, name in enumerate(sets, start=1):
        o, counts = sets[name]
        rows = _ragged(o[which], counts)
        row_req = np.repeat(np.arange(k, dtype=np.int64), counts)
        wanted = np.unique(row_req * n_ids + ids[position][rows])  # (request, label), distinct
        # which node labels are wanted by their node's request: distinct (node, label)
        key = req_of_node[label_node] * n_ids + label_ids[label_rows]
        hit = np.isin(key, wanted)
        pairs = np.unique(label_node[hit] * n_ids + label_ids[label_rows][hit])
        found = np.bincount(pairs // n_ids, minlength=n) if len(pairs) else np.zeros(n, np.int64)
        required = np.bincount(wanted // n_ids, minlength=k)[req_of_node]
        if name == "affinity":
            affinity = found < required
        else:
            anti = found > 0
    return affinity, anti
