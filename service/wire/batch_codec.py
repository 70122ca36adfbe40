"""`MirrorBatch` / `OutcomeBatch` protobuf <-> the contract's batch columns (issue 24).

Decoding views every numeric column in place (``np.frombuffer``: read-only, no
copy, no Python loop over its values) and converts only where the wire's dtype
differs from the dataclass's (u32 indexes, u8 flags). The only per-item Python
work is one `HardwareClass` per hardware class, because the class's unset
capabilities are presence bits that numpy cannot see.

What is checked here is the *layout* (docs/contract.md, "Batch form"): that the
message can be read into requests at all. A column whose byte length is not a
whole number of items, or whose count is not the one its rows need; an offsets
column that is not a CSR index of what it indexes; a flag byte other than 0 or
1; text that is not UTF-8 or is cut inside a character; rows holding values
their flag says they do not send (devices of a snapshot with ``devices_sent``
0: no request would read them, and the counts that locate the others would
disagree); schema_version other than 2; no requests at all, or more than
``limits.max_batch_requests``. Any of these refuses the whole batch
(`InvalidInput` naming the wire path, e.g. ``states.cpu_free``): no request's
bounds can be trusted once one column is misaligned. Everything that is about
one request's *content* (finite numbers, indexes in range of its snapshot,
state_index in range, enum codes) is left to
`service.contract.batch.validation`, which refuses by index.

Encoding writes each column with ``.astype('<dtype').tobytes()``: one C call per
column, whatever the batch size; the field names are the proto's, so the
dataclasses' fields map one to one. Decoding then encoding gives the same bytes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.contract.batch import (
    BATCH_SCHEMA_VERSION,
    SLO_MET_UNKNOWN,
    OptionColumns,
    OutcomeColumns,
    ProductionColumns,
    RequestBatch,
    StateColumns,
    Strings,
    WorkloadColumns,
)
from service.contract.batch.validation import IndexedRefusal
from service.contract.errors import InvalidInput, UnsupportedSchemaVersion
from service.contract.hardware import CAPABILITIES, HardwareClass
from service.contract.validation import RequestLimits
from service.wire.batch_columns import (
    F32,
    F64,
    I32,
    U8,
    U32,
    as_dtype,
    column,
    csr,
    every,
    flags,
    index32,
    no_stray,
    strings,
    view,
)
from service.wire.convert import hardware_to_pb
from service.wire.understudy.v1 import batch_pb2


@dataclass(frozen=True)
class DecodedBatch:
    """A decoded batch and how its rows map to what was sent.

    ``index[i]`` is the position, in the message or body as sent, of batch row i;
    ``refusals`` are the sent requests refused while decoding (JSON rows that do
    not decode), by their sent position. ``n_sent == len(index) + len(refusals)``.
    """

    batch: RequestBatch
    index: NDArray[np.int64]
    refusals: tuple[IndexedRefusal, ...]
    n_sent: int


@dataclass(frozen=True)
class DecodedOutcomes:
    """`DecodedBatch` for outcome reports."""

    outcomes: OutcomeColumns
    index: NDArray[np.int64]
    refusals: tuple[IndexedRefusal, ...]
    n_sent: int


# --- decoding ------------------------------------------------------------------------


def _hardware(h: Any) -> HardwareClass:
    # As service.wire.convert for schema 2: an unset capability is unknown (None). ListFields
    # gives the set ones in one call (a HasField per capability costs four).
    given = {f.name: value for f, value in h.ListFields()}
    return HardwareClass(h.name, *(given.get(c) for c in CAPABILITIES))


def _hardware_classes(msgs: Any) -> tuple[HardwareClass, ...]:
    """Every snapshot's classes, each distinct class message decoded once: the snapshots
    of a batch mostly repeat one cluster's few classes (a loop over classes, not nodes)."""
    decoded: dict[bytes, HardwareClass] = {}
    out = []
    for h in msgs:
        key = h.SerializeToString()
        one = decoded.get(key)
        if one is None:
            one = decoded[key] = _hardware(h)
        out.append(one)
    return tuple(out)


def _states(msg: batch_pb2.ClusterStates) -> StateColumns:
    node_ids = strings("states.node_ids", msg.node_ids, None, "n_nodes")
    n = len(node_ids)
    node_offsets = csr(
        "states.node_offsets", msg.node_offsets, None, n, "states.node_ids", "n_states"
    )
    n_states = max(len(node_offsets) - 1, 0)
    hardware = _hardware_classes(msg.hardware)
    hardware_offsets = csr(
        "states.hardware_offsets",
        msg.hardware_offsets,
        n_states,
        len(hardware),
        "states.hardware",
        "n_states",
    )

    def node(name: str, dtype: str) -> NDArray[Any]:
        return column(f"states.{name}", getattr(msg, name), dtype, n, "per node")

    labels = strings("states.labels", msg.labels, None, "n_labels")
    label_offsets = csr(
        "states.label_offsets",
        msg.label_offsets,
        n,
        len(labels),
        "states.labels",
        "n_nodes",
        optional=True,
    )
    device_hardware = index32(view("states.device_hardware", msg.device_hardware, U32))
    n_devices = len(device_hardware)
    devices_sent = flags("states.devices_sent", msg.devices_sent, n_states, "per snapshot")
    device_offsets = csr(
        "states.device_offsets",
        msg.device_offsets,
        n,
        n_devices,
        "states.device_hardware",
        "n_nodes",
        optional=True,
    )
    ids_sent = flags("states.device_ids_sent", msg.device_ids_sent, n_states, "per snapshot")
    sent = every(devices_sent, n_states)
    if len(device_offsets):
        node_sent = np.repeat(sent, np.diff(node_offsets)) if n_states else np.zeros(n, np.bool_)
        no_stray("states.device_offsets", np.diff(device_offsets), node_sent, "devices")
        per_state = device_offsets[node_offsets[1:]] - device_offsets[node_offsets[:-1]]
    else:
        per_state = np.zeros(n_states, np.int64)
        if sent.any():
            raise InvalidInput(
                "states.devices_sent", "flags a snapshot, but states.device_offsets is empty"
            )
    with_ids = every(ids_sent, n_states)
    no_stray("states.device_ids_sent", with_ids.astype(np.int64), sent, "device ids")
    return StateColumns(
        node_offsets=node_offsets,
        hardware_offsets=hardware_offsets,
        hardware=hardware,
        node_ids=node_ids,
        node_hardware=index32(node("node_hardware", U32)),
        accelerators_free=node("accelerators_free", I32),
        accelerators_total=node("accelerators_total", I32),
        cpu_free=node("cpu_free", F32),
        cpu_total=node("cpu_total", F32),
        memory_free_gb=node("memory_free_gb", F32),
        memory_total_gb=node("memory_total_gb", F32),
        utilisation=node("utilisation", F32),
        queue_length=node("queue_length", I32),
        healthy=flags("states.healthy", msg.healthy, n, "per node", False),
        draining=flags("states.draining", msg.draining, n, "per node", False),
        zone=strings("states.zone", msg.zone, n, "n_nodes"),
        locality=strings("states.locality", msg.locality, n, "n_nodes"),
        label_offsets=label_offsets,
        labels=labels,
        devices_sent=devices_sent,
        device_offsets=device_offsets,
        device_hardware=device_hardware,
        device_free_share=column(
            "states.device_free_share", msg.device_free_share, F32, n_devices, "per device"
        ),
        device_free_memory_gb=column(
            "states.device_free_memory_gb", msg.device_free_memory_gb, F32, n_devices, "per device"
        ),
        device_ids_sent=ids_sent,
        device_ids=strings(
            "states.device_ids", msg.device_ids, int(per_state[with_ids].sum()), "n_named_devices"
        ),
    )


def _workloads(msg: batch_pb2.Workloads, n: int) -> WorkloadColumns:
    def text(name: str) -> Strings:
        return strings(f"workloads.{name}", getattr(msg, name), n, "n_requests")

    def number(name: str, dtype: str) -> NDArray[Any]:
        return column(f"workloads.{name}", getattr(msg, name), dtype, n, "per request")

    def string_set(name: str) -> dict[str, Any]:
        values = strings(f"workloads.{name}", getattr(msg, name), None, f"n_{name}")
        offsets = csr(
            f"workloads.{name}_offsets",
            getattr(msg, f"{name}_offsets"),
            n,
            len(values),
            f"workloads.{name}",
            "n_requests",
            optional=True,
        )
        return {f"{name}_offsets": offsets, name: values}

    return WorkloadColumns(
        workload_id=text("workload_id"),
        kind=text("kind"),
        model_family=text("model_family"),
        model_size_b=number("model_size_b", F64),
        accelerators=number("accelerators", I32),
        accelerator_memory_gb=number("accelerator_memory_gb", F64),
        cpu_per_node=number("cpu_per_node", F64),
        memory_per_node_gb=number("memory_per_node_gb", F64),
        gang_size=number("gang_size", I32),
        priority=number("priority", I32),
        tenant=text("tenant"),
        slo_seconds=number("slo_seconds", F64),
        work_units=number("work_units", F64),
        accelerator_share=number("accelerator_share", F64),
        qos_class=text("qos_class"),
        **string_set("allowed_hardware"),
        **string_set("affinity"),
        **string_set("anti_affinity"),
    )


def _options(msg: batch_pb2.Options, n: int) -> OptionColumns:
    node_index = view("options.node_index", msg.node_index, I32)
    n_entries = len(node_index)
    entry_offsets = csr(
        "options.entry_offsets",
        msg.entry_offsets,
        None,
        n_entries,
        "options.node_index",
        "n_options",
    )
    n_options = max(len(entry_offsets) - 1, 0)
    option_offsets = csr(
        "options.option_offsets",
        msg.option_offsets,
        n,
        n_options,
        "the options of options.entry_offsets",
        "n_requests",
    )
    per_request = np.diff(option_offsets) if len(option_offsets) else np.zeros(n, np.int64)
    ids_sent = flags("options.option_ids_sent", msg.option_ids_sent, n, "per request")
    n_ids = int(per_request[every(ids_sent, n)].sum())
    named = flags("options.devices_named", msg.devices_named, n, "per request")
    device_index = view("options.device_index", msg.device_index, I32)
    device_offsets = csr(
        "options.device_offsets",
        msg.device_offsets,
        n_entries,
        len(device_index),
        "options.device_index",
        "n_entries",
        optional=True,
    )
    if len(device_offsets):
        option_named = np.repeat(every(named, n), per_request)
        entry_named = np.repeat(option_named, np.diff(entry_offsets))
        no_stray("options.device_offsets", np.diff(device_offsets), entry_named, "devices")
    elif named.any():
        raise InvalidInput(
            "options.devices_named", "flags a request, but options.device_offsets is empty"
        )
    return OptionColumns(
        option_offsets=option_offsets,
        entry_offsets=entry_offsets,
        node_index=node_index,
        accelerators=column("options.accelerators", msg.accelerators, I32, n_entries, "per entry"),
        option_ids_sent=ids_sent,
        option_ids=strings("options.option_ids", msg.option_ids, n_ids, "n_named_options"),
        devices_named=named,
        device_offsets=device_offsets,
        device_index=device_index,
    )


def _productions(msg: batch_pb2.Productions, n: int) -> ProductionColumns:
    """Empty ``present``: no row carries a decision, and no other column may hold values."""
    present = flags("production.present", msg.present, n, "per row")
    k = n if len(present) else 0
    probabilities = view("production.probabilities", msg.probabilities, F64)
    return ProductionColumns(
        present=present,
        option=column("production.option", msg.option, I32, k, "per row"),
        propensity=column("production.propensity", msg.propensity, F64, k, "per row"),
        probability_offsets=csr(
            "production.probability_offsets",
            msg.probability_offsets,
            k,
            len(probabilities),
            "production.probabilities",
            "n_rows",
            optional=True,
        ),
        probabilities=probabilities,
        defer_probability=column(
            "production.defer_probability", msg.defer_probability, F64, k, "per row"
        ),
    )


def _count(msg: batch_pb2.Strings, limits: RequestLimits, noun: str) -> int:
    """Rows of the batch, from ``request_id``'s offsets, refused above the limit before
    any column is read.

    A batch of no rows (no offsets, or the lone 0 of an empty CSR) is refused too:
    a sender that batches with a linger never sends one, so it is a client bug that
    an ack of zero counts would hide. Offsets of another malformed length are left
    to the column checks, which name what is wrong with them.
    """
    if len(msg.offsets) in (0, 8):
        raise InvalidInput("request_id", f"must hold at least one {noun}, got none")
    n = max(len(msg.offsets) // 8 - 1, 0)
    if n > limits.max_batch_requests:
        raise InvalidInput(
            "request_id",
            f"must hold at most {limits.max_batch_requests} requests (max_batch_requests), got {n}",
        )
    return n


def batch_from_pb(msg: batch_pb2.MirrorBatch, limits: RequestLimits) -> RequestBatch:
    """The `RequestBatch` a `MirrorBatch` carries, its columns viewing the message's bytes.

    Raises:
        UnsupportedSchemaVersion: ``schema_version`` is not 2.
        InvalidInput: the layout is unsound (module docstring), naming the wire path;
            `MalformedMessage` for text that is not UTF-8.
    """
    if msg.schema_version != BATCH_SCHEMA_VERSION:
        raise UnsupportedSchemaVersion(
            "schema_version",
            f"must be {BATCH_SCHEMA_VERSION} in a batch (a schema-1 sender mirrors one by "
            f"one), got {msg.schema_version}",
        )
    n = _count(msg.request_id, limits, "request")
    state_index = column("state_index", msg.state_index, U32, n, "per request")
    return RequestBatch(
        schema_version=BATCH_SCHEMA_VERSION,
        request_id=strings("request_id", msg.request_id, n, "n_requests"),
        request_time=column("request_time", msg.request_time, F64, n, "per request"),
        state_index=as_dtype(state_index, np.int64),
        states=_states(msg.states),
        workloads=_workloads(msg.workloads, n),
        options=_options(msg.options, n),
        production=_productions(msg.production, n),
        quota_remaining=column(
            "quota_remaining", msg.quota_remaining, F64, n, "per request", optional=True
        ),
    )


def outcomes_from_pb(msg: batch_pb2.OutcomeBatch, limits: RequestLimits) -> OutcomeColumns:
    """The `OutcomeColumns` an `OutcomeBatch` carries (layout checked as `batch_from_pb`;
    ``slo_met`` is 0, 1 or 2 like a flag; failure codes are content, checked by index).

    Raises:
        InvalidInput: naming the wire path.
    """
    n = _count(msg.request_id, limits, "outcome")

    def optional(name: str) -> NDArray[np.float64]:
        return column(name, getattr(msg, name), F64, n, "per outcome", optional=True)

    slo_met = column("slo_met", msg.slo_met, U8, n, "per outcome", optional=True)
    if len(slo_met) and np.maximum.reduce(slo_met) > SLO_MET_UNKNOWN:
        bad = int(np.flatnonzero(slo_met > SLO_MET_UNKNOWN)[0])
        raise InvalidInput(
            f"slo_met[{bad}]", f"must be 0 (false), 1 (true) or 2 (not given), got {slo_met[bad]}"
        )
    return OutcomeColumns(
        request_id=strings("request_id", msg.request_id, n, "n_outcomes"),
        observed_at=column("observed_at", msg.observed_at, F64, n, "per outcome"),
        failure=column("failure", msg.failure, U8, n, "per outcome"),
        queue_delay_s=optional("queue_delay_s"),
        throughput=optional("throughput"),
        completion_time_s=optional("completion_time_s"),
        slo_met=slo_met,
        production=_productions(msg.production, n),
    )


# --- encoding ------------------------------------------------------------------------

_WIDER_ON_THE_WIRE = {"state_index": U32, "node_hardware": U32, "device_hardware": U32}
"""Columns whose wire dtype is not the dataclass's own (int64 / int32 in the dataclass; the
u32 bytes of an int32 are its own bytes for every valid index)."""


def _le(name: str, array: NDArray[Any]) -> bytes:
    """A column's wire bytes: its own dtype little-endian (bool as u8), unless listed."""
    dtype = _WIDER_ON_THE_WIRE.get(name) or array.dtype.newbyteorder("<")
    return array.astype(U8 if array.dtype == np.bool_ else dtype, copy=False).tobytes()


def _s(values: Strings) -> batch_pb2.Strings:
    return batch_pb2.Strings(utf8=values.utf8, offsets=_le("offsets", values.offsets))


def _fields(columns: Any) -> dict[str, Any]:
    """Every column of a batch dataclass as its wire field (the names are the proto's)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(columns):
        value = getattr(columns, f.name)
        if isinstance(value, np.ndarray):
            out[f.name] = _le(f.name, value)
        elif isinstance(value, Strings):
            out[f.name] = _s(value)
    return out


def batch_to_pb(batch: RequestBatch) -> batch_pb2.MirrorBatch:
    """The `MirrorBatch` of `batch`: one ``tobytes`` per column (what clients send and the
    HTTP JSON path journals)."""
    hardware = [hardware_to_pb(h) for h in batch.states.hardware]
    return batch_pb2.MirrorBatch(
        schema_version=batch.schema_version,
        states=batch_pb2.ClusterStates(hardware=hardware, **_fields(batch.states)),
        workloads=batch_pb2.Workloads(**_fields(batch.workloads)),
        options=batch_pb2.Options(**_fields(batch.options)),
        production=batch_pb2.Productions(**_fields(batch.production)),
        **_fields(batch),
    )


def outcomes_to_pb(cols: OutcomeColumns) -> batch_pb2.OutcomeBatch:
    """The `OutcomeBatch` of `cols`."""
    return batch_pb2.OutcomeBatch(
        production=batch_pb2.Productions(**_fields(cols.production)), **_fields(cols)
    )
