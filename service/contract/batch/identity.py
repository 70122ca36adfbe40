"""Request identity digests from batch columns (docs/ingest.md, "Identity"; issue 24).

`request_digests` gives, for each request of a `RequestBatch`, the content
digest that decides whether two sends under one ``request_id`` are the same
request. It is *the* definition: `service.contract.identity.content_sha256` of
a single request is its digest as a batch of one, so a request has one digest
whether it came alone, in a batch, by JSON or by protobuf.

The canonical encoding is columnar, built with array work over the whole batch
and hashed with one ``hashlib.sha256`` per snapshot and one per request:

- each **snapshot** is encoded once: `STATE_TAG`, a header (node, hardware
  class and label counts; whether it sent devices and device ids, and how
  many), its hardware classes (name, then each capability as a presence byte
  and a float64), one packed row per node (every per-node number, the byte
  lengths of its id, zone and locality, its label and device counts), the node
  ids', zones' and localities' UTF-8, the labels (sorted and deduplicated per
  node, as the frozensets they mean: byte lengths then UTF-8), one packed row
  per device and the device ids (byte lengths then UTF-8). Indexes are local
  to the snapshot already, so the encoding does not depend on the batch.
- each **request** is `REQUEST_TAG`, its snapshot's digest, one packed row of
  its fixed-width fields (request time; every workload number; optional
  numbers as a presence byte and a float64; production; quota; the byte
  lengths of its strings and the counts of its sets, options, entries, option
  ids, named devices and probabilities), then its strings' UTF-8, its three
  workload string sets (sorted, deduplicated: byte lengths then UTF-8), its
  options (entries per option, node indexes, accelerators, option ids, devices
  per entry and device indexes) and production's probabilities.

Every variable-length part is preceded (in a fixed-width row) by its length or
count, and every number has a fixed little-endian dtype, so no two different
requests encode alike. Only what the request *means* is encoded: a value the
columns carry but the request does not (production fields of a row without a
decision, device rows of a snapshot that sent none) is left out, and "not
given" (NaN in an optional column) is a presence byte, whatever NaN was sent.
``schema_version`` is left out: a version-1 request and its version-2
equivalent are one request. Floats are compared by their bits as decoded: a
``-0.0`` and a ``0.0`` differ.

Changing this encoding changes every digest: bump the tags and add a migration
that recomputes ``request_identities.content_sha256`` (as 0014 does).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.contract.batch import RequestBatch, Strings, shared_state
from service.contract.batch.columns import NODE_FLAG_COLUMNS, NODE_NUMBER_COLUMNS
from service.contract.hardware import CAPABILITIES, HardwareClass
from service.contract.request import MirrorRequest
from service.contract.state import ClusterState

REQUEST_TAG = b"understudy.request.identity.v1\x00"
"""Starts every request's encoding; a new encoding is a new tag."""
STATE_TAG = b"understudy.state.identity.v1\x00"
"""Starts every snapshot's encoding."""

DIGEST_SIZE = 32

_I64 = np.dtype("<i8")
_I32 = np.dtype("<i4")
_F32 = np.dtype("<f4")
_F64 = np.dtype("<f8")
_U8 = np.dtype("u1")

_STATE_HEADER = np.dtype(
    [
        ("n_nodes", _I64),
        ("n_hardware", _I64),
        ("n_labels", _I64),
        ("devices_sent", _U8),
        ("n_devices", _I64),
        ("device_ids_sent", _U8),
    ]
)
_NODE_ROW = np.dtype(  # packed (no alignment padding): every byte is a field's
    [
        ("node_id_bytes", _I64),
        ("node_hardware", _I32),
        ("accelerators_free", _I32),
        ("accelerators_total", _I32),
        ("cpu_free", _F32),
        ("cpu_total", _F32),
        ("memory_free_gb", _F32),
        ("memory_total_gb", _F32),
        ("utilisation", _F32),
        ("queue_length", _I32),
        ("healthy", _U8),
        ("draining", _U8),
        ("zone_bytes", _I64),
        ("locality_bytes", _I64),
        ("n_labels", _I64),
        ("n_devices", _I64),
    ]
)
_DEVICE_ROW = np.dtype(
    [("device_hardware", _I32), ("device_free_share", _F32), ("device_free_memory_gb", _F32)]
)
_OPTIONAL = np.dtype([("given", _U8), ("value", _F64)])
_REQUEST_ROW = np.dtype(
    [
        ("state_digest", _U8, (DIGEST_SIZE,)),
        ("request_time", _F64),
        ("request_id_bytes", _I64),
        ("workload_id_bytes", _I64),
        ("kind_bytes", _I64),
        ("model_family_bytes", _I64),
        ("tenant_bytes", _I64),
        ("qos_class_bytes", _I64),
        ("model_size_b", _F64),
        ("accelerators", _I32),
        ("accelerator_memory_gb", _F64),
        ("cpu_per_node", _F64),
        ("memory_per_node_gb", _F64),
        ("gang_size", _I32),
        ("priority", _I32),
        ("slo_seconds", _OPTIONAL),
        ("work_units", _OPTIONAL),
        ("accelerator_share", _OPTIONAL),
        ("n_allowed_hardware", _I64),
        ("n_affinity", _I64),
        ("n_anti_affinity", _I64),
        ("quota_remaining", _OPTIONAL),
        ("production", _U8),
        ("production_option", _I32),
        ("production_propensity", _OPTIONAL),
        ("production_defer_probability", _OPTIONAL),
        ("n_probabilities", _I64),
        ("n_options", _I64),
        ("n_entries", _I64),
        ("option_ids_sent", _U8),
        ("devices_named", _U8),
        ("n_named_devices", _I64),
    ]
)
_HARDWARE = struct.Struct("<" + "Bd" * len(CAPABILITIES))
_LENGTH = struct.Struct("<q")

_MAX_PADDED_BYTES = 1 << 26
"""Largest padded matrix `_canonical_sets` builds to sort strings with numpy; beyond it
(very long strings) the segments are sorted in Python, one per segment."""

Component = tuple[NDArray[np.uint8], NDArray[np.int64], NDArray[np.int64]]
"""(source bytes, start per row, byte length per row): one part of every row's encoding."""


def _u8(data: bytes | NDArray[Any]) -> NDArray[np.uint8]:
    if isinstance(data, bytes):
        return np.frombuffer(data, dtype=np.uint8)
    return np.ascontiguousarray(data).reshape(-1).view(np.uint8)


def _diff(a: NDArray[Any]) -> NDArray[Any]:
    """``np.diff`` of a 1-D array, without its overhead (called a few dozen times a batch)."""
    out: NDArray[Any] = a[1:] - a[:-1]
    return out


def _offsets(counts: NDArray[Any]) -> NDArray[np.int64]:
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _string_offsets(strings: Strings, count: int) -> NDArray[np.int64]:
    """`strings`' offsets, or ``count + 1`` zeros when the column is empty ("none")."""
    if len(strings.offsets):
        return strings.offsets.astype(np.int64, copy=False)
    return np.zeros(count + 1, dtype=np.int64)


def _csr(offsets: NDArray[Any], count: int) -> NDArray[np.int64]:
    """CSR `offsets` over `count` rows, or zeros when empty (no row has any)."""
    if len(offsets):
        return offsets.astype(np.int64, copy=False)
    return np.zeros(count + 1, dtype=np.int64)


def _flag(column: NDArray[np.bool_], count: int) -> NDArray[np.bool_]:
    """A per-row flag column (empty: false everywhere), as 0/1 booleans whatever bytes came."""
    flags: NDArray[np.bool_] = (
        np.asarray(column).view(np.uint8)[:count] != 0
        if len(column)
        else np.zeros(count, dtype=np.bool_)
    )
    return flags


def _set_optional(rows: NDArray[Any], name: str, values: NDArray[Any], count: int) -> None:
    """Fill an optional-number field: presence byte, and the value (0 when not given)."""
    v = np.asarray(values, dtype=_F64) if len(values) else np.full(count, np.nan)
    given = ~np.isnan(v)
    rows[name]["given"] = given
    rows[name]["value"] = np.where(given, v, 0.0)


def _gather(
    src: NDArray[np.uint8], starts: NDArray[np.int64], lengths: NDArray[np.int64]
) -> tuple[NDArray[np.uint8], NDArray[np.int64]]:
    """``src[starts[i]:starts[i]+lengths[i]]`` for each i, concatenated, with their offsets."""
    offsets = _offsets(lengths)
    total = int(offsets[-1])
    if total == 0:
        return np.zeros(0, dtype=np.uint8), offsets
    index = np.arange(total, dtype=np.int64) + np.repeat(starts - offsets[:-1], lengths)
    return src[index], offsets


def _assemble(components: Sequence[Component], n: int) -> tuple[NDArray[np.uint8], NDArray[Any]]:
    """Row i's encoding is each component's piece of row i, in order; all rows concatenated.

    Returns the bytes and the n + 1 row offsets into them. The pieces are cut and joined by
    ``map`` over slice objects (C loops, one step per piece): a byte-wise gather index costs
    per byte, and the pieces here average tens of bytes (about 6x slower, measured).
    """
    if n == 1:  # one row (a single request, a lone snapshot): slices joined, no index work
        row = b"".join(
            [c[0][int(c[1][0]) : int(c[1][0]) + int(c[2][0])].tobytes() for c in components]
        )
        return np.frombuffer(row, dtype=np.uint8), np.array([0, len(row)], dtype=np.int64)
    sources = [c[0] for c in components]
    bases = _offsets(np.array([len(s) for s in sources], dtype=np.int64))[:-1]
    starts = np.stack([c[1].astype(np.int64, copy=False) for c in components], axis=1) + bases
    lengths = np.stack([c[2].astype(np.int64, copy=False) for c in components], axis=1)
    source = np.concatenate(sources).tobytes()  # bytes slices are cheaper than memoryviews
    flat_starts, flat_lengths = starts.ravel(), lengths.ravel()
    cut = flat_lengths > 0  # optional parts are mostly empty: about half the pieces
    first = flat_starts[cut]
    cuts = map(slice, first.tolist(), (first + flat_lengths[cut]).tolist())
    data = np.frombuffer(b"".join(map(source.__getitem__, cuts)), dtype=np.uint8)
    return data, _offsets(lengths.sum(axis=1))


def _rows(array: NDArray[Any], first: NDArray[np.int64], count: NDArray[np.int64]) -> Component:
    """Rows ``first[i] : first[i] + count[i]`` of a fixed-width `array`, as a component."""
    size = array.dtype.itemsize
    return _u8(array), first * size, count * size


def _strings_part(
    strings: Strings, first: NDArray[np.int64], count: NDArray[np.int64], total: int
) -> tuple[Component, Component]:
    """Values ``first[i] : first[i] + count[i]`` of `strings`: their byte lengths (i64) and
    their UTF-8, as two components. `total` is how many values the column has."""
    offsets = _string_offsets(strings, total)
    lengths = _diff(offsets).astype(_I64)
    a, b = offsets[first], offsets[first + count]
    return _rows(lengths, first, count), (_u8(strings.utf8), a, b - a)


def _utf8_of(
    strings: Strings, first: NDArray[np.int64], count: NDArray[np.int64], total: int
) -> Component:
    """The UTF-8 of values ``first[i] : first[i] + count[i]`` of `strings` (of `total`)."""
    offsets = _string_offsets(strings, total)
    a = offsets[first]
    return _u8(strings.utf8), a, offsets[first + count] - a


def _compare_adjacent(
    padded: NDArray[np.uint8], lengths: NDArray[np.int64]
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """For each adjacent pair of zero-padded byte strings: (first < second, first == second),
    byte-lexicographically (a proper prefix is smaller; padding is told apart by length)."""
    a, b = padded[:-1], padded[1:]
    la, lb = lengths[:-1], lengths[1:]
    if padded.shape[1] == 0:
        return la < lb, la == lb
    differ = a != b
    some = differ.any(axis=1)
    first = differ.argmax(axis=1)
    rows = np.arange(len(a))
    less = np.where(some, a[rows, first] < b[rows, first], la < lb)
    return less, ~some & (la == lb)


def _canonical_sets(
    strings: Strings,
    offsets: NDArray[Any],
    n_segments: int,
    max_padded: int = _MAX_PADDED_BYTES,
) -> tuple[Strings, NDArray[np.int64]]:
    """String sets in CSR (segment i owns values ``offsets[i]:offsets[i+1]``), each sorted by
    UTF-8 bytes (= by code point, as `sorted` sorts str) and without repeats: the frozensets
    they mean. Returns the values and the per-segment offsets.

    `RequestBatch.from_requests` already sorts, so the usual cost is one check.
    """
    seg_offsets = _csr(offsets, n_segments)
    n = int(seg_offsets[-1])
    value_offsets = _string_offsets(strings, n)[: n + 1]
    if n < 2:
        return Strings(strings.utf8, value_offsets), seg_offsets
    per_segment = _diff(seg_offsets)
    if int(per_segment.max()) < 2:  # no segment holds two values: nothing to order
        return Strings(strings.utf8, value_offsets), seg_offsets
    lengths = _diff(value_offsets)
    segment = np.repeat(np.arange(n_segments), per_segment)
    width = int(lengths.max())
    if n * width > max_padded:
        return _canonical_sets_slowly(strings, value_offsets, seg_offsets)
    padded = np.zeros((n, width), dtype=np.uint8)
    if width:
        col = np.arange(width)
        inside = col < lengths[:, None]
        buf = _u8(strings.utf8)
        padded[inside] = buf[(value_offsets[:-1, None] + col)[inside]]
    same_segment = segment[1:] == segment[:-1]
    less, _ = _compare_adjacent(padded, lengths)
    if bool(np.all(less | ~same_segment)):
        return Strings(strings.utf8, value_offsets), seg_offsets
    # sort within segments: segment first, then bytes, then length (np.lexsort: last key first)
    # the bytes compared eight at a time, as big-endian words (their order is the bytes')
    words = np.zeros((n, -(-width // 8) * 8), dtype=np.uint8)
    words[:, :width] = padded
    packed = words.view(">u8")
    keys = (lengths, *(packed[:, j] for j in range(packed.shape[1] - 1, -1, -1)), segment)
    order = np.lexsort(keys)
    padded, lengths, segment = padded[order], lengths[order], segment[order]
    _, equal = _compare_adjacent(padded, lengths)
    keep = np.ones(n, dtype=np.bool_)
    keep[1:] = ~(equal & (segment[1:] == segment[:-1]))
    kept = order[keep]
    data, new_offsets = _gather(_u8(strings.utf8), value_offsets[kept], _diff(value_offsets)[kept])
    counts = np.bincount(segment[keep], minlength=n_segments)
    return Strings(data.tobytes(), new_offsets), _offsets(counts)


def _canonical_sets_slowly(
    strings: Strings, value_offsets: NDArray[np.int64], seg_offsets: NDArray[np.int64]
) -> tuple[Strings, NDArray[np.int64]]:
    """`_canonical_sets` for strings too long to pad: sorted in Python, per segment."""
    data = strings.utf8
    cut = value_offsets.tolist()
    values: list[bytes] = []
    counts = []
    for a, b in zip(seg_offsets[:-1].tolist(), seg_offsets[1:].tolist(), strict=True):
        unique = sorted({data[cut[i] : cut[i + 1]] for i in range(a, b)})
        values.extend(unique)
        counts.append(len(unique))
    return (
        Strings(b"".join(values), _offsets(np.array([len(v) for v in values], dtype=np.int64))),
        _offsets(np.array(counts, dtype=np.int64)),
    )


@functools.lru_cache(maxsize=4096)
def _hardware_bytes(h: HardwareClass) -> bytes:
    """A class's encoding; cached, as a fleet has a few classes sent in every snapshot."""
    name = h.name.encode()
    numbers: list[Any] = []
    for attr in CAPABILITIES:
        value = getattr(h, attr)
        numbers += (0, 0.0) if value is None else (1, float(value))
    return _LENGTH.pack(len(name)) + name + _HARDWARE.pack(*numbers)


def _fill_node_columns(rows: NDArray[Any], source: object) -> None:
    """The per-node numbers and flags of `source` (a `StateColumns` or a `ClusterState`:
    the same names) into node `rows`: the batch and the single encoder share this."""
    for name in NODE_NUMBER_COLUMNS:
        rows[name] = getattr(source, name)
    for name in NODE_FLAG_COLUMNS:
        rows[name] = np.asarray(getattr(source, name)).view(np.uint8) != 0


def state_encodings(batch: RequestBatch) -> tuple[NDArray[np.uint8], NDArray[Any]]:
    """The canonical encoding of every snapshot of `batch`: bytes and n_states + 1 offsets."""
    st = batch.states
    n_states, n_nodes = st.n_states, st.n_nodes
    node_offsets = _csr(st.node_offsets, n_states)
    first_node, nodes = node_offsets[:-1], _diff(node_offsets)

    # hardware classes: a handful per snapshot, objects already (StateColumns.hardware)
    hardware = [_hardware_bytes(h) for h in st.hardware]
    hw_bytes = _offsets(np.array([len(h) for h in hardware], dtype=np.int64))
    hw_offsets = _csr(st.hardware_offsets, n_states)
    hw_a, hw_b = hw_bytes[hw_offsets[:-1]], hw_bytes[hw_offsets[1:]]

    labels, label_offsets = _canonical_sets(st.labels, st.label_offsets, n_nodes)

    sent = _flag(st.devices_sent, n_states) & (len(st.device_offsets) > 0)
    ids_sent = _flag(st.device_ids_sent, n_states) & sent
    node_sent = np.repeat(sent, nodes)
    device_offsets = _csr(st.device_offsets, n_nodes)
    node_devices = np.where(node_sent, _diff(device_offsets), 0)
    first_device = device_offsets[first_node]
    devices = np.where(sent, device_offsets[node_offsets[1:]] - first_device, 0)
    n_ids = np.where(ids_sent, devices, 0)
    first_id = _offsets(n_ids)[:-1]

    node_rows = np.empty(n_nodes, dtype=_NODE_ROW)
    node_rows["node_id_bytes"] = _diff(_string_offsets(st.node_ids, n_nodes))
    _fill_node_columns(node_rows, st)
    node_rows["zone_bytes"] = _diff(_string_offsets(st.zone, n_nodes))
    node_rows["locality_bytes"] = _diff(_string_offsets(st.locality, n_nodes))
    node_rows["n_labels"] = _diff(label_offsets)
    node_rows["n_devices"] = node_devices

    n_device_rows = len(st.device_hardware)
    device_rows = np.empty(n_device_rows, dtype=_DEVICE_ROW)
    for name in ("device_hardware", "device_free_share", "device_free_memory_gb"):
        device_rows[name] = getattr(st, name)

    first_label = label_offsets[first_node]
    n_labels = label_offsets[node_offsets[1:]] - first_label
    header = np.empty(n_states, dtype=_STATE_HEADER)
    header["n_nodes"] = nodes
    header["n_hardware"] = _diff(hw_offsets)
    header["n_labels"] = n_labels
    header["devices_sent"] = sent
    header["n_devices"] = devices
    header["device_ids_sent"] = ids_sent

    everything = np.arange(n_states, dtype=np.int64)
    tag = np.frombuffer(STATE_TAG, dtype=np.uint8)
    components: list[Component] = [
        (tag, np.zeros(n_states, np.int64), np.full(n_states, len(tag), np.int64)),
        _rows(header, everything, np.ones(n_states, np.int64)),
        (_u8(b"".join(hardware)), hw_a, hw_b - hw_a),
        _rows(node_rows, first_node, nodes),
        _utf8_of(st.node_ids, first_node, nodes, n_nodes),
        _utf8_of(st.zone, first_node, nodes, n_nodes),
        _utf8_of(st.locality, first_node, nodes, n_nodes),
        *_strings_part(labels, first_label, n_labels, int(label_offsets[-1])),
        _rows(device_rows, first_device, devices),
        *_strings_part(st.device_ids, first_id, n_ids, int(n_ids.sum())),
    ]
    return _assemble(components, n_states)


def _digests(data: NDArray[np.uint8], offsets: NDArray[Any]) -> NDArray[np.uint8]:
    """sha256 of each row of an assembled encoding, shape (rows, 32)."""
    view = data.data  # a memoryview: slicing it copies nothing
    cut = offsets.tolist()
    sha256 = hashlib.sha256
    # one hashlib call per row: hashing has no array form
    joined = b"".join([sha256(view[a:b]).digest() for a, b in itertools.pairwise(cut)])
    return np.frombuffer(joined, dtype=np.uint8).reshape(-1, DIGEST_SIZE)


def state_digests(batch: RequestBatch) -> NDArray[np.uint8]:
    """sha256 of each snapshot's canonical encoding, shape (n_states, 32)."""
    if batch.states.n_states == 0:
        return np.zeros((0, DIGEST_SIZE), dtype=np.uint8)
    return _digests(*state_encodings(batch))


def request_encodings(batch: RequestBatch) -> tuple[NDArray[np.uint8], NDArray[Any]]:
    """The canonical encoding of every request of `batch`: bytes and n_requests + 1 offsets
    (request r is ``data[offsets[r]:offsets[r+1]]``)."""
    n = batch.n_requests
    everyone = np.arange(n, dtype=np.int64)
    one = np.ones(n, dtype=np.int64)
    w, o, p = batch.workloads, batch.options, batch.production
    rows = np.zeros(n, dtype=_REQUEST_ROW)
    rows["state_digest"] = state_digests(batch)[np.asarray(batch.state_index, dtype=np.int64)]
    rows["request_time"] = batch.request_time

    strings: list[Component] = []
    for name, column in (
        ("request_id", batch.request_id),
        ("workload_id", w.workload_id),
        ("kind", w.kind),
        ("model_family", w.model_family),
        ("tenant", w.tenant),
        ("qos_class", w.qos_class),
    ):
        rows[f"{name}_bytes"] = _diff(_string_offsets(column, n))
        strings.append(_utf8_of(column, everyone, one, n))
    for name in (
        "model_size_b",
        "accelerators",
        "accelerator_memory_gb",
        "cpu_per_node",
        "memory_per_node_gb",
        "gang_size",
        "priority",
    ):
        rows[name] = getattr(w, name)
    for name in ("slo_seconds", "work_units", "accelerator_share"):
        _set_optional(rows, name, getattr(w, name), n)
    _set_optional(rows, "quota_remaining", batch.quota_remaining, n)

    sets: list[Component] = []
    for name in ("allowed_hardware", "affinity", "anti_affinity"):
        values, offsets = _canonical_sets(getattr(w, name), getattr(w, f"{name}_offsets"), n)
        counts = _diff(offsets)
        rows[f"n_{name}"] = counts
        sets += _strings_part(values, offsets[:-1], counts, int(offsets[-1]))

    present = _flag(p.present, n)
    rows["production"] = present
    if present.any():
        rows["production_option"] = np.where(present, p.option, 0)
        for name, given in (
            ("production_propensity", p.propensity),
            ("production_defer_probability", p.defer_probability),
        ):
            _set_optional(rows, name, np.where(present, given, np.nan), n)
    probability_offsets = _csr(p.probability_offsets, n)
    n_probabilities = np.where(present, _diff(probability_offsets), 0)
    rows["n_probabilities"] = n_probabilities
    probabilities = np.asarray(p.probabilities, dtype=_F64)

    option_offsets = _csr(o.option_offsets, n)
    first_option, options = option_offsets[:-1], _diff(option_offsets)
    entry_offsets = o.entry_offsets.astype(np.int64, copy=False)
    first_entry = entry_offsets[first_option]
    entries = entry_offsets[option_offsets[1:]] - first_entry
    ids_sent = _flag(o.option_ids_sent, n)
    n_ids = np.where(ids_sent, options, 0)
    named = _flag(o.devices_named, n) & (len(o.device_offsets) > 0)
    named_offsets = _csr(o.device_offsets, len(o.node_index))
    first_named = named_offsets[first_entry]
    n_named = np.where(named, named_offsets[first_entry + entries] - first_named, 0)
    rows["n_options"] = options
    rows["n_entries"] = entries
    rows["option_ids_sent"] = ids_sent
    rows["devices_named"] = named
    rows["n_named_devices"] = n_named

    tag = np.frombuffer(REQUEST_TAG, dtype=np.uint8)
    components: list[Component] = [
        (tag, np.zeros(n, np.int64), np.full(n, len(tag), np.int64)),
        _rows(rows, everyone, one),
        *strings,
        *sets,
        _rows(_diff(entry_offsets).astype(_I64), first_option, options),
        _rows(np.asarray(o.node_index, dtype=_I32), first_entry, entries),
        _rows(np.asarray(o.accelerators, dtype=_I32), first_entry, entries),
        *_strings_part(o.option_ids, _offsets(n_ids)[:-1], n_ids, int(n_ids.sum())),
        _rows(_diff(named_offsets).astype(_I64), first_entry, np.where(named, entries, 0)),
        _rows(np.asarray(o.device_index, dtype=_I32), first_named, n_named),
        _rows(probabilities, probability_offsets[:-1], n_probabilities),
    ]
    return _assemble(components, n)


def request_digests(batch: RequestBatch) -> NDArray[np.uint8]:
    """Each request's content digest (sha256 of its canonical encoding), shape (n, 32).

    Request r's digest depends only on request r (not on its batch-mates, its
    position, or whether its snapshot is shared), and equals
    `service.contract.identity.content_sha256` of ``batch.requests([r])[0]``.
    """
    if batch.n_requests == 0:
        return np.zeros((0, DIGEST_SIZE), dtype=np.uint8)
    return _digests(*request_encodings(batch))


# --- one request, straight from its object ------------------------------------------------
#
# The same encoding as `request_encodings(RequestBatch.from_requests([request]))`, byte for
# byte, built from the request's own arrays: a single request does not pay the conversion
# to columns and the fixed cost of the batch's array work (~10x the hashing itself).
# tests/contract/test_batch_identity.py holds the two equal on every request and every
# single change of one it makes; change both together or neither.

_REQUEST_STRUCT = struct.Struct(
    "<32sd6q"  # state digest, request time, six string byte lengths
    "diddd2i"  # model size, accelerators, accelerator memory, cpu, memory, gang, priority
    "BdBdBd3q"  # slo, work units, share (optional); three set counts
    "Bd"  # quota (optional)
    "BiBdBdq"  # production: present, option, propensity, defer, probabilities
    "2q2Bq"  # options, entries, ids sent, devices named, named devices
)
_HEADER_STRUCT = struct.Struct("<3qBqB")
assert _REQUEST_STRUCT.size == _REQUEST_ROW.itemsize
assert _HEADER_STRUCT.size == _STATE_HEADER.itemsize


def _utf8(values: Sequence[str]) -> tuple[bytes, NDArray[np.int64]]:
    """`values` as UTF-8 concatenated, and each one's byte length."""
    text = "".join(values)
    if text.isascii():  # one byte per character
        return text.encode(), np.fromiter(map(len, values), dtype=_I64, count=len(values))
    encoded = [v.encode() for v in values]
    return b"".join(encoded), np.fromiter(map(len, encoded), dtype=_I64, count=len(encoded))


def _optional(value: float | None) -> tuple[int, float]:
    if value is None or math.isnan(value):
        return 0, 0.0
    return 1, float(value)


def _set_parts(values: frozenset[str]) -> tuple[int, bytes, bytes]:
    ordered = sorted(values)
    data, lengths = _utf8(ordered)
    return len(ordered), lengths.tobytes(), data


def _state_encoding(s: ClusterState) -> bytes:
    n = len(s.node_ids)
    node_ids, node_id_bytes = _utf8(s.node_ids)
    zones, zone_bytes = _utf8(s.zone)
    localities, locality_bytes = _utf8(s.locality)
    label_values = [v for members in s.labels for v in sorted(members)]
    labels, label_bytes = _utf8(label_values)
    sent = len(s.device_offsets) > 0
    rows = np.empty(n, dtype=_NODE_ROW)
    rows["node_id_bytes"] = node_id_bytes
    _fill_node_columns(rows, s)
    rows["zone_bytes"] = zone_bytes
    rows["locality_bytes"] = locality_bytes
    rows["n_labels"] = [len(members) for members in s.labels]
    parts = [STATE_TAG, b"", b"".join([_hardware_bytes(h) for h in s.hardware]), b""]
    devices, ids_sent, n_devices = b"", False, 0
    if sent:
        offsets = np.asarray(s.device_offsets, dtype=np.int64)
        rows["n_devices"] = _diff(offsets)
        n_devices = int(offsets[-1] - offsets[0])
        device_rows = np.empty(n_devices, dtype=_DEVICE_ROW)
        for name in ("device_hardware", "device_free_share", "device_free_memory_gb"):
            device_rows[name] = getattr(s, name)[:n_devices]
        devices = device_rows.tobytes()
        ids_sent = bool(s.device_ids)
    else:
        rows["n_devices"] = 0
    parts[1] = _HEADER_STRUCT.pack(n, len(s.hardware), len(label_values), sent, n_devices, ids_sent)
    parts[3] = rows.tobytes()
    parts += [node_ids, zones, localities, label_bytes.tobytes(), labels, devices]
    if ids_sent:
        ids, id_bytes = _utf8(s.device_ids[:n_devices])
        parts += [id_bytes.tobytes(), ids]
    return b"".join(parts)


def state_digest(state: ClusterState) -> bytes:
    """sha256 of the snapshot's canonical encoding (the first 32 bytes of a request row);
    once per state shared by many requests (`service.contract.batch.shared_state`)."""
    known = shared_state.facts(state)
    if known is not None and known.digest is not None:
        return known.digest
    digest = hashlib.sha256(_state_encoding(state)).digest()
    if known is not None:
        known.digest = digest
    return digest


def single_request_encoding(request: MirrorRequest) -> bytes:
    """The canonical encoding of one request: equal to its `request_encodings` row in any
    batch, built from the object without converting it to columns."""
    w, o, p = request.workload, request.options, request.production
    state = state_digest(request.state)
    strings = [
        v.encode()
        for v in (
            request.request_id,
            w.workload_id,
            str(w.kind),
            w.model_family,
            w.tenant,
            w.qos_class,
        )
    ]
    sets = [_set_parts(w.allowed_hardware), _set_parts(w.affinity), _set_parts(w.anti_affinity)]
    node_offsets = np.asarray(o.node_offsets, dtype=np.int64)
    n_options = len(node_offsets) - 1
    entries = int(node_offsets[-1] - node_offsets[0])
    ids_sent = bool(o.option_ids)
    named = len(o.device_offsets) > 0
    n_named = int(o.device_offsets[-1] - o.device_offsets[0]) if named else 0
    probabilities: tuple[float, ...] = ()
    if p is not None and p.probabilities:
        probabilities = p.probabilities
    row = _REQUEST_STRUCT.pack(
        state,
        request.request_time,
        *(len(s) for s in strings),
        w.model_size_b,
        w.accelerators,
        w.accelerator_memory_gb,
        w.cpu_per_node,
        w.memory_per_node_gb,
        w.gang_size,
        w.priority,
        *_optional(w.slo_seconds),
        *_optional(w.work_units),
        *_optional(w.accelerator_share),
        *(count for count, _, _ in sets),
        *_optional(request.quota_remaining),
        p is not None,
        p.option if p is not None else 0,
        *_optional(p.propensity if p is not None else None),
        *_optional(p.defer_probability if p is not None else None),
        len(probabilities),
        n_options,
        entries,
        ids_sent,
        named,
        n_named,
    )
    parts = [REQUEST_TAG, row, *strings]
    for _, lengths, data in sets:
        parts += [lengths, data]
    parts += [
        _diff(node_offsets).astype(_I64).tobytes(),
        np.asarray(o.node_index[:entries], dtype=_I32).tobytes(),
        np.asarray(o.accelerators[:entries], dtype=_I32).tobytes(),
    ]
    if ids_sent:
        ids, id_bytes = _utf8(o.option_ids[:n_options])
        parts += [id_bytes.tobytes(), ids]
    if named:
        parts += [
            _diff(np.asarray(o.device_offsets, dtype=np.int64)).astype(_I64).tobytes(),
            np.asarray(o.device_index[:n_named], dtype=_I32).tobytes(),
        ]
    parts.append(np.asarray(probabilities, dtype=_F64).tobytes())
    return b"".join(parts)
