"""Validation of a whole `RequestBatch` (or `OutcomeColumns`) by index (issue 24).

The same rules as `service.contract.validation.validate_request` (and what it
calls: device_validation, production, text, schema_versions, hardware) and
`validate_outcome`, computed as boolean arrays over the batch's rows (nodes,
hardware classes, devices, options, entries, named devices, probabilities,
strings, requests) instead of once per request. Each rule's rows are mapped to
the requests they belong to (snapshot rows through ``state_index``, option and
entry rows through the CSR offsets), and a request is refused by the *first*
rule it breaks in validate_request's order, naming the first offending element
as validate_request names it (``state.cpu_free[5]``, node index local to the
snapshot). A fault in a snapshot refuses every request that uses it with the
same field and message. Requests already refused by an earlier rule are not
looked at again, so a later rule only ever decides clean requests.

What is a Python loop here, and why:

- over rules (fixed, ~120 of them);
- over *refused* requests, to build each refusal's message (one string each);
- over hardware classes (a handful per snapshot: they are `HardwareClass`
  objects, and `str.strip` is the whitespace rule of their names);
- over the strings of a string-equality comparison (allowed hardware classes,
  affinity labels) only when one of them is longer than `_PADDED_WIDTH` bytes
  (shorter ones, always in practice, are compared as fixed-width rows);
- over the node ids of a snapshot only when two distinct ids collide in the
  64-bit hash the duplicate rule sorts by (found by the byte comparison of
  every equal pair; a crafted collision costs a set, not a wrong refusal).

Production's support check (`check_request_support`: no probability on an
option the feasibility function masks) joins the feasibility function's
columns from the batch's columns (`joined_feasibility`) and evaluates them
with the code `check_feasibility_batch` runs (`feasibility_of_joined`).

Structural faults (column lengths, offsets that do not index) are not a
request's fault: `check_layout` raises `InvalidInput` for the whole batch
(invariant 3), before any rule runs.

Text rules work on the UTF-8 buffers as uint8: a C0 control character is a
byte < 0x20 (UTF-8 never uses those bytes inside a multi-byte character), and
a string's length in characters (what ``len(str)`` counts, the limits' unit)
is its count of bytes that are not continuation bytes (``0b10xxxxxx``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.contract.actions import DEFER
from service.contract.batch import (
    FAILURE_OF_CODE,
    OutcomeColumns,
    ProductionColumns,
    RequestBatch,
    Strings,
)
from service.contract.batch.columns import NODE_FLAG_COLUMNS, NODE_NUMBER_COLUMNS
from service.contract.device_validation import _DERIVE, UNKNOWN_MEMORY_HINT
from service.contract.errors import InvalidInput, UnsupportedSchemaVersion
from service.contract.feasibility import _Batch as _FeasibilityColumns
from service.contract.feasibility import _device_sets, feasibility_of_joined
from service.contract.hardware import CAPABILITIES, HardwareClass
from service.contract.production import SUM_TOLERANCE
from service.contract.rejections import RejectionReason, refusal_of
from service.contract.request import SUPPORTED_SCHEMA_VERSIONS
from service.contract.schema_versions import V1_REFUSAL, V1_SCHEMA
from service.contract.text import RULE as TEXT_RULE
from service.contract.validation import (
    _DEFAULT_LIMITS,
    MAX_QUANTITY,
    MAX_UNIX_SECONDS,
    MAX_VOCABULARY_LENGTH,
    RequestLimits,
)
from service.contract.workload import WorkloadKind

I64 = NDArray[np.int64]
Mask = NDArray[np.bool_]

_SHOWN = 40  # characters of an offending string quoted back (service.contract.text)
_INT32_BOUND = 2**31 - 1


@dataclass(frozen=True, slots=True)
class IndexedRefusal:
    """One refused request of a batch: its position in what was sent (its row, for
    `validate_batch`), the field path as the single-request validator names it, the
    message (the `InvalidInput`'s ``problem``, without the field) and the reason code
    (`service.contract.rejections.refusal_of` of that error)."""

    index: int
    field: str
    message: str
    reason: RejectionReason


@dataclass(frozen=True, eq=False)
class BatchVerdict:
    """Per-request verdict of a batch: ``ok[r]`` True when request r is accepted;
    ``refusals`` one per refused request, sorted by index."""

    ok: NDArray[np.bool_]
    refusals: tuple[IndexedRefusal, ...]

    @property
    def n_accepted(self) -> int:
        """Requests accepted."""
        return int(np.count_nonzero(self.ok))


def refusal_from(index: int, exc: InvalidInput) -> IndexedRefusal:
    """The refusal of request `index` for `exc` (what validate_request raised)."""
    refusal = refusal_of(exc)
    assert refusal is not None  # an InvalidInput always names its field
    return IndexedRefusal(index, exc.field, exc.problem, refusal.reason)


# ---------------------------------------------------------------------------
# array helpers


def _segment_first(mask: Mask, offsets: I64, n_segments: int) -> tuple[Mask, I64]:
    """Per CSR segment: whether any row of `mask` is set, and the first such row's
    local index (-1 where none). Rows of a segment are contiguous (CSR)."""
    has = np.zeros(n_segments, dtype=np.bool_)
    first = np.full(n_segments, -1, dtype=np.int64)
    rows = np.flatnonzero(mask)
    if not len(rows):
        return has, first
    seg = np.searchsorted(offsets, rows, side="right") - 1
    keep = np.ones(len(rows), dtype=np.bool_)
    keep[1:] = seg[1:] != seg[:-1]
    seg, rows = seg[keep], rows[keep]
    has[seg] = True
    first[seg] = rows - offsets[seg]
    return has, first


def _counts_in(mask: Mask, offsets: I64) -> I64:
    """Set rows of `mask` per segment of `offsets` (any offsets within bounds)."""
    total = np.zeros(len(mask) + 1, dtype=np.int64)
    np.cumsum(mask, out=total[1:])
    return total[offsets[1:]] - total[offsets[:-1]]


def _repair(offsets: I64, bounds: I64) -> tuple[Mask, I64, I64]:
    """Offsets that may step backwards inside a segment (bounds: the offsets' positions
    where segments start, monotone): (segment has a backward step, its first local
    step + 1, offsets made monotone by flattening the bad segments to their start).

    A backward step is a request's (or snapshot's) own fault, refused by index;
    the repaired offsets keep every *other* segment's rows where they are, so the
    rules after it can map rows to segments by binary search.
    """
    n_seg = len(bounds) - 1
    steps = offsets[1:] - offsets[:-1]
    neg = steps < 0
    if not len(steps) or not neg.any():
        return np.zeros(n_seg, np.bool_), np.full(n_seg, -1, np.int64), offsets
    bad, first = _segment_first(neg, bounds, n_seg)
    pos = np.arange(len(offsets), dtype=np.int64)
    seg = np.minimum(np.searchsorted(bounds, pos, side="right") - 1, n_seg - 1)
    inside = bad[seg] & (pos > bounds[seg]) & (pos < bounds[seg + 1])
    fixed = offsets.copy()
    fixed[inside] = offsets[bounds[seg[inside]]]
    return bad, first + 1, fixed


class _Text:
    """Per-string facts of a `Strings` column, from its UTF-8 bytes (module docstring)."""

    def __init__(self, s: Strings) -> None:
        self.s = s
        o = np.asarray(s.offsets, dtype=np.int64) if len(s.offsets) else np.zeros(1, np.int64)
        self.offsets = o
        self.n = len(o) - 1
        self.raw = np.frombuffer(s.utf8, dtype=np.uint8)
        self.nbytes = o[1:] - o[:-1]

    @property
    def empty(self) -> Mask:
        empty: Mask = self.nbytes == 0
        return empty

    def control(self) -> Mask:
        """Strings holding a C0 control character."""
        low = self.raw < 0x20
        if not low.any():
            return np.zeros(self.n, np.bool_)
        return _counts_in(low, self.offsets) > 0

    def chars(self) -> I64:
        """Length in characters (code points) of each string."""
        if self.raw.size == 0 or not (self.raw >= 0x80).any():  # ASCII: bytes are characters
            return self.nbytes
        return _counts_in((self.raw & 0xC0) != 0x80, self.offsets)

    def value(self, i: int) -> str:
        return self.s[i]

    def hashes(self) -> NDArray[np.uint64]:
        """A 64-bit polynomial hash per string (equal strings hash alike; collisions are
        verified by whoever relies on equality)."""
        nb = self.nbytes
        if self.raw.size == 0:
            return np.zeros(self.n, np.uint64)
        top = int(nb.max())
        powers = np.full(top, 0x100000001B3, dtype=np.uint64)
        powers[0] = 1
        powers = np.cumprod(powers, dtype=np.uint64)
        start = np.repeat(self.offsets[:-1], nb)
        pos = np.arange(self.raw.size, dtype=np.int64) - start
        weighted = (self.raw.astype(np.uint64) + np.uint64(1)) * powers[pos]
        total = np.zeros(self.raw.size + 1, dtype=np.uint64)
        np.cumsum(weighted, out=total[1:])
        out: NDArray[np.uint64] = total[self.offsets[1:]] - total[self.offsets[:-1]]
        return out

    def short_codes(self, width: int = 8) -> tuple[Mask, NDArray[np.uint64]]:
        """Strings of at most `width` (<= 8) bytes as one exact uint64 code each."""
        fits = self.nbytes <= width
        codes = np.zeros((self.n, 8), dtype=np.uint8)
        rows = np.flatnonzero(fits)
        if len(rows) and self.raw.size:
            lengths = self.nbytes[rows]
            row = np.repeat(rows, lengths)
            start = np.repeat(self.offsets[rows], lengths)
            pos = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(
                np.cumsum(lengths) - lengths, lengths
            )
            codes[row, pos] = self.raw[start + pos]
        return fits, codes.view(np.uint64).reshape(-1)


def _code_of(text: str) -> int:
    raw = text.encode().ljust(8, b"\0")
    return int(np.frombuffer(raw, dtype=np.uint64)[0])


def _text_refusal(value: str, where: str = "") -> str:
    return f"{where}{TEXT_RULE}, got {value[:_SHOWN]!r}"


# ---------------------------------------------------------------------------
# the verdict being built


class _Verdicts:
    """Which requests are refused so far, and why (first rule wins)."""

    def __init__(self, batch: RequestBatch | None, n: int) -> None:
        self.refused = np.zeros(n, dtype=np.bool_)
        self.out: dict[int, IndexedRefusal] = {}
        self.state_index = batch.state_index if batch is not None else None

    def request(
        self,
        bad: Mask,
        problem: Callable[[int], tuple[str, str]],
        error: type[InvalidInput] = InvalidInput,
    ) -> None:
        """Refuse the requests of `bad` not refused yet; problem(r) -> (field, problem)."""
        if not bad.any():
            return
        new = np.flatnonzero(bad & ~self.refused)
        for r in new.tolist():
            field, text = problem(r)
            self.out[r] = refusal_from(r, error(field, text))
        self.refused[new] = True

    def snapshot(self, bad: Mask, problem: Callable[[int], tuple[str, str]]) -> None:
        """Refuse every request on a snapshot of `bad` (per snapshot) not refused yet,
        all with the snapshot's one field and message."""
        if not bad.any():
            return
        assert self.state_index is not None
        new = np.flatnonzero(bad[self.state_index] & ~self.refused)
        if not len(new):
            return
        made: dict[int, tuple[str, str]] = {}
        for r in new.tolist():
            s = int(self.state_index[r])
            if s not in made:
                made[s] = problem(s)
            field, text = made[s]
            self.out[r] = refusal_from(r, InvalidInput(field, text))
        self.refused[new] = True

    def verdict(self) -> BatchVerdict:
        return BatchVerdict(ok=~self.refused, refusals=tuple(self.out[r] for r in sorted(self.out)))


# ---------------------------------------------------------------------------
# layout: what must hold for the columns to be read into requests at all


def _layout_offsets(field: str, offsets: I64, n_rows: int, n_values: int) -> None:
    if len(offsets) != n_rows + 1:
        raise InvalidInput(field, f"must have {n_rows + 1} entries, got {len(offsets)}")
    if offsets[0] != 0 or offsets[-1] != n_values:
        raise InvalidInput(field, f"must run from 0 to {n_values}")


def _layout_monotone(field: str, offsets: I64) -> None:
    if len(offsets) > 1 and np.minimum.reduce(offsets[1:] - offsets[:-1]) < 0:
        raise InvalidInput(field, "must be non-decreasing")


def _layout_strings(field: str, s: Strings, n: int) -> None:
    if n == 0 and not len(s.offsets) and not s.utf8:
        return
    _layout_offsets(f"{field}.offsets", s.offsets, n, len(s.utf8))
    _layout_monotone(f"{field}.offsets", s.offsets)


def _layout_length(field: str, column: NDArray[np.generic], n: int, optional: bool = False) -> None:
    if len(column) != n and not (optional and len(column) == 0):
        raise InvalidInput(field, f"must have {n} values, got {len(column)}")


def _layout_set(field: str, offsets: I64, values: Strings, n: int) -> None:
    if not len(offsets):
        if len(values):
            raise InvalidInput(f"{field}_offsets", f"must be set when {field} is given")
        return
    _layout_offsets(f"{field}_offsets", offsets, n, len(values))
    _layout_monotone(f"{field}_offsets", offsets)
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
    _layout_offsets("states.hardware_offsets", st.hardware_offsets, n_states, len(st.hardware))
    _layout_monotone("states.hardware_offsets", st.hardware_offsets)
    for name in (*NODE_NUMBER_COLUMNS, *NODE_FLAG_COLUMNS):
        _layout_length(f"states.{name}", getattr(st, name), nn)
    for name in ("node_ids", "zone", "locality"):
        _layout_strings(f"states.{name}", getattr(st, name), nn)
    if len(st.label_offsets):
        _layout_offsets("states.label_offsets", st.label_offsets, nn, len(st.labels))
        _layout_monotone("states.label_offsets", st.label_offsets)
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
    _layout_offsets("options.option_offsets", o.option_offsets, n, n_options)
    _layout_monotone("options.option_offsets", o.option_offsets)
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
        _layout_offsets(
            "production.probability_offsets", p.probability_offsets, n, len(p.probabilities)
        )
        _layout_monotone("production.probability_offsets", p.probability_offsets)
    elif len(p.probabilities):
        raise InvalidInput("production.probability_offsets", "must be set with probabilities")


# ---------------------------------------------------------------------------
# requests


def validate_batch(batch: RequestBatch, limits: RequestLimits | None = None) -> BatchVerdict:
    """Each request's verdict as `validate_request` gives it, by index (module docstring).

    Raises:
        InvalidInput: the batch's columns cannot be read into requests (`check_layout`).
    """
    limits = limits or RequestLimits()
    check_layout(batch)
    return _Run(batch, limits).run()


class _Run:
    """One validation pass: the batch's columns, facts shared by several rules, and
    the rules in validate_request's order (one method per part)."""

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

    def run(self) -> BatchVerdict:
        if self.n == 0:
            return self.v.verdict()
        if self.b.schema_version not in SUPPORTED_SCHEMA_VERSIONS:
            version = self.b.schema_version
            self.v.request(
                np.ones(self.n, np.bool_),
                lambda r: (
                    "schema_version",
                    f"must be one of {sorted(SUPPORTED_SCHEMA_VERSIONS)}, got {version}",
                ),
                UnsupportedSchemaVersion,
            )
            return self.v.verdict()
        if self.b.schema_version == V1_SCHEMA:
            self.schema_1()
        self.ids_and_time()
        self.state()
        self.workload()
        self.options()
        self.production()
        self.quota()
        self.texts()
        self.support()
        return self.v.verdict()

    # --- helpers ---------------------------------------------------------

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

    # --- schema 1 ----------------------------------------------------------

    def schema_1(self) -> None:
        self.v.snapshot(self.sent.copy(), lambda s: ("state.device_offsets", V1_REFUSAL))
        st = self.st
        unknown = np.array(
            [[getattr(h, c) is None for c in CAPABILITIES] for h in st.hardware], dtype=np.bool_
        ).reshape(-1, len(CAPABILITIES))
        if unknown.any():
            bad, first = _segment_first(
                np.asarray(unknown.any(axis=1), np.bool_), self.hw_off, self.n_states
            )

            def caps(s: int) -> tuple[str, str]:
                i = int(first[s])
                c = int(np.flatnonzero(unknown[self.hw_off[s] + i])[0])
                return (
                    f"state.hardware[{i}].{CAPABILITIES[c]}",
                    "must be set in schema_version 1 (an unknown capability needs schema 2)",
                )

            self.v.snapshot(bad, caps)
        w = self.b.workloads
        kind = _Text(w.kind)
        fits, codes = kind.short_codes()
        known = np.zeros(self.n, np.bool_)
        for k in WorkloadKind:
            known |= fits & (codes == np.uint64(_code_of(k.value))) & (kind.nbytes == len(k.value))
        self.v.request(
            ~known,
            lambda r: (
                "workload.kind",
                "must be train, finetune, infer or batch in schema_version 1, "
                f"got {kind.value(r)[:40]!r}",
            ),
        )
        self.v.request(
            ~np.isnan(w.accelerator_share), lambda r: ("workload.accelerator_share", V1_REFUSAL)
        )
        self.v.request(~_Text(w.qos_class).empty, lambda r: ("workload.qos_class", V1_REFUSAL))
        o = self.b.options
        if len(o.devices_named):
            self.v.request(o.devices_named, lambda r: ("options.device_offsets", V1_REFUSAL))
        self.v.request(self.has_probs, lambda r: ("production.probabilities", V1_REFUSAL))
        self.v.request(
            self.present & ~np.isnan(self.defer),
            lambda r: ("production.defer_probability", V1_REFUSAL),
        )

    # --- request id and time ---------------------------------------------

    def ids_and_time(self) -> None:
        _ids(self.v, "request_id", _Text(self.b.request_id), self.limits.max_id_length)
        _time(self.v, "request_time", np.asarray(self.b.request_time, np.float64))

    # --- state ------------------------------------------------------------

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

    # --- workload ---------------------------------------------------------

    def workload(self) -> None:
        w, v = self.b.workloads, self.v
        _ids(v, "workload.workload_id", _Text(w.workload_id), _DEFAULT_LIMITS.max_id_length)
        for name in ("tenant", "model_family"):
            _control(v, f"workload.{name}", _Text(getattr(w, name)))
        for name in ("model_size_b", "accelerator_memory_gb", "cpu_per_node", "memory_per_node_gb"):
            x = np.asarray(getattr(w, name), np.float64)
            _finite_at_least_0(v, f"workload.{name}", x, "")
            _quantity(v, f"workload.{name}", x)
        acc = w.accelerators
        v.request(acc < 0, lambda r: ("workload.accelerators", f"must be >= 0, got {int(acc[r])}"))
        _vocabulary(v, "workload.kind", _Text(w.kind), required=True)
        _vocabulary(v, "workload.qos_class", _Text(w.qos_class), required=False)
        share = np.asarray(w.accelerator_share, np.float64)
        given = ~np.isnan(share)
        v.request(
            given & ~(np.isfinite(share) & (share > 0.0) & (share <= 1.0)),
            lambda r: ("workload.accelerator_share", f"must be in (0, 1], got {float(share[r])}"),
        )
        v.request(
            given & (acc != 0),
            lambda r: (
                "workload.accelerators",
                "must be 0 with workload.accelerator_share (a share of one device), "
                f"got {int(acc[r])}",
            ),
        )
        gang = w.gang_size
        v.request(gang < 1, lambda r: ("workload.gang_size", f"must be >= 1, got {int(gang[r])}"))
        for name in ("slo_seconds", "work_units"):
            x = np.asarray(getattr(w, name), np.float64)
            set_ = ~np.isnan(x)
            _positive_when_set(v, f"workload.{name}", x)
            _quantity(v, f"workload.{name}", np.where(set_, x, 0.0))

    # --- options ----------------------------------------------------------

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

    # --- production -------------------------------------------------------

    def production(self) -> None:
        if not self.present.any():
            return
        _production(self.v, self.pp, self.present, self.n_opts)

    def quota(self) -> None:
        q = self.b.quota_remaining
        if not len(q):
            return
        self.v.request(
            ~np.isnan(q) & ~(np.isfinite(q) & (q >= 0)),
            lambda r: ("quota_remaining", f"must be finite and >= 0, got {float(q[r])}"),
        )

    # --- texts ------------------------------------------------------------

    def texts(self) -> None:
        """`check_request_texts`, field by field in its order."""
        st, v = self.st, self.v
        ids = self.node_ids
        self.node_rule(
            ids.control(),
            lambda i, g: (f"state.node_ids[{i}]", _text_refusal(ids.value(g))),
        )
        names = [_has_control(h.name) for h in st.hardware]  # a loop over classes
        if any(names):
            has, first = _segment_first(np.array(names, np.bool_), self.hw_off, self.n_states)
            v.snapshot(
                has,
                lambda s: (
                    f"state.hardware[{int(first[s])}].name",
                    _text_refusal(st.hardware[int(self.hw_off[s] + first[s])].name),
                ),
            )
        for name in ("zone", "locality"):
            self.node_texts(name, _Text(getattr(st, name)))
        if len(st.label_offsets):
            labels = _Text(st.labels)
            bad_label = labels.control()
            if bad_label.any():
                node_bad = _counts_in(bad_label, np.asarray(st.label_offsets, np.int64)) > 0
                lo = st.label_offsets

                def label(i: int, g: int) -> tuple[str, str]:
                    values = sorted(labels.s.values(int(lo[g]), int(lo[g + 1])))
                    first = next(x for x in values if _has_control(x))
                    return "state.labels", _text_refusal(first, f"of node {i} ")

                self.node_rule(node_bad, label)
        o = self.b.options
        if len(o.option_ids_sent) and o.option_ids_sent.any():
            text = _Text(o.option_ids)
            per_request = np.where(o.option_ids_sent, self.n_opts, 0)
            id_off = np.zeros(self.n + 1, np.int64)
            np.cumsum(per_request, out=id_off[1:])
            self.request_rule(
                text.control(),
                id_off,
                lambda r, i, g: (f"options.option_ids[{i}]", _text_refusal(text.value(g))),
            )
        w = self.b.workloads
        for name in ("allowed_hardware", "affinity", "anti_affinity"):
            offsets = getattr(w, f"{name}_offsets")
            if not len(offsets):
                continue
            _set_texts(
                v, f"workload.{name}", np.asarray(offsets, np.int64), _Text(getattr(w, name))
            )

    def node_texts(self, name: str, text: _Text) -> None:
        """No control character in ``state.<name>[i]``."""
        self.node_rule(
            text.control(), lambda i, g: (f"state.{name}[{i}]", _text_refusal(text.value(g)))
        )

    # --- support ----------------------------------------------------------

    def support(self) -> None:
        """`check_request_support`: no probability on an option feasibility masks.

        The feasibility function's joined columns (`feasibility._Batch`) are built from
        the batch's columns (`joined_feasibility`), for the requests that carry a
        distribution and are not refused, and evaluated by the same code
        `check_feasibility_batch` runs (`feasibility_of_joined`): one pass, no
        request objects.
        """
        todo = np.flatnonzero(self.has_probs & ~self.v.refused)
        if not len(todo):
            return
        feasibility = feasibility_of_joined(joined_feasibility(self.b, todo))
        po = np.asarray(self.pp.probability_offsets, np.int64)
        counts = self.n_opts[todo]
        rows = _ragged(po[todo], counts)
        probs = self.pp.probabilities[rows]
        bad = (probs != 0.0) & ~feasibility.mask
        if not bad.any():
            return
        off = np.zeros(len(todo) + 1, np.int64)
        np.cumsum(counts, out=off[1:])
        has, first = _segment_first(bad, off, len(todo))
        mask = np.zeros(self.n, np.bool_)
        mask[todo[has]] = True
        where = {int(todo[k]): (k, int(first[k])) for k in np.flatnonzero(has).tolist()}

        def problem(r: int) -> tuple[str, str]:
            k, i = where[r]
            g = int(off[k]) + i
            signals = ", ".join(s.value for s in feasibility.failed(g))
            return (
                f"production.probabilities[{i}]",
                f"must be 0: option {i} is infeasible (signals {signals}), got {float(probs[g])}",
            )

        self.v.request(mask, problem)


def _ragged(starts: I64, lengths: I64) -> I64:
    """``concatenate([arange(a, a + n) for a, n in zip(starts, lengths)])`` without the loop."""
    lengths = np.asarray(lengths, np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(lengths)
    out: I64 = np.repeat(np.asarray(starts, np.int64) - (ends - lengths), lengths) + np.arange(
        total, dtype=np.int64
    )
    return out


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


def _counts_sum(values: NDArray[np.generic], offsets: I64) -> I64:
    total = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, dtype=np.int64, out=total[1:])
    return total[offsets[1:]] - total[offsets[:-1]]


def _finite_at_least_0(
    v: _Verdicts,
    field: str,
    x: NDArray[np.float64],
    when: str,
    shown: NDArray[np.float64] | None = None,
) -> None:
    shown = x if shown is None else shown
    v.request(
        ~np.isfinite(x) | (x < 0),
        lambda r: (field, f"must be finite and >= 0{when}, got {float(shown[r])}"),
    )


def _positive_when_set(v: _Verdicts, field: str, x: NDArray[np.float64]) -> None:
    v.request(
        ~np.isnan(x) & ~(np.isfinite(x) & (x > 0)),
        lambda r: (field, f"must be finite and > 0 when set, got {float(x[r])}"),
    )


def _set_texts(v: _Verdicts, field: str, offsets: I64, text: _Text) -> None:
    """No control character in a workload's string set (named unindexed, the first
    offending value in sorted order, as check_request_texts names it)."""
    bad = _counts_in(text.control(), offsets) > 0

    def first_sorted(r: int) -> str:
        values = sorted(text.s.values(int(offsets[r]), int(offsets[r + 1])))
        return next(x for x in values if _has_control(x))

    v.request(bad, lambda r: (field, _text_refusal(first_sorted(r))))


def _has_control(text: str) -> bool:
    return any(ord(c) < 0x20 for c in text)


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


def _ids(v: _Verdicts, field: str, text: _Text, max_length: int) -> None:
    """`_check_id`: non-empty, at most `max_length` characters, no control characters."""
    v.request(text.empty, lambda r: (field, "must be a non-empty string"))
    v.request(
        text.chars() > max_length, lambda r: (field, f"must be at most {max_length} characters")
    )
    _control(v, field, text)


def _control(v: _Verdicts, field: str, text: _Text) -> None:
    v.request(text.control(), lambda r: (field, _text_refusal(text.value(r))))


def _vocabulary(v: _Verdicts, field: str, text: _Text, required: bool) -> None:
    if required:
        v.request(text.empty, lambda r: (field, "must be a non-empty string"))
    chars = text.chars()
    v.request(
        chars > MAX_VOCABULARY_LENGTH,
        lambda r: (
            field,
            f"must be at most {MAX_VOCABULARY_LENGTH} characters, got {int(chars[r])}",
        ),
    )
    _control(v, field, text)


def _time(v: _Verdicts, field: str, t: NDArray[np.float64]) -> None:
    v.request(
        ~(np.isfinite(t) & (t > 0) & (t <= MAX_UNIX_SECONDS)),
        lambda r: (
            field,
            f"must be positive Unix seconds no later than {MAX_UNIX_SECONDS:.0f} "
            f"(year 9999), got {float(t[r])}",
        ),
    )


def _quantity(v: _Verdicts, field: str, x: NDArray[np.float64]) -> None:
    v.request(
        x > MAX_QUANTITY,
        lambda r: (field, f"must be at most {MAX_QUANTITY:g}, got {float(x[r])}"),
    )


def _production(v: _Verdicts, p: ProductionColumns, present: Mask, n_options: I64 | None) -> None:
    """`_check_production` and `check_distribution` over rows (n_options None: outcomes)."""
    n = len(present)
    option = p.option.astype(np.int64)
    bound = np.full(n, _INT32_BOUND, np.int64) if n_options is None else n_options
    v.request(
        present & (option != DEFER) & ~((option >= 0) & (option < bound)),
        lambda r: (
            "production.option",
            f"must be -1 (defer) or in [0, {int(bound[r])}), got {int(option[r])}",
        ),
    )
    prop = np.asarray(p.propensity, np.float64)
    sent = ~np.isnan(prop)
    v.request(
        present & sent & ~(np.isfinite(prop) & (prop > 0.0) & (prop <= 1.0)),
        lambda r: ("production.propensity", f"must be in (0, 1], got {float(prop[r])}"),
    )
    po = p.probability_offsets
    k = (po[1:] - po[:-1]) if len(po) else np.zeros(n, np.int64)
    has = present & (k > 0)
    defer_raw = np.asarray(p.defer_probability, np.float64)
    defer_sent = ~np.isnan(defer_raw)
    v.request(
        present & ~has & defer_sent,
        lambda r: (
            "production.defer_probability",
            "needs `production.probabilities` (one per option) alongside it",
        ),
    )
    if not has.any():
        return
    if n_options is not None:
        v.request(
            has & (k != n_options),
            lambda r: (
                "production.probabilities",
                f"must hold one probability per option ({int(n_options[r])}), got {int(k[r])}",
            ),
        )
    probs = np.asarray(p.probabilities, np.float64)
    po = np.asarray(po, np.int64)
    row_bad = ~((probs >= 0.0) & (probs <= 1.0))  # NaN fails it
    if row_bad.any():
        bad, first = _segment_first(row_bad, po, n)
        v.request(
            has & bad,
            lambda r: (
                f"production.probabilities[{int(first[r])}]",
                f"must be finite and in [0, 1], got {float(probs[po[r] + first[r]])}",
            ),
        )
    defer = np.where(defer_sent, defer_raw, 0.0)
    v.request(
        has & ~(np.isfinite(defer) & (defer >= 0.0) & (defer <= 1.0)),
        lambda r: (
            "production.defer_probability",
            f"must be finite and in [0, 1], got {float(defer[r])}",
        ),
    )
    # the sum: a per-row numpy sum (error below k * 1.2e-16) decides where it is clearly
    # in or out; math.fsum, what validate_request uses, decides the rows near the edge.
    # (A NaN or inf value is refused above; zeroed so it cannot spoil other rows.)
    clean = np.where(np.isfinite(probs), probs, 0.0)
    sums = np.zeros(n, np.float64)
    rows_with = k > 0  # their starts increase strictly: each sum runs to the next start
    sums[rows_with] = np.add.reduceat(clean, po[:-1][rows_with])
    approx = sums + defer
    off = np.abs(approx - 1.0)
    near = has & ~v.refused & (np.abs(off - SUM_TOLERANCE) < 1e-9 + 1e-12 * k)
    exact = {
        r: math.fsum(probs[po[r] : po[r + 1]].tolist()) + float(defer[r])
        for r in np.flatnonzero(near).tolist()  # rows at the edge only
    }
    wrong = has & (off > SUM_TOLERANCE)
    for r, t in exact.items():
        wrong[r] = abs(t - 1.0) > SUM_TOLERANCE

    def sum_problem(r: int) -> tuple[str, str]:
        t = exact.get(r)
        if t is None:
            t = math.fsum(probs[po[r] : po[r + 1]].tolist()) + float(defer[r])
        return (
            "production.probabilities",
            "must sum to 1 with `production.defer_probability` "
            f"(within {SUM_TOLERANCE:g}), got {t!r}",
        )

    v.request(wrong, sum_problem)
    v.request(
        has & (option != DEFER) & (option >= k),
        lambda r: (
            "production.option",
            f"must index `production.probabilities` (< {int(k[r])}), got {int(option[r])}",
        ),
    )
    inside = (option >= 0) & (option < k)
    pick = np.where(has & inside, po[:-1] + np.where(inside, option, 0), 0)
    chosen = np.where(
        option == DEFER,
        defer,
        probs[np.minimum(pick, max(len(probs) - 1, 0))] if len(probs) else 0.0,
    )

    def where(r: int) -> str:
        o = int(option[r])
        return "production.defer_probability" if o == DEFER else f"production.probabilities[{o}]"

    v.request(
        has & (chosen <= 0.0),
        lambda r: (where(r), f"must be > 0: production chose it, got {float(chosen[r])}"),
    )
    v.request(
        has & sent & (np.abs(prop - chosen) > SUM_TOLERANCE),
        lambda r: (
            "production.propensity",
            f"must equal `{where(r)}` (within {SUM_TOLERANCE:g}), "
            f"got {float(prop[r])} vs {float(chosen[r])}",
        ),
    )


# ---------------------------------------------------------------------------
# outcomes


def check_outcome_layout(cols: OutcomeColumns) -> None:
    """Raise `InvalidInput` (the whole batch) unless the columns can be read into outcomes."""
    n = cols.n_outcomes
    _layout_strings("request_id", cols.request_id, n)
    _layout_length("observed_at", cols.observed_at, n)
    _layout_length("failure", cols.failure, n)
    for name in ("queue_delay_s", "throughput", "completion_time_s", "slo_met"):
        _layout_length(name, getattr(cols, name), n, optional=True)
    _layout_production(cols.production, n)


def validate_outcome_batch(
    cols: OutcomeColumns, limits: RequestLimits | None = None
) -> BatchVerdict:
    """Each outcome's verdict as `validate_outcome` gives it, by index.

    An unknown ``failure`` code is refused first, as the single-outcome decoder
    refuses it (service.wire.convert), since no `Outcome` can carry it.

    Raises:
        InvalidInput: the columns cannot be read into outcomes (`check_outcome_layout`).
    """
    limits = limits or RequestLimits()
    check_outcome_layout(cols)
    n = cols.n_outcomes
    v = _Verdicts(None, n)
    if n == 0:
        return v.verdict()
    failure = cols.failure
    known = np.isin(failure, np.array(sorted(FAILURE_OF_CODE), dtype=np.uint8))
    v.request(
        ~known,
        lambda r: (
            "failure",
            f"must be none, oom, preempted, crashed or other, got {int(failure[r])}",
        ),
    )
    _ids(v, "request_id", _Text(cols.request_id), limits.max_id_length)
    _time(v, "observed_at", np.asarray(cols.observed_at, np.float64))
    for name in ("queue_delay_s", "throughput", "completion_time_s"):
        x = np.asarray(getattr(cols, name), np.float64)
        if not len(x):
            continue
        _finite_at_least_0(v, name, np.where(np.isnan(x), 0.0, x), " when set", x)
    p = cols.production
    if len(p.present) and p.present.any():
        present = np.asarray(p.present, np.bool_)
        v.request(
            present & (p.option < DEFER),
            lambda r: ("production.option", "must be -1 (defer) or an option index"),
        )
        _production(v, p, present, None)
    return v.verdict()


__all__ = [
    "BatchVerdict",
    "IndexedRefusal",
    "check_layout",
    "check_outcome_layout",
    "refusal_from",
    "validate_batch",
    "validate_outcome_batch",
]
