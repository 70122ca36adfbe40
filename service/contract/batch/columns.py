"""Many mirrored requests in columns: the batch form of the contract (issue 24).

Why a second form of the same requests: a `MirrorRequest` is a tree of Python
objects (eleven arrays, tuples of node strings, frozensets of labels), and
building, validating and hashing that tree per request is what cost ~2,400 us
of CPU per mirrored request. A `RequestBatch` holds N requests as flat numpy
columns across the whole batch, in CSR where a request owns a variable number
of rows, with each cluster snapshot stored once (the requests of one
scheduling cycle share it). Ingest validates, hashes and journals a batch with
array operations over these columns and builds no per-node or per-request
object; the scorer turns a batch back into objects (`RequestBatch.requests`)
until the columnar scorer (issue 25) reads the columns directly.

The two forms mean the same thing: ``RequestBatch.from_requests(rs).requests()``
gives requests equal to ``rs`` field by field (tests/contract/test_batch.py),
and the wire's `MirrorBatch` message is this dataclass column for column
(`service.wire.batch_codec`). Layout rules (docs/contract.md, "Batch form"):

- ``*_offsets`` are int64 CSR: n + 1 entries from 0, non-decreasing, ending at
  the length of what they index. An *empty* offsets column means "none at
  all" where a field is optional (labels, devices, string sets).
- An optional number is float64 with NaN for "not given".
- Indexes inside a request (``node_index``, ``device_index``,
  ``node_hardware``, ``device_hardware``) are local to the request's snapshot,
  exactly as in a single request, so a request means the same in any batch.
- Strings are `Strings`: UTF-8 bytes concatenated, with int64 offsets.

Nothing here validates content (that is `service.contract.batch.validation`,
by index, so one bad request never refuses its batch-mates); constructors only
check what they need to build the columns.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.contract.actions import PlacementOptions
from service.contract.hardware import HardwareClass
from service.contract.outcome import FailureKind, Outcome
from service.contract.request import MirrorRequest, ProductionDecision
from service.contract.state import EMPTY_F32, EMPTY_I32, EMPTY_I64, ClusterState, frozen_array
from service.contract.workload import Workload

EMPTY_F64: NDArray[np.float64] = np.zeros(0, dtype=np.float64)
EMPTY_F64.flags.writeable = False
EMPTY_U8: NDArray[np.uint8] = np.zeros(0, dtype=np.uint8)
EMPTY_U8.flags.writeable = False

BATCH_SCHEMA_VERSION = 2
"""What a `MirrorBatch` on the wire speaks. Internally a batch of one may be schema 1
(the single-request RPCs serve a schema-1 request as a batch of one)."""

NODE_NUMBER_COLUMNS = (
    "node_hardware",
    "accelerators_free",
    "accelerators_total",
    "cpu_free",
    "cpu_total",
    "memory_free_gb",
    "memory_total_gb",
    "utilisation",
    "queue_length",
)
"""The per-node numeric columns, in wire order (validation, identity and the codec walk them)."""
NODE_FLAG_COLUMNS = ("healthy", "draining")
"""The per-node flag columns (u8 0/1 on the wire), after the numeric ones."""

SLO_MET_UNKNOWN = 2
"""`OutcomeColumns.slo_met` value for "not given" (0 false, 1 true)."""


def _offsets(counts: Sequence[int] | NDArray[Any]) -> NDArray[np.int64]:
    """CSR offsets (n + 1 entries from 0) from per-row counts."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    if len(counts):
        np.cumsum(counts, out=out[1:])
    out.flags.writeable = False
    return out


def _opt(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _unopt(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


@dataclass(frozen=True, eq=False)
class Strings:
    """A column of strings: UTF-8 bytes concatenated, value i at ``utf8[o[i]:o[i+1]]``.

    One bytes object for a whole column, so a column of a thousand node ids is
    two buffers, not a thousand Python strings, until something asks for one.
    """

    utf8: bytes
    offsets: NDArray[np.int64]

    @classmethod
    def of(cls, values: Iterable[str]) -> Strings:
        """The column of `values` (each encoded as UTF-8)."""
        encoded = [v.encode() for v in values]
        return cls(b"".join(encoded), _offsets([len(e) for e in encoded]))

    def __len__(self) -> int:
        return max(len(self.offsets) - 1, 0)

    def byte_lengths(self) -> NDArray[np.int64]:
        """Bytes per value (a value's UTF-8 length, not its character count)."""
        return np.diff(self.offsets) if len(self.offsets) else EMPTY_I64

    def __getitem__(self, i: int) -> str:
        o = self.offsets
        return self.utf8[int(o[i]) : int(o[i + 1])].decode()

    def values(self, start: int = 0, stop: int | None = None) -> tuple[str, ...]:
        """Values ``start:stop`` as strings (decoded once, split on the offsets)."""
        n = len(self)
        stop = n if stop is None else stop
        if stop <= start:
            return ()
        o = self.offsets
        a, b = int(o[start]), int(o[stop])
        text = self.utf8[a:b]
        if text.isascii():  # byte offsets are character offsets: slice the str
            s = text.decode()
            cut = (o[start : stop + 1] - a).tolist()
            return tuple(s[x:y] for x, y in itertools.pairwise(cut))
        return tuple(self[i] for i in range(start, stop))


EMPTY_STRINGS = Strings(b"", EMPTY_I64)


@dataclass(frozen=True, eq=False)
class StateColumns:
    """Every cluster snapshot of a batch, nodes concatenated (wire: ``ClusterStates``).

    Snapshot s owns nodes ``node_offsets[s]:node_offsets[s+1]`` of every per-node
    column, hardware classes ``hardware_offsets[s]:hardware_offsets[s+1]`` of
    ``hardware``, and its nodes' devices by ``device_offsets`` (global over the
    batch's devices). ``devices_sent[s]`` says whether snapshot s sent per-device
    data (else its devices are derived from the node counts and its nodes own no
    device rows here); ``device_ids_sent[s]`` whether its devices carry ids (in
    device order, in ``device_ids``). Empty flag columns mean "none".
    """

    node_offsets: NDArray[np.int64]
    hardware_offsets: NDArray[np.int64]
    hardware: tuple[HardwareClass, ...]
    node_ids: Strings
    node_hardware: NDArray[np.int32]
    accelerators_free: NDArray[np.int32]
    accelerators_total: NDArray[np.int32]
    cpu_free: NDArray[np.float32]
    cpu_total: NDArray[np.float32]
    memory_free_gb: NDArray[np.float32]
    memory_total_gb: NDArray[np.float32]
    utilisation: NDArray[np.float32]
    queue_length: NDArray[np.int32]
    healthy: NDArray[np.bool_]
    draining: NDArray[np.bool_]
    zone: Strings
    locality: Strings
    label_offsets: NDArray[np.int64]
    labels: Strings
    devices_sent: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))
    device_offsets: NDArray[np.int64] = field(default_factory=lambda: EMPTY_I64)
    device_hardware: NDArray[np.int32] = field(default_factory=lambda: EMPTY_I32)
    device_free_share: NDArray[np.float32] = field(default_factory=lambda: EMPTY_F32)
    device_free_memory_gb: NDArray[np.float32] = field(default_factory=lambda: EMPTY_F32)
    device_ids_sent: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))
    device_ids: Strings = EMPTY_STRINGS

    @property
    def n_states(self) -> int:
        """Snapshots in the batch."""
        return max(len(self.node_offsets) - 1, 0)

    @property
    def n_nodes(self) -> int:
        """Nodes over all snapshots."""
        return int(self.node_offsets[-1]) if len(self.node_offsets) else 0

    def state(self, s: int) -> ClusterState:
        """Snapshot `s` as the single-request object (what decoding it alone gives)."""
        a, b = int(self.node_offsets[s]), int(self.node_offsets[s + 1])
        ha, hb = int(self.hardware_offsets[s]), int(self.hardware_offsets[s + 1])
        if len(self.label_offsets):
            lo = self.label_offsets[a : b + 1]
            values = self.labels.values(int(lo[0]), int(lo[-1]))
            cut = (lo - lo[0]).tolist()
            labels = tuple(frozenset(values[x:y]) for x, y in itertools.pairwise(cut))
        else:
            labels = (frozenset(),) * (b - a)
        devices: dict[str, Any] = {}
        if len(self.devices_sent) and self.devices_sent[s]:
            do = self.device_offsets[a : b + 1]
            da, db = int(do[0]), int(do[-1])
            devices = {
                "device_offsets": frozen_array(do - da, np.int64),
                "device_hardware": frozen_array(self.device_hardware[da:db], np.int32),
                "device_free_share": frozen_array(self.device_free_share[da:db], np.float32),
                "device_free_memory_gb": frozen_array(
                    self.device_free_memory_gb[da:db], np.float32
                ),
            }
            if len(self.device_ids_sent) and self.device_ids_sent[s]:
                first = self._first_device_id(s)
                devices["device_ids"] = self.device_ids.values(first, first + (db - da))
        return ClusterState(
            node_ids=self.node_ids.values(a, b),
            hardware=self.hardware[ha:hb],
            node_hardware=frozen_array(self.node_hardware[a:b], np.int32),
            accelerators_free=frozen_array(self.accelerators_free[a:b], np.int32),
            accelerators_total=frozen_array(self.accelerators_total[a:b], np.int32),
            cpu_free=frozen_array(self.cpu_free[a:b], np.float32),
            cpu_total=frozen_array(self.cpu_total[a:b], np.float32),
            memory_free_gb=frozen_array(self.memory_free_gb[a:b], np.float32),
            memory_total_gb=frozen_array(self.memory_total_gb[a:b], np.float32),
            utilisation=frozen_array(self.utilisation[a:b], np.float32),
            queue_length=frozen_array(self.queue_length[a:b], np.int32),
            healthy=frozen_array(self.healthy[a:b], np.bool_),
            draining=frozen_array(self.draining[a:b], np.bool_),
            zone=self.zone.values(a, b),
            locality=self.locality.values(a, b),
            labels=labels,
            **devices,
        )

    def _first_device_id(self, s: int) -> int:
        """Index in ``device_ids`` of snapshot s's first id: ids of earlier snapshots that
        send them come first."""
        sent = self.device_ids_sent[:s] & self.devices_sent[:s]
        if not sent.any():
            return 0
        starts = self.device_offsets[self.node_offsets[:-1][:s]]
        ends = self.device_offsets[self.node_offsets[1:][:s]]
        return int(np.sum((ends - starts)[sent]))

    @classmethod
    def of(cls, states: Sequence[ClusterState]) -> StateColumns:
        """Columns of `states`, in order."""
        nodes = [s.n_nodes for s in states]
        any_labels = any(any(ls) for s in states for ls in (s.labels,))
        any_devices = any(s.has_devices for s in states)
        devices_sent = np.array([s.has_devices for s in states], dtype=np.bool_)
        ids_sent = np.array([s.has_devices and bool(s.device_ids) for s in states], dtype=np.bool_)

        def cat(name: str, dtype: type[Any]) -> NDArray[Any]:
            parts = [np.asarray(getattr(s, name), dtype=dtype) for s in states]
            return frozen_array(np.concatenate(parts) if parts else np.zeros(0, dtype), dtype)

        label_counts = [len(ls) for s in states for ls in s.labels]
        label_values = [v for s in states for ls in s.labels for v in sorted(ls)]
        if any_devices:
            per_node = np.concatenate(
                [
                    np.diff(s.device_offsets) if s.has_devices else np.zeros(s.n_nodes, np.int64)
                    for s in states
                ]
            )
            device_offsets = _offsets(per_node)
            with_devices = [s for s in states if s.has_devices]
            dev: dict[str, Any] = {
                "device_offsets": device_offsets,
                "device_hardware": frozen_array(
                    np.concatenate([s.device_hardware for s in with_devices]), np.int32
                ),
                "device_free_share": frozen_array(
                    np.concatenate([s.device_free_share for s in with_devices]), np.float32
                ),
                "device_free_memory_gb": frozen_array(
                    np.concatenate([s.device_free_memory_gb for s in with_devices]), np.float32
                ),
                "devices_sent": devices_sent,
                "device_ids_sent": ids_sent if ids_sent.any() else np.zeros(0, np.bool_),
                "device_ids": Strings.of(
                    v for s in with_devices if s.device_ids for v in s.device_ids
                ),
            }
        else:
            dev = {}
        return cls(
            node_offsets=_offsets(nodes),
            hardware_offsets=_offsets([len(s.hardware) for s in states]),
            hardware=tuple(h for s in states for h in s.hardware),
            node_ids=Strings.of(v for s in states for v in s.node_ids),
            node_hardware=cat("node_hardware", np.int32),
            accelerators_free=cat("accelerators_free", np.int32),
            accelerators_total=cat("accelerators_total", np.int32),
            cpu_free=cat("cpu_free", np.float32),
            cpu_total=cat("cpu_total", np.float32),
            memory_free_gb=cat("memory_free_gb", np.float32),
            memory_total_gb=cat("memory_total_gb", np.float32),
            utilisation=cat("utilisation", np.float32),
            queue_length=cat("queue_length", np.int32),
            healthy=cat("healthy", np.bool_),
            draining=cat("draining", np.bool_),
            zone=Strings.of(v for s in states for v in s.zone),
            locality=Strings.of(v for s in states for v in s.locality),
            label_offsets=_offsets(label_counts) if any_labels else EMPTY_I64,
            labels=Strings.of(label_values) if any_labels else EMPTY_STRINGS,
            **dev,
        )


@dataclass(frozen=True, eq=False)
class WorkloadColumns:
    """One workload per request (wire: ``Workloads``). The three string sets are CSR over
    requests (empty offsets: no request has any)."""

    workload_id: Strings
    kind: Strings
    model_family: Strings
    model_size_b: NDArray[np.float64]
    accelerators: NDArray[np.int32]
    accelerator_memory_gb: NDArray[np.float64]
    cpu_per_node: NDArray[np.float64]
    memory_per_node_gb: NDArray[np.float64]
    gang_size: NDArray[np.int32]
    priority: NDArray[np.int32]
    tenant: Strings
    slo_seconds: NDArray[np.float64]
    work_units: NDArray[np.float64]
    accelerator_share: NDArray[np.float64]
    qos_class: Strings
    allowed_hardware_offsets: NDArray[np.int64] = field(default_factory=lambda: EMPTY_I64)
    allowed_hardware: Strings = EMPTY_STRINGS
    affinity_offsets: NDArray[np.int64] = field(default_factory=lambda: EMPTY_I64)
    affinity: Strings = EMPTY_STRINGS
    anti_affinity_offsets: NDArray[np.int64] = field(default_factory=lambda: EMPTY_I64)
    anti_affinity: Strings = EMPTY_STRINGS

    def workload(self, r: int) -> Workload:
        """Request r's workload as the single-request object."""

        def strings(offsets: NDArray[np.int64], values: Strings) -> frozenset[str]:
            if not len(offsets):
                return frozenset()
            return frozenset(values.values(int(offsets[r]), int(offsets[r + 1])))

        return Workload(
            workload_id=self.workload_id[r],
            kind=self.kind[r],
            model_family=self.model_family[r],
            model_size_b=float(self.model_size_b[r]),
            accelerators=int(self.accelerators[r]),
            accelerator_memory_gb=float(self.accelerator_memory_gb[r]),
            cpu_per_node=float(self.cpu_per_node[r]),
            memory_per_node_gb=float(self.memory_per_node_gb[r]),
            gang_size=int(self.gang_size[r]),
            priority=int(self.priority[r]),
            tenant=self.tenant[r],
            slo_seconds=_unopt(float(self.slo_seconds[r])),
            work_units=_unopt(float(self.work_units[r])),
            allowed_hardware=strings(self.allowed_hardware_offsets, self.allowed_hardware),
            affinity=strings(self.affinity_offsets, self.affinity),
            anti_affinity=strings(self.anti_affinity_offsets, self.anti_affinity),
            accelerator_share=_unopt(float(self.accelerator_share[r])),
            qos_class=self.qos_class[r],
        )

    @classmethod
    def of(cls, workloads: Sequence[Workload]) -> WorkloadColumns:
        """Columns of `workloads`, in order (string sets sorted, so equal sets encode alike)."""

        def f64(name: str) -> NDArray[np.float64]:
            return frozen_array([getattr(w, name) for w in workloads], np.float64)

        def opt(name: str) -> NDArray[np.float64]:
            return frozen_array([_opt(getattr(w, name)) for w in workloads], np.float64)

        def i32(name: str) -> NDArray[np.int32]:
            return frozen_array([getattr(w, name) for w in workloads], np.int32)

        def sets(name: str) -> dict[str, Any]:
            values = [sorted(getattr(w, name)) for w in workloads]
            if not any(values):
                return {}
            return {
                f"{name}_offsets": _offsets([len(v) for v in values]),
                name: Strings.of(x for v in values for x in v),
            }

        return cls(
            workload_id=Strings.of(w.workload_id for w in workloads),
            kind=Strings.of(str(w.kind) for w in workloads),
            model_family=Strings.of(w.model_family for w in workloads),
            model_size_b=f64("model_size_b"),
            accelerators=i32("accelerators"),
            accelerator_memory_gb=f64("accelerator_memory_gb"),
            cpu_per_node=f64("cpu_per_node"),
            memory_per_node_gb=f64("memory_per_node_gb"),
            gang_size=i32("gang_size"),
            priority=i32("priority"),
            tenant=Strings.of(w.tenant for w in workloads),
            slo_seconds=opt("slo_seconds"),
            work_units=opt("work_units"),
            accelerator_share=opt("accelerator_share"),
            qos_class=Strings.of(w.qos_class for w in workloads),
            **sets("allowed_hardware"),
            **sets("affinity"),
            **sets("anti_affinity"),
        )


@dataclass(frozen=True, eq=False)
class OptionColumns:
    """Every request's placement options, concatenated (wire: ``Options``).

    Request r owns options ``option_offsets[r]:option_offsets[r+1]``; option k
    covers entries ``entry_offsets[k]:entry_offsets[k+1]``. ``option_ids_sent[r]``
    / ``devices_named[r]``: whether request r's options carry ids / name devices
    (empty: none does); ids are one per option of those requests, in order.
    """

    option_offsets: NDArray[np.int64]
    entry_offsets: NDArray[np.int64]
    node_index: NDArray[np.int32]
    accelerators: NDArray[np.int32]
    option_ids_sent: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, np.bool_))
    option_ids: Strings = EMPTY_STRINGS
    devices_named: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, np.bool_))
    device_offsets: NDArray[np.int64] = field(default_factory=lambda: EMPTY_I64)
    device_index: NDArray[np.int32] = field(default_factory=lambda: EMPTY_I32)

    def options(self, r: int) -> PlacementOptions:
        """Request r's options as the single-request object."""
        oa, ob = int(self.option_offsets[r]), int(self.option_offsets[r + 1])
        eo = self.entry_offsets[oa : ob + 1]
        ea, eb = int(eo[0]), int(eo[-1])
        ids: tuple[str, ...] = ()
        if len(self.option_ids_sent) and self.option_ids_sent[r]:
            first = int(np.sum(np.diff(self.option_offsets)[:r][self.option_ids_sent[:r]]))
            ids = self.option_ids.values(first, first + (ob - oa))
        devices: dict[str, Any] = {}
        if len(self.devices_named) and self.devices_named[r]:
            do = self.device_offsets[ea : eb + 1]
            devices = {
                "device_offsets": frozen_array(do - do[0], np.int64),
                "device_index": frozen_array(self.device_index[int(do[0]) : int(do[-1])], np.int32),
            }
        return PlacementOptions(
            node_offsets=frozen_array(eo - ea, np.int64),
            node_index=frozen_array(self.node_index[ea:eb], np.int32),
            accelerators=frozen_array(self.accelerators[ea:eb], np.int32),
            option_ids=ids,
            **devices,
        )

    @classmethod
    def of(cls, options: Sequence[PlacementOptions]) -> OptionColumns:
        """Columns of `options` (one `PlacementOptions` per request), in order."""
        entries: NDArray[np.int64] = (
            np.concatenate([np.diff(o.node_offsets) for o in options]) if options else EMPTY_I64
        )
        named = np.array([o.names_devices for o in options], dtype=np.bool_)
        ids_sent = np.array([bool(o.option_ids) for o in options], dtype=np.bool_)
        dev: dict[str, Any] = {}
        if named.any():
            per_entry = np.concatenate(
                [
                    np.diff(o.device_offsets)
                    if o.names_devices
                    else np.zeros(len(o.node_index), np.int64)
                    for o in options
                ]
            )
            dev = {
                "devices_named": named,
                "device_offsets": _offsets(per_entry),
                "device_index": frozen_array(
                    np.concatenate([o.device_index for o in options if o.names_devices]), np.int32
                ),
            }
        return cls(
            option_offsets=_offsets([o.n_options for o in options]),
            entry_offsets=_offsets(np.asarray(entries, dtype=np.int64)),
            node_index=frozen_array(
                np.concatenate([o.node_index for o in options]) if options else [], np.int32
            ),
            accelerators=frozen_array(
                np.concatenate([o.accelerators for o in options]) if options else [], np.int32
            ),
            option_ids_sent=ids_sent if ids_sent.any() else np.zeros(0, np.bool_),
            option_ids=Strings.of(v for o in options for v in o.option_ids),
            **dev,
        )


@dataclass(frozen=True, eq=False)
class ProductionColumns:
    """Production's decision per row (wire: ``Productions``); empty ``present`` = none.

    ``probability_offsets`` is CSR over rows (empty: no row sends a distribution;
    an empty slice: that row does not).
    """

    present: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, np.bool_))
    option: NDArray[np.int32] = field(default_factory=lambda: EMPTY_I32)
    propensity: NDArray[np.float64] = field(default_factory=lambda: EMPTY_F64)
    probability_offsets: NDArray[np.int64] = field(default_factory=lambda: EMPTY_I64)
    probabilities: NDArray[np.float64] = field(default_factory=lambda: EMPTY_F64)
    defer_probability: NDArray[np.float64] = field(default_factory=lambda: EMPTY_F64)

    def decision(self, r: int) -> ProductionDecision | None:
        """Row r's decision as the single-request object (None when absent)."""
        if not len(self.present) or not self.present[r]:
            return None
        probabilities: tuple[float, ...] | None = None
        if len(self.probability_offsets):
            a, b = int(self.probability_offsets[r]), int(self.probability_offsets[r + 1])
            if b > a:
                probabilities = tuple(self.probabilities[a:b].tolist())
        return ProductionDecision(
            option=int(self.option[r]),
            propensity=_unopt(float(self.propensity[r])),
            probabilities=probabilities,
            defer_probability=_unopt(float(self.defer_probability[r])),
        )

    @classmethod
    def of(cls, decisions: Sequence[ProductionDecision | None]) -> ProductionColumns:
        """Columns of `decisions` (None = no decision for that row)."""
        if not any(d is not None for d in decisions):
            return cls()
        probs = [d.probabilities if d is not None and d.probabilities else () for d in decisions]
        any_probs = any(probs)
        return cls(
            present=np.array([d is not None for d in decisions], dtype=np.bool_),
            option=frozen_array([d.option if d is not None else 0 for d in decisions], np.int32),
            propensity=frozen_array(
                [_opt(d.propensity) if d is not None else math.nan for d in decisions], np.float64
            ),
            probability_offsets=_offsets([len(p) for p in probs]) if any_probs else EMPTY_I64,
            probabilities=frozen_array([x for p in probs for x in p], np.float64),
            defer_probability=frozen_array(
                [_opt(d.defer_probability) if d is not None else math.nan for d in decisions],
                np.float64,
            ),
        )


@dataclass(frozen=True, eq=False)
class RequestBatch:
    """N mirrored requests in columns (wire: ``MirrorBatch``); request r uses snapshot
    ``state_index[r]``. ``quota_remaining`` is NaN for "unlimited" (or empty: all)."""

    schema_version: int
    request_id: Strings
    request_time: NDArray[np.float64]
    state_index: NDArray[np.int64]
    states: StateColumns
    workloads: WorkloadColumns
    options: OptionColumns
    production: ProductionColumns = field(default_factory=ProductionColumns)
    quota_remaining: NDArray[np.float64] = field(default_factory=lambda: EMPTY_F64)

    @property
    def n_requests(self) -> int:
        """Requests in the batch."""
        return len(self.request_id)

    def requests(self, indexes: Iterable[int] | None = None) -> list[MirrorRequest]:
        """The requests (or those at `indexes`) as single-request objects; a snapshot shared
        by several requests becomes one `ClusterState` they share."""
        wanted = range(self.n_requests) if indexes is None else indexes
        states: dict[int, ClusterState] = {}
        out: list[MirrorRequest] = []
        for r in wanted:
            s = int(self.state_index[r])
            state = states.get(s)
            if state is None:
                state = states[s] = self.states.state(s)
            quota = _unopt(float(self.quota_remaining[r])) if len(self.quota_remaining) else None
            out.append(
                MirrorRequest(
                    schema_version=self.schema_version,
                    request_id=self.request_id[r],
                    request_time=float(self.request_time[r]),
                    state=state,
                    workload=self.workloads.workload(r),
                    options=self.options.options(r),
                    production=self.production.decision(r),
                    quota_remaining=quota,
                )
            )
        return out

    @classmethod
    def from_requests(cls, requests: Sequence[MirrorRequest]) -> RequestBatch:
        """The batch of `requests`, in order. Requests holding the *same* `ClusterState`
        object share one snapshot (the requests of one scheduling cycle); equal but
        distinct objects are stored twice, which changes nothing but size.

        Raises:
            ValueError: the requests speak different schema versions (a batch has one).
        """
        versions = {r.schema_version for r in requests}
        if len(versions) > 1:
            raise ValueError(f"a batch speaks one schema version, got {sorted(versions)}")
        index_of: dict[int, int] = {}
        states: list[ClusterState] = []
        state_index = np.empty(len(requests), dtype=np.int64)
        for i, r in enumerate(requests):
            s = index_of.get(id(r.state))
            if s is None:
                s = index_of[id(r.state)] = len(states)
                states.append(r.state)
            state_index[i] = s
        state_index.flags.writeable = False
        quotas = [r.quota_remaining for r in requests]
        return cls(
            schema_version=versions.pop() if versions else BATCH_SCHEMA_VERSION,
            request_id=Strings.of(r.request_id for r in requests),
            request_time=frozen_array([r.request_time for r in requests], np.float64),
            state_index=state_index,
            states=StateColumns.of(states),
            workloads=WorkloadColumns.of([r.workload for r in requests]),
            options=OptionColumns.of([r.options for r in requests]),
            production=ProductionColumns.of([r.production for r in requests]),
            quota_remaining=(
                frozen_array([_opt(q) for q in quotas], np.float64)
                if any(q is not None for q in quotas)
                else EMPTY_F64
            ),
        )


@dataclass(frozen=True, eq=False)
class OutcomeColumns:
    """N outcome reports in columns (wire: ``OutcomeBatch``). Optional numbers are NaN for
    "not given" (or the column empty: none given); ``slo_met`` is 0, 1 or
    `SLO_MET_UNKNOWN`; ``failure`` is the `FailureKind` code (wire enum value)."""

    request_id: Strings
    observed_at: NDArray[np.float64]
    failure: NDArray[np.uint8]
    queue_delay_s: NDArray[np.float64] = field(default_factory=lambda: EMPTY_F64)
    throughput: NDArray[np.float64] = field(default_factory=lambda: EMPTY_F64)
    completion_time_s: NDArray[np.float64] = field(default_factory=lambda: EMPTY_F64)
    slo_met: NDArray[np.uint8] = field(default_factory=lambda: EMPTY_U8)
    production: ProductionColumns = field(default_factory=ProductionColumns)

    @property
    def n_outcomes(self) -> int:
        """Outcomes in the batch."""
        return len(self.request_id)

    def outcomes(self, indexes: Iterable[int] | None = None) -> list[Outcome]:
        """The outcomes (or those at `indexes`) as single-outcome objects."""
        wanted = range(self.n_outcomes) if indexes is None else indexes

        def opt(column: NDArray[np.float64], r: int) -> float | None:
            return _unopt(float(column[r])) if len(column) else None

        out = []
        for r in wanted:
            slo = int(self.slo_met[r]) if len(self.slo_met) else SLO_MET_UNKNOWN
            out.append(
                Outcome(
                    request_id=self.request_id[r],
                    observed_at=float(self.observed_at[r]),
                    queue_delay_s=opt(self.queue_delay_s, r),
                    throughput=opt(self.throughput, r),
                    completion_time_s=opt(self.completion_time_s, r),
                    slo_met=None if slo == SLO_MET_UNKNOWN else bool(slo),
                    failure=FAILURE_OF_CODE[int(self.failure[r])],
                    production=self.production.decision(r),
                )
            )
        return out

    @classmethod
    def from_outcomes(cls, outcomes: Sequence[Outcome]) -> OutcomeColumns:
        """The batch of `outcomes`, in order."""

        def opt(name: str) -> NDArray[np.float64]:
            values = [getattr(o, name) for o in outcomes]
            if all(v is None for v in values):
                return EMPTY_F64
            return frozen_array([_opt(v) for v in values], np.float64)

        slo = [o.slo_met for o in outcomes]
        return cls(
            request_id=Strings.of(o.request_id for o in outcomes),
            observed_at=frozen_array([o.observed_at for o in outcomes], np.float64),
            failure=frozen_array([CODE_OF_FAILURE[o.failure] for o in outcomes], np.uint8),
            queue_delay_s=opt("queue_delay_s"),
            throughput=opt("throughput"),
            completion_time_s=opt("completion_time_s"),
            slo_met=(
                EMPTY_U8
                if all(v is None for v in slo)
                else frozen_array([SLO_MET_UNKNOWN if v is None else int(v) for v in slo], np.uint8)
            ),
            production=ProductionColumns.of([o.production for o in outcomes]),
        )


CODE_OF_FAILURE: dict[FailureKind, int] = {
    FailureKind.NONE: 1,
    FailureKind.OOM: 2,
    FailureKind.PREEMPTED: 3,
    FailureKind.CRASHED: 4,
    FailureKind.OTHER: 5,
}
"""`FailureKind` -> the wire's FailureKind enum value (0 = unspecified, refused)."""
FAILURE_OF_CODE: dict[int, FailureKind] = {0: FailureKind.NONE} | {
    v: k for k, v in CODE_OF_FAILURE.items()
}
"""And back; 0 (unspecified) reads as NONE, as the single-outcome decoder reads it."""
