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
1; text that is not UTF-8; schema_version other than 2; more than
``limits.max_batch_requests`` requests. Any of these refuses the whole batch
(`InvalidInput` naming the wire path, e.g. ``states.cpu_free``): no request's
bounds can be trusted once one column is misaligned. Everything that is about
one request's *content* (finite numbers, indexes in range of its snapshot,
state_index in range, enum codes) is left to
`service.contract.batch_validation`, which refuses by index.

Encoding writes each column with ``.astype('<dtype').tobytes()``: one C call per
column, whatever the batch size.
"""

from __future__ import annotations

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
from service.contract.batch_validation import IndexedRefusal
from service.contract.csr import check_offsets
from service.contract.errors import InvalidInput, MalformedMessage, UnsupportedSchemaVersion
from service.contract.hardware import CAPABILITIES, HardwareClass
from service.contract.validation import RequestLimits
from service.wire.convert import hardware_to_pb
from service.wire.understudy.v1 import batch_pb2

_U8, _I32, _U32, _I64, _F32, _F64 = "<u1", "<i4", "<u4", "<i8", "<f4", "<f8"
_NAME = {_U8: "u8", _I32: "i32", _U32: "u32", _I64: "i64", _F32: "f32", _F64: "f64"}
_INT32_MAX = 2**31 - 1


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


# --- reading columns ---------------------------------------------------------------


def _view(field: str, data: bytes, dtype: str) -> NDArray[Any]:
    """The column as a read-only array over the message's bytes."""
    size = np.dtype(dtype).itemsize
    if len(data) % size:
        raise InvalidInput(
            field,
            f"must be a whole number of {_NAME[dtype]} values ({size} bytes each), "
            f"got {len(data)} bytes",
        )
    return np.frombuffer(data, dtype=dtype)


def _as(array: NDArray[Any], dtype: type[Any]) -> NDArray[Any]:
    """`array` in the dataclass's dtype: the view itself where they agree (a
    little-endian host), else a read-only copy."""
    if array.dtype == dtype:
        return array
    out = array.astype(dtype)
    out.flags.writeable = False
    return out


def _col(
    field: str, data: bytes, dtype: str, n: int, per: str, optional: bool = False
) -> NDArray[Any]:
    """A numeric column of exactly `n` values (or none, where `optional`)."""
    array = _view(field, data, dtype)
    if len(array) != n and not (optional and not len(array)):
        either = " or none" if optional else ""
        raise InvalidInput(
            field, f"must hold one {_NAME[dtype]} {per} ({n}){either}, got {len(array)}"
        )
    return array


def _flags(field: str, data: bytes, n: int, per: str, optional: bool = True) -> NDArray[np.bool_]:
    """A u8 0/1 column as bool (a view). Any other byte would read as True in one place
    and as a number in another, so it refuses the batch."""
    array = _col(field, data, _U8, n, per, optional)
    if len(array) and np.maximum.reduce(array) > 1:
        bad = int(np.flatnonzero(array > 1)[0])
        raise InvalidInput(f"{field}[{bad}]", f"must be 0 or 1, got {array[bad]}")
    return array.view(np.bool_)


def _index32(array: NDArray[np.uint32]) -> NDArray[Any]:
    """A u32 hardware index column as int32. An index beyond int32 (always out of range:
    no message holds 2**31 classes) stays int64, so the validator refuses it naming the
    value as sent, as `node_hardware_array` does for a single request, not a wrapped one."""
    if len(array) and np.maximum.reduce(array) > _INT32_MAX:
        return _as(array, np.int64)
    return _as(array, np.int32)


def _csr(
    field: str,
    data: bytes,
    n_rows: int | None,
    n_values: int,
    values: str,
    rows: str,
    optional: bool = False,
) -> NDArray[np.int64]:
    """An i64 offsets column indexing `n_values` values over `n_rows` rows (None: as many
    rows as the column says). Empty stands for "none at all" where `optional`, and
    for zero rows anywhere; then there must be no values."""
    offsets = _view(field, data, _I64)
    if n_rows is None:
        n_rows = max(len(offsets) - 1, 0)
    if not len(offsets) and (optional or n_rows == 0):
        if n_values:
            raise InvalidInput(field, f"is empty, so {values} must be too, got {n_values} values")
        return offsets
    check_offsets(field, offsets, n_rows, n_values, values, rows)
    return offsets


def _strings(field: str, msg: batch_pb2.Strings, n: int | None, rows: str) -> Strings:
    """A string column of `n` values (None: as many as its offsets say), UTF-8 throughout
    and cut between characters, so every value decodes wherever it is read."""
    utf8 = msg.utf8
    offsets = _csr(f"{field}.offsets", msg.offsets, n, len(utf8), f"{field}.utf8", rows)
    if utf8:
        try:
            utf8.decode()  # one C pass over the column, not one per value
        except UnicodeDecodeError as exc:
            raise MalformedMessage(
                f"{field}.utf8", f"must be UTF-8, got byte {utf8[exc.start]:#04x} at {exc.start}"
            ) from exc
        starts = offsets[:-1]
        lead = np.frombuffer(utf8, np.uint8)[starts[starts < len(utf8)]]
        if len(lead) and ((lead & 0xC0) == 0x80).any():
            bad = int(np.flatnonzero((lead & 0xC0) == 0x80)[0])
            raise MalformedMessage(
                f"{field}.offsets[{bad}]", "must fall between characters, got one inside one"
            )
    return Strings(utf8, offsets)


def _no_stray(
    field: str, per_row: NDArray[np.int64], owner_sent: NDArray[np.bool_], what: str
) -> None:
    """Rows whose owner does not send `what` (its flag 0) own none: else the batch holds
    values no request reads, and the counts that locate the others disagree."""
    stray = (per_row > 0) & ~owner_sent
    if stray.any():
        raise InvalidInput(
            f"{field}[{int(np.flatnonzero(stray)[0])}]",
            f"gives {what} to a row whose flag says it sends none",
        )


def _all(flags: NDArray[np.bool_], n: int) -> NDArray[np.bool_]:
    """An optional flag column at full length (empty = all 0)."""
    return flags if len(flags) else np.zeros(n, np.bool_)


# --- decoding ------------------------------------------------------------------------


def _hardware(h: Any) -> HardwareClass:
    # As service.wire.convert for schema 2: an unset capability is unknown (None).
    return HardwareClass(h.name, *(getattr(h, c) if h.HasField(c) else None for c in CAPABILITIES))


def _states(msg: batch_pb2.ClusterStates) -> StateColumns:
    node_ids = _strings("states.node_ids", msg.node_ids, None, "n_nodes")
    n = len(node_ids)
    node_offsets = _csr(
        "states.node_offsets", msg.node_offsets, None, n, "states.node_ids", "n_states"
    )
    n_states = max(len(node_offsets) - 1, 0)
    hardware = tuple(_hardware(h) for h in msg.hardware)  # per class: presence bits
    hardware_offsets = _csr(
        "states.hardware_offsets",
        msg.hardware_offsets,
        n_states,
        len(hardware),
        "states.hardware",
        "n_states",
    )

    def node(name: str, dtype: str) -> NDArray[Any]:
        return _col(f"states.{name}", getattr(msg, name), dtype, n, "per node")

    labels_view = _view("states.labels.offsets", msg.labels.offsets, _I64)
    label_offsets = _csr(
        "states.label_offsets",
        msg.label_offsets,
        n,
        max(len(labels_view) - 1, 0),
        "states.labels",
        "n_nodes",
        optional=True,
    )
    labels = _strings("states.labels", msg.labels, None, "n_labels")
    device_hardware = _index32(_view("states.device_hardware", msg.device_hardware, _U32))
    n_devices = len(device_hardware)
    devices_sent = _flags("states.devices_sent", msg.devices_sent, n_states, "per snapshot")
    device_offsets = _csr(
        "states.device_offsets",
        msg.device_offsets,
        n,
        n_devices,
        "states.device_hardware",
        "n_nodes",
        optional=True,
    )
    ids_sent = _flags("states.device_ids_sent", msg.device_ids_sent, n_states, "per snapshot")
    sent = _all(devices_sent, n_states)
    if len(device_offsets):
        node_sent = np.repeat(sent, np.diff(node_offsets)) if n_states else np.zeros(n, np.bool_)
        _no_stray("states.device_offsets", np.diff(device_offsets), node_sent, "devices")
        per_state = device_offsets[node_offsets[1:]] - device_offsets[node_offsets[:-1]]
    else:
        per_state = np.zeros(n_states, np.int64)
        if sent.any():
            raise InvalidInput(
                "states.devices_sent", "flags a snapshot, but states.device_offsets is empty"
            )
    with_ids = _all(ids_sent, n_states)
    _no_stray("states.device_ids_sent", with_ids.astype(np.int64), sent, "device ids")
    return StateColumns(
        node_offsets=node_offsets,
        hardware_offsets=hardware_offsets,
        hardware=hardware,
        node_ids=node_ids,
        node_hardware=_index32(node("node_hardware", _U32)),
        accelerators_free=node("accelerators_free", _I32),
        accelerators_total=node("accelerators_total", _I32),
        cpu_free=node("cpu_free", _F32),
        cpu_total=node("cpu_total", _F32),
        memory_free_gb=node("memory_free_gb", _F32),
        memory_total_gb=node("memory_total_gb", _F32),
        utilisation=node("utilisation", _F32),
        queue_length=node("queue_length", _I32),
        healthy=_flags("states.healthy", msg.healthy, n, "per node", False),
        draining=_flags("states.draining", msg.draining, n, "per node", False),
        zone=_strings("states.zone", msg.zone, n, "n_nodes"),
        locality=_strings("states.locality", msg.locality, n, "n_nodes"),
        label_offsets=label_offsets,
        labels=labels,
        devices_sent=devices_sent,
        device_offsets=device_offsets,
        device_hardware=device_hardware,
        device_free_share=_col(
            "states.device_free_share", msg.device_free_share, _F32, n_devices, "per device"
        ),
        device_free_memory_gb=_col(
            "states.device_free_memory_gb", msg.device_free_memory_gb, _F32, n_devices, "per device"
        ),
        device_ids_sent=ids_sent,
        device_ids=_strings(
            "states.device_ids", msg.device_ids, int(per_state[with_ids].sum()), "n_named_devices"
        ),
    )


def _workloads(msg: batch_pb2.Workloads, n: int) -> WorkloadColumns:
    def text(name: str) -> Strings:
        return _strings(f"workloads.{name}", getattr(msg, name), n, "n_requests")

    def number(name: str, dtype: str) -> NDArray[Any]:
        return _col(f"workloads.{name}", getattr(msg, name), dtype, n, "per request")

    def string_set(name: str) -> dict[str, Any]:
        values = _strings(f"workloads.{name}", getattr(msg, name), None, f"n_{name}")
        offsets = _csr(
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
        model_size_b=number("model_size_b", _F64),
        accelerators=number("accelerators", _I32),
        accelerator_memory_gb=number("accelerator_memory_gb", _F64),
        cpu_per_node=number("cpu_per_node", _F64),
        memory_per_node_gb=number("memory_per_node_gb", _F64),
        gang_size=number("gang_size", _I32),
        priority=number("priority", _I32),
        tenant=text("tenant"),
        slo_seconds=number("slo_seconds", _F64),
        work_units=number("work_units", _F64),
        accelerator_share=number("accelerator_share", _F64),
        qos_class=text("qos_class"),
        **string_set("allowed_hardware"),
        **string_set("affinity"),
        **string_set("anti_affinity"),
    )


def _options(msg: batch_pb2.Options, n: int) -> OptionColumns:
    node_index = _view("options.node_index", msg.node_index, _I32)
    n_entries = len(node_index)
    entry_offsets = _csr(
        "options.entry_offsets",
        msg.entry_offsets,
        None,
        n_entries,
        "options.node_index",
        "n_options",
    )
    n_options = max(len(entry_offsets) - 1, 0)
    option_offsets = _csr(
        "options.option_offsets",
        msg.option_offsets,
        n,
        n_options,
        "the options of options.entry_offsets",
        "n_requests",
    )
    per_request = np.diff(option_offsets) if len(option_offsets) else np.zeros(n, np.int64)
    ids_sent = _flags("options.option_ids_sent", msg.option_ids_sent, n, "per request")
    n_ids = int(per_request[_all(ids_sent, n)].sum())
    named = _flags("options.devices_named", msg.devices_named, n, "per request")
    device_index = _view("options.device_index", msg.device_index, _I32)
    device_offsets = _csr(
        "options.device_offsets",
        msg.device_offsets,
        n_entries,
        len(device_index),
        "options.device_index",
        "n_entries",
        optional=True,
    )
    if len(device_offsets):
        option_named = np.repeat(_all(named, n), per_request)
        entry_named = np.repeat(option_named, np.diff(entry_offsets))
        _no_stray("options.device_offsets", np.diff(device_offsets), entry_named, "devices")
    elif named.any():
        raise InvalidInput(
            "options.devices_named", "flags a request, but options.device_offsets is empty"
        )
    return OptionColumns(
        option_offsets=option_offsets,
        entry_offsets=entry_offsets,
        node_index=node_index,
        accelerators=_col("options.accelerators", msg.accelerators, _I32, n_entries, "per entry"),
        option_ids_sent=ids_sent,
        option_ids=_strings("options.option_ids", msg.option_ids, n_ids, "n_named_options"),
        devices_named=named,
        device_offsets=device_offsets,
        device_index=device_index,
    )


def _productions(msg: batch_pb2.Productions, n: int) -> ProductionColumns:
    """Empty ``present``: no row carries a decision, and no other column may hold values."""
    present = _flags("production.present", msg.present, n, "per row")
    k = n if len(present) else 0
    probabilities = _view("production.probabilities", msg.probabilities, _F64)
    return ProductionColumns(
        present=present,
        option=_col("production.option", msg.option, _I32, k, "per row"),
        propensity=_col("production.propensity", msg.propensity, _F64, k, "per row"),
        probability_offsets=_csr(
            "production.probability_offsets",
            msg.probability_offsets,
            k,
            len(probabilities),
            "production.probabilities",
            "n_rows",
            optional=True,
        ),
        probabilities=probabilities,
        defer_probability=_col(
            "production.defer_probability", msg.defer_probability, _F64, k, "per row"
        ),
    )


def _count(msg: batch_pb2.Strings, limits: RequestLimits) -> int:
    """Rows of the batch, from ``request_id``'s offsets, refused above the limit before
    any column is read."""
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
    n = _count(msg.request_id, limits)
    state_index = _col("state_index", msg.state_index, _U32, n, "per request")
    return RequestBatch(
        schema_version=BATCH_SCHEMA_VERSION,
        request_id=_strings("request_id", msg.request_id, n, "n_requests"),
        request_time=_col("request_time", msg.request_time, _F64, n, "per request"),
        state_index=_as(state_index, np.int64),
        states=_states(msg.states),
        workloads=_workloads(msg.workloads, n),
        options=_options(msg.options, n),
        production=_productions(msg.production, n),
        quota_remaining=_col(
            "quota_remaining", msg.quota_remaining, _F64, n, "per request", optional=True
        ),
    )


def outcomes_from_pb(msg: batch_pb2.OutcomeBatch, limits: RequestLimits) -> OutcomeColumns:
    """The `OutcomeColumns` an `OutcomeBatch` carries (layout checked as `batch_from_pb`;
    ``slo_met`` is 0, 1 or 2 like a flag; failure codes are content, checked by index).

    Raises:
        InvalidInput: naming the wire path.
    """
    n = _count(msg.request_id, limits)

    def optional(name: str) -> NDArray[np.float64]:
        return _col(name, getattr(msg, name), _F64, n, "per outcome", optional=True)

    slo_met = _col("slo_met", msg.slo_met, _U8, n, "per outcome", optional=True)
    if len(slo_met) and np.maximum.reduce(slo_met) > SLO_MET_UNKNOWN:
        bad = int(np.flatnonzero(slo_met > SLO_MET_UNKNOWN)[0])
        raise InvalidInput(
            f"slo_met[{bad}]", f"must be 0 (false), 1 (true) or 2 (not given), got {slo_met[bad]}"
        )
    return OutcomeColumns(
        request_id=_strings("request_id", msg.request_id, n, "n_outcomes"),
        observed_at=_col("observed_at", msg.observed_at, _F64, n, "per outcome"),
        failure=_col("failure", msg.failure, _U8, n, "per outcome"),
        queue_delay_s=optional("queue_delay_s"),
        throughput=optional("throughput"),
        completion_time_s=optional("completion_time_s"),
        slo_met=slo_met,
        production=_productions(msg.production, n),
    )


# --- encoding ------------------------------------------------------------------------


def _b(array: NDArray[Any], dtype: str) -> bytes:
    return array.astype(dtype, copy=False).tobytes()


def _s(values: Strings) -> batch_pb2.Strings:
    return batch_pb2.Strings(utf8=values.utf8, offsets=_b(values.offsets, _I64))


def _productions_pb(p: ProductionColumns) -> batch_pb2.Productions:
    return batch_pb2.Productions(
        present=_b(p.present, _U8),
        option=_b(p.option, _I32),
        propensity=_b(p.propensity, _F64),
        probability_offsets=_b(p.probability_offsets, _I64),
        probabilities=_b(p.probabilities, _F64),
        defer_probability=_b(p.defer_probability, _F64),
    )


_STATE_COLUMNS = {
    "node_offsets": _I64,
    "hardware_offsets": _I64,
    "node_hardware": _U32,
    "accelerators_free": _I32,
    "accelerators_total": _I32,
    "cpu_free": _F32,
    "cpu_total": _F32,
    "memory_free_gb": _F32,
    "memory_total_gb": _F32,
    "utilisation": _F32,
    "queue_length": _I32,
    "healthy": _U8,
    "draining": _U8,
    "label_offsets": _I64,
    "devices_sent": _U8,
    "device_offsets": _I64,
    "device_hardware": _U32,
    "device_free_share": _F32,
    "device_free_memory_gb": _F32,
    "device_ids_sent": _U8,
}
_STATE_STRINGS = ("node_ids", "zone", "locality", "labels", "device_ids")
_WORKLOAD_COLUMNS = {
    "model_size_b": _F64,
    "accelerators": _I32,
    "accelerator_memory_gb": _F64,
    "cpu_per_node": _F64,
    "memory_per_node_gb": _F64,
    "gang_size": _I32,
    "priority": _I32,
    "slo_seconds": _F64,
    "work_units": _F64,
    "accelerator_share": _F64,
    "allowed_hardware_offsets": _I64,
    "affinity_offsets": _I64,
    "anti_affinity_offsets": _I64,
}
_WORKLOAD_STRINGS = (
    "workload_id",
    "kind",
    "model_family",
    "tenant",
    "qos_class",
    "allowed_hardware",
    "affinity",
    "anti_affinity",
)
_OPTION_COLUMNS = {
    "option_offsets": _I64,
    "entry_offsets": _I64,
    "node_index": _I32,
    "accelerators": _I32,
    "option_ids_sent": _U8,
    "devices_named": _U8,
    "device_offsets": _I64,
    "device_index": _I32,
}


def _columns(obj: Any, numbers: dict[str, str], strings: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {name: _b(getattr(obj, name), dtype) for name, dtype in numbers.items()}
    out.update({name: _s(getattr(obj, name)) for name in strings})
    return out


def batch_to_pb(batch: RequestBatch) -> batch_pb2.MirrorBatch:
    """The `MirrorBatch` of `batch`: one ``tobytes`` per column (what clients send and the
    HTTP JSON path journals)."""
    s, w, o = batch.states, batch.workloads, batch.options
    return batch_pb2.MirrorBatch(
        schema_version=batch.schema_version,
        request_id=_s(batch.request_id),
        request_time=_b(batch.request_time, _F64),
        state_index=_b(batch.state_index, _U32),
        states=batch_pb2.ClusterStates(
            hardware=[hardware_to_pb(h) for h in s.hardware],
            **_columns(s, _STATE_COLUMNS, _STATE_STRINGS),
        ),
        workloads=batch_pb2.Workloads(**_columns(w, _WORKLOAD_COLUMNS, _WORKLOAD_STRINGS)),
        options=batch_pb2.Options(option_ids=_s(o.option_ids), **_columns(o, _OPTION_COLUMNS, ())),
        production=_productions_pb(batch.production),
        quota_remaining=_b(batch.quota_remaining, _F64),
    )


def outcomes_to_pb(cols: OutcomeColumns) -> batch_pb2.OutcomeBatch:
    """The `OutcomeBatch` of `cols`."""
    return batch_pb2.OutcomeBatch(
        request_id=_s(cols.request_id),
        observed_at=_b(cols.observed_at, _F64),
        queue_delay_s=_b(cols.queue_delay_s, _F64),
        throughput=_b(cols.throughput, _F64),
        completion_time_s=_b(cols.completion_time_s, _F64),
        slo_met=_b(cols.slo_met, _U8),
        failure=_b(cols.failure, _U8),
        production=_productions_pb(cols.production),
    )
