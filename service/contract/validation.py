"""Validation of mirrored requests and outcomes against the contract.

Converters at the transport build the dataclasses; this module decides whether
their content is acceptable. Every failure raises `InvalidInput` whose field is
the dotted path of the first offending value, so the caller can fix it and the
metrics can count rejections by field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.contract.actions import DEFER
from service.contract.batch import shared_state
from service.contract.device_validation import (
    check_accelerator_classes,
    check_devices,
    check_named_devices,
)
from service.contract.errors import InvalidInput, UnsupportedSchemaVersion
from service.contract.outcome import Outcome
from service.contract.production import check_distribution, check_request_support
from service.contract.request import SUPPORTED_SCHEMA_VERSIONS, MirrorRequest, ProductionDecision
from service.contract.schema_versions import V1_SCHEMA, check_schema_1
from service.contract.state import ClusterState
from service.contract.text import check_request_texts, check_text

MAX_UNIX_SECONDS = 253_402_300_799.0
"""9999-12-31T23:59:59Z: the latest instant every timestamp type downstream can hold
(Python's `datetime`; PostgreSQL's `timestamptz` reaches further). A later time
would be acked, then fail every attempt to log it."""

MAX_QUANTITY = 1e12
"""Largest hardware capability or workload quantity accepted (GB, TFLOP/s, GB/s,
cores, seconds, billions of parameters, work units): orders of magnitude above
anything real, and small enough that every feature stays finite in float32 (a
larger finite value overflowed the feature matrix to inf)."""


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Size limits that keep one request from costing the service too much."""

    max_options: int = 10_000
    max_nodes: int = 100_000
    max_nodes_per_option: int = 1_024
    max_id_length: int = 256
    # Accelerator devices in one snapshot, sent or derived from the node counts
    # (contract/devices.py builds one entry per device: an unbounded count would be
    # an unbounded allocation on every feasibility and feature pass).
    max_devices: int = 1_000_000
    # Requests in one batch (MirrorMany, POST /v1/mirror/batch): more is refused whole,
    # before any column is read, so one message cannot make ingest hold an unbounded
    # batch while it validates and journals it.
    max_batch_requests: int = 1_024


_DEFAULT_LIMITS = RequestLimits()


def _first_bad(mask: NDArray[np.bool_]) -> int | None:
    bad = np.flatnonzero(mask)
    return int(bad[0]) if len(bad) else None


# Checks on the hot path first ask one cheap question of a whole array (its minimum
# or maximum: one reduction, no temporary mask) and build the mask that finds the
# first offending index only when that answer says there is one. The two agree
# (NaN propagates through both reductions), so the same requests are refused with
# the same field and message; clean ones, nearly all, skip the masks and searches.
_lowest = np.minimum.reduce
_highest = np.maximum.reduce
_any = np.logical_or.reduce


def _check_id(field: str, value: str, limits: RequestLimits) -> None:
    if not value:
        raise InvalidInput(field, "must be a non-empty string")
    if len(value) > limits.max_id_length:
        raise InvalidInput(field, f"must be at most {limits.max_id_length} characters")
    check_text(field, value)  # no control characters (service.contract.text says why)


_HARDWARE_QUANTITIES = (
    "accelerator_memory_gb",
    "peak_dense_tflops",
    "memory_bandwidth_gbps",
    "interconnect_gbps",
)


def _check_quantity(field: str, value: float | None) -> None:
    if value is not None and value > MAX_QUANTITY:  # None: an unknown capability
        raise InvalidInput(field, f"must be at most {MAX_QUANTITY:g}, got {value}")


def _check_time(field: str, value: float) -> None:
    if not (math.isfinite(value) and 0 < value <= MAX_UNIX_SECONDS):
        raise InvalidInput(
            field,
            f"must be positive Unix seconds no later than {MAX_UNIX_SECONDS:.0f} "
            f"(year 9999), got {value}",
        )


def _check_column(field: str, values: NDArray[Any], n: int, minimum: float | None = 0.0) -> None:
    """Length n, finite, and >= minimum; names the first offending node."""
    if len(values) != n:
        raise InvalidInput(field, f"must have one value per node ({n}), got {len(values)}")
    if values.dtype.kind == "f":
        bad = _first_bad(~np.isfinite(values))
        if bad is not None:
            raise InvalidInput(f"{field}[{bad}]", f"must be finite, got {values[bad]}")
    if minimum is not None:
        bad = _first_bad(values < minimum)
        if bad is not None:
            raise InvalidInput(f"{field}[{bad}]", f"must be >= {minimum:g}, got {values[bad]}")


def _check_production(field: str, production: ProductionDecision, n_options: int | None) -> None:
    """Production's decision; `n_options` is None for an outcome's (no request at hand)."""
    bound = 2**31 - 1 if n_options is None else n_options
    if production.option != DEFER and not 0 <= production.option < bound:
        raise InvalidInput(
            f"{field}.option",
            f"must be -1 (defer) or in [0, {bound}), got {production.option}",
        )
    p = production.propensity
    if p is not None and not (math.isfinite(p) and 0.0 < p <= 1.0):
        raise InvalidInput(f"{field}.propensity", f"must be in (0, 1], got {p}")
    # the whole distribution, when sent (service.contract.production)
    check_distribution(field, production, n_options)


def validate_state(request: MirrorRequest, limits: RequestLimits) -> None:
    """Check the cluster snapshot: sizes, finiteness, non-negativity, unique ids."""
    s = request.state
    n = s.n_nodes
    if n == 0:
        raise InvalidInput("state.node_ids", "must list at least one node")
    if n > limits.max_nodes:
        raise InvalidInput("state.node_ids", f"must list at most {limits.max_nodes} nodes, got {n}")
    distinct = set(s.node_ids)
    if len(distinct) != n:
        seen: set[str] = set()
        for i, node_id in enumerate(s.node_ids):
            if node_id in seen:
                raise InvalidInput(f"state.node_ids[{i}]", f"duplicates node id {node_id!r}")
            seen.add(node_id)
    if "" in distinct:
        i = s.node_ids.index("")
        raise InvalidInput(f"state.node_ids[{i}]", "must be a non-empty string")
    if not s.hardware:
        raise InvalidInput("state.hardware", "must describe at least one hardware class")
    for i, hw in enumerate(s.hardware):
        hw.validate(f"state.hardware[{i}]")
        for name in _HARDWARE_QUANTITIES:
            _check_quantity(f"state.hardware[{i}].{name}", getattr(hw, name))
    if not _columns_clean(s, n):
        _check_columns(s, n)
    _check_device_count(s, limits.max_devices)
    if s.has_devices:  # requests without devices skip the device rules entirely
        check_devices(s, n, limits.max_id_length)
    check_accelerator_classes(s)


def _check_device_count(s: ClusterState, max_devices: int) -> None:
    """At most `max_devices` devices, counted as sent or as the node shortcut derives them."""
    if s.has_devices and len(s.device_hardware) > max_devices:
        raise InvalidInput(
            "state.device_hardware",
            f"must describe at most {max_devices} devices, got {len(s.device_hardware)}",
        )
    total = int(np.add.reduce(s.accelerators_total, dtype=np.int64))
    if total > max_devices:
        raise InvalidInput(
            "state.accelerators_total",
            f"must sum to at most {max_devices} devices in one snapshot, got {total}",
        )


def _columns_clean(s: ClusterState, n: int) -> bool:
    """Whether every per-node column rule of `_check_columns` holds, asked all at once.

    One concatenation per dtype and a few reductions instead of a mask and a
    search per rule and column: what nearly every request costs. False means
    "look closer", and `_check_columns` then finds the first offender in its
    fixed order, so refusals name the same field with the same message either way.
    NaN fails every comparison here, so it is never taken for clean.
    """
    columns = (
        s.node_hardware,
        s.accelerators_free,
        s.accelerators_total,
        s.queue_length,
        s.cpu_free,
        s.memory_free_gb,
        s.cpu_total,
        s.memory_total_gb,
        s.utilisation,
    )
    others = (s.healthy, s.draining, s.zone, s.locality, s.labels)
    if any(len(c) != n for c in columns) or any(len(c) != n for c in others):
        return False
    ints = np.concatenate(columns[:4]).reshape(4, n)  # >= 0; node_hardware < len(hardware)
    if ints.dtype.kind not in "iu":  # the integer rules skip the finiteness check
        return False
    if not (_lowest(ints, axis=None) >= 0 and _highest(ints[0]) < len(s.hardware)):
        return False
    floats = np.concatenate(columns[4:]).reshape(5, n)  # finite, >= 0; utilisation <= 1
    if not _lowest(floats, axis=None) >= 0.0:
        return False
    top = _highest(floats, axis=1).tolist()
    if not (max(top[:4]) < math.inf and top[4] <= 1.0):
        return False
    # free <= total: accelerators, then cpu and memory (rows 0-1 against rows 2-3)
    return not (
        _any(np.greater(ints[1], ints[2])) or _any(np.greater(floats[:2], floats[2:4]), axis=None)
    )


def _check_columns(s: ClusterState, n: int) -> None:
    """The per-node column rules one by one, in order; raises naming the first offender."""
    _check_column("state.node_hardware", s.node_hardware, n)
    bad = _first_bad(s.node_hardware >= len(s.hardware))
    if bad is not None:
        raise InvalidInput(
            f"state.node_hardware[{bad}]",
            f"must index state.hardware (< {len(s.hardware)}), got {s.node_hardware[bad]}",
        )
    for name in ("accelerators_free", "accelerators_total", "cpu_free", "cpu_total"):
        _check_column(f"state.{name}", getattr(s, name), n)
    for name in ("memory_free_gb", "memory_total_gb", "queue_length"):
        _check_column(f"state.{name}", getattr(s, name), n)
    _check_column("state.utilisation", s.utilisation, n)
    bad = _first_bad(s.utilisation > 1.0)
    if bad is not None:
        raise InvalidInput(f"state.utilisation[{bad}]", f"must be <= 1, got {s.utilisation[bad]}")
    for free, total in (
        ("accelerators_free", "accelerators_total"),
        ("cpu_free", "cpu_total"),
        ("memory_free_gb", "memory_total_gb"),
    ):
        bad = _first_bad(getattr(s, free) > getattr(s, total))
        if bad is not None:
            raise InvalidInput(f"state.{free}[{bad}]", f"must be <= state.{total}[{bad}]")
    for name in ("healthy", "draining"):
        _check_column(f"state.{name}", getattr(s, name), n, minimum=None)
    for name in ("zone", "locality", "labels"):
        if len(getattr(s, name)) != n:
            raise InvalidInput(f"state.{name}", f"must have one entry per node ({n})")


def validate_request(request: MirrorRequest, limits: RequestLimits | None = None) -> None:
    """Raise `InvalidInput` unless `request` satisfies the contract."""
    limits = limits or RequestLimits()
    if request.schema_version not in SUPPORTED_SCHEMA_VERSIONS:
        raise UnsupportedSchemaVersion(
            "schema_version",
            f"must be one of {sorted(SUPPORTED_SCHEMA_VERSIONS)}, got {request.schema_version}",
        )
    if request.schema_version == V1_SCHEMA:
        check_schema_1(request)  # the version-1 rule (service.contract.schema_versions)
    _check_id("request_id", request.request_id, limits)
    _check_time("request_time", request.request_time)
    # A snapshot shared by many requests is checked once per limits: exact, for the
    # check reads the state and the limits only (service.contract.batch.shared_state).
    shared = shared_state.facts(request.state)
    if shared is None or shared.valid_under != limits:
        validate_state(request, limits)
        if shared is not None:
            shared.valid_under = limits
    validate_workload(request)
    o = request.options
    n_options = o.n_options
    if n_options < 1:
        raise InvalidInput("options", "must list at least one placement option")
    if n_options > limits.max_options:
        raise InvalidInput("options", f"must list at most {limits.max_options}, got {n_options}")
    if o.node_offsets[0] != 0 or o.node_offsets[-1] != len(o.node_index):
        raise InvalidInput("options.node_offsets", "must start at 0 and end at len(node_index)")
    offsets = o.node_offsets
    sizes = offsets[1:] - offsets[:-1]  # np.diff without its Python-level overhead
    bad = _first_bad(sizes < 1) if _lowest(sizes) < 1 else None
    if bad is not None:
        raise InvalidInput(f"options[{bad}]", "must place on at least one node")
    too_big = _highest(sizes) > limits.max_nodes_per_option
    bad = _first_bad(sizes > limits.max_nodes_per_option) if too_big else None
    if bad is not None:
        raise InvalidInput(
            f"options[{bad}]", f"spans more than {limits.max_nodes_per_option} nodes"
        )
    if request.schema_version != V1_SCHEMA:
        _check_gang_size(request.workload.gang_size, sizes)
    if len(o.accelerators) != len(o.node_index):
        raise InvalidInput("options.accelerators", "must have one count per node entry")
    # not empty here: every option has a node, and there is at least one option
    out_of_range = _lowest(o.node_index) < 0 or _highest(o.node_index) >= request.state.n_nodes
    bad = (
        _first_bad((o.node_index < 0) | (o.node_index >= request.state.n_nodes))
        if out_of_range
        else None
    )
    if bad is not None:
        raise InvalidInput(
            f"options.node_index[{bad}]",
            f"must index state nodes (< {request.state.n_nodes}), got {o.node_index[bad]}",
        )
    bad = _first_bad(o.accelerators < 0) if _lowest(o.accelerators) < 0 else None
    if bad is not None:
        raise InvalidInput(
            f"options.accelerators[{bad}]", f"must be >= 0, got {o.accelerators[bad]}"
        )
    if len(o.option_ids) not in (0, n_options):
        raise InvalidInput("options.option_ids", f"must be empty or one per option ({n_options})")
    if o.names_devices or len(o.device_index):
        check_named_devices(request)
    if request.production is not None:
        _check_production("production", request.production, n_options)
    q = request.quota_remaining
    if q is not None and not (math.isfinite(q) and q >= 0):
        raise InvalidInput("quota_remaining", f"must be finite and >= 0, got {q}")
    check_request_texts(request)
    check_request_support(request)  # last: it runs feasibility on the validated request


def _check_gang_size(gang_size: int, sizes: NDArray[np.int64]) -> None:
    """Refuse an option spanning more nodes than `workload.gang_size` (schema 2).

    `gang_size` is the most nodes one option of the job may span: Runtime's job
    spec says how far the gang may spread, and an option beyond it is one
    Runtime enumerated against its own spec. Fewer is fine (a gang of up to 4
    may run on one node). Schema 1 keeps its old meaning (the field was read by
    nothing, and senders such as the simulator sent 1 for spread gangs), so
    only schema-2 requests are held to it (docs/contract.md, "Workload").
    """
    if _highest(sizes) <= gang_size:
        return
    bad = _first_bad(sizes > gang_size)
    assert bad is not None  # some option spans more than gang_size
    raise InvalidInput(
        f"options[{bad}]",
        f"spans {int(sizes[bad])} nodes, more than `workload.gang_size` ({gang_size}), "
        "the most nodes one option of the job may span",
    )


def validate_workload(request: MirrorRequest) -> None:
    """Check the workload's numbers and identifiers."""
    w = request.workload
    _check_id("workload.workload_id", w.workload_id, _DEFAULT_LIMITS)
    check_text("workload.tenant", w.tenant)
    check_text("workload.model_family", w.model_family)
    for name in ("model_size_b", "accelerator_memory_gb", "cpu_per_node", "memory_per_node_gb"):
        value = getattr(w, name)
        if not math.isfinite(value) or value < 0:
            raise InvalidInput(f"workload.{name}", f"must be finite and >= 0, got {value}")
        _check_quantity(f"workload.{name}", value)
    if w.accelerators < 0:
        raise InvalidInput("workload.accelerators", f"must be >= 0, got {w.accelerators}")
    _check_vocabulary("workload.kind", w.kind, required=True)
    _check_vocabulary("workload.qos_class", w.qos_class, required=False)
    share = w.accelerator_share
    if share is not None:
        if not (math.isfinite(share) and 0.0 < share <= 1.0):
            raise InvalidInput("workload.accelerator_share", f"must be in (0, 1], got {share}")
        if w.accelerators != 0:
            raise InvalidInput(
                "workload.accelerators",
                f"must be 0 with workload.accelerator_share (a share of one device), "
                f"got {w.accelerators}",
            )
    if w.gang_size < 1:
        raise InvalidInput("workload.gang_size", f"must be >= 1, got {w.gang_size}")
    for name in ("slo_seconds", "work_units"):
        value = getattr(w, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise InvalidInput(f"workload.{name}", f"must be finite and > 0 when set, got {value}")
        if value is not None:
            _check_quantity(f"workload.{name}", value)


MAX_VOCABULARY_LENGTH = 64
"""Longest workload kind or QoS class accepted: open vocabularies, bounded (issue 22)."""


def _check_vocabulary(field: str, value: str, required: bool) -> None:
    """An open-vocabulary string: any value, bounded, printable; `required` = non-empty."""
    if required and not value:
        raise InvalidInput(field, "must be a non-empty string")
    if len(value) > MAX_VOCABULARY_LENGTH:
        raise InvalidInput(
            field, f"must be at most {MAX_VOCABULARY_LENGTH} characters, got {len(value)}"
        )
    check_text(field, value)


def validate_outcome(outcome: Outcome, limits: RequestLimits | None = None) -> None:
    """Raise `InvalidInput` unless `outcome` satisfies the contract."""
    _check_id("request_id", outcome.request_id, limits or RequestLimits())
    _check_time("observed_at", outcome.observed_at)
    for name in ("queue_delay_s", "throughput", "completion_time_s"):
        value = getattr(outcome, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise InvalidInput(name, f"must be finite and >= 0 when set, got {value}")
    if outcome.production is not None:
        if outcome.production.option < DEFER:
            raise InvalidInput("production.option", "must be -1 (defer) or an option index")
        _check_production("production", outcome.production, n_options=None)
