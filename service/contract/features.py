"""The versioned feature function: (state, workload, option) -> float32 row.

Online scoring and offline replay call this same function, so a policy sees
identical inputs in both. It comes in two forms: `compute_features` for one
request (offline tools, replay of one decision) and `compute_features_batch`
for a whole scorer micro-batch (one numpy pass per column instead of one per
request); they give the same float32 rows bit for bit
(tests/contract/test_features_batch.py). Each decision logs
`FeatureFunction.version` and `FeatureFunction.definition_hash`; the hash
covers the version string, every scaling constant, the imputed capability
numbers and the source of both forms of the computation, so any edit to the
definition — even one constant — changes it, and a policy trained on another
definition is detected instead of silently fed shifted inputs.

`features-v2` (contract v2, issues 22 and 23) keeps every `features-v1`
column (same definitions, some at new positions) and adds: an open workload
kind ("other"), the QoS class, a share request, the fit of the option's
devices, explicit indicators for unknown capability numbers, and the gang's
shape (accelerators per node, interconnect class).

Features per option (aggregated over the option's nodes; "min" for capabilities
because a gang runs at the pace of its slowest member):

=====  ==========================  ==========================================
col    name                        definition
=====  ==========================  ==========================================
0      n_nodes                     log1p(nodes in option)
1      cross_node                  1 if the option spans more than one node
2      zones_spanned               distinct zones - 1
3      localities_spanned          distinct interconnect domains - 1
4      accel_memory                min per-accelerator memory / memory_scale_gb
5      accel_memory_headroom       (min memory - needed) / memory_scale_gb
6      peak_tflops                 log1p(min TFLOP/s) / log1p(tflops_scale)
7      memory_bandwidth            min bandwidth / bandwidth_scale_gbps
8      interconnect                min intra-node link / interconnect_scale_gbps
9      known_hardware              1 if every class is a known one
10     utilisation                 mean accelerator utilisation of the nodes
11     queue_length                log1p(max queue length)
12     take_fraction               accelerators taken / accelerators free on the nodes
13     free_after                  (free - taken) / total accelerators on the nodes
14     cpu_free_fraction           min host CPU free / total
15     memory_free_fraction        min host memory free / total
16     unavailable                 1 if any node drains or is unhealthy
17-20  kind_train..kind_batch      workload kind, one-hot over `WorkloadKind`
21     kind_other                  1 if the kind is none of those (open vocabulary)
22     qos_latency_sensitive       1 if QoS is ``LS`` or ``Guaranteed``
23     qos_best_effort             1 if QoS is ``BE`` or ``BestEffort``
24     qos_burstable               1 if QoS is ``Burstable``
25     qos_other                   1 if QoS is set and none of the above;
                                   unset QoS (``""``) = all four 0
26     model_size                  log1p(model size in billions)
27     accelerators_requested      log2(1 + whole accelerators requested)
28     accelerator_share           the share of one device asked for; 0 = whole devices
29     priority                    priority / priority_scale
30     slo                         log1p(SLO seconds) / slo_log_scale; 0 if none
31     compute_per_param           log1p(total TFLOP/s of option / (1 + size_b))
32     capability_unknown          1 if a class of the option leaves any capability
                                   number unknown (imputed in columns 4-8, 31)
33     accel_memory_unknown        1 if a class of the option leaves its memory unknown
34     device_free_share           best free share among the option's compatible devices
35     device_memory_headroom      (best free memory among them - needed) / memory_scale_gb
36     accelerators_per_node_min   log2(1 + fewest accelerators the option takes on a node)
37     accelerators_per_node_max   log2(1 + most accelerators the option takes on a node)
38     interconnect_class          slowest link tier the gang crosses: 0 = one node
                                   (its intra-node link, col 8), 1 = several
                                   nodes of one locality, 2 = several localities
=====  ==========================  ==========================================

Unknown capability numbers (None) are imputed with `IMPUTED_CAPABILITIES`, the
median over the known accelerator classes of `KNOWN_HARDWARE` (24 GB, 125
TFLOP/s, 900 GB/s, 300 GB/s; `service.contract.imputation` says why the
median), and flagged by columns 32-33, so every row is finite.

Devices (columns 34-35) are read through `service.contract.devices.node_devices`
(sent per device, or derived from node counts by its one rule). An entry's
devices are those it names (``options.device_index``) or else every device of
its node; *compatible* ones have a class the workload allows (empty
``allowed_hardware`` = any) that has accelerators. With none, the best share
and best memory are 0. A device's free memory that is unknown (NaN: derived
from a class of unknown memory) counts as the imputed memory.

Gang shape (issue 23): nodes (col 0), localities spanned (col 3) and
accelerators per node (cols 36-37) tell a one-node ``4`` from ``22`` and
``1111`` from the options alone. The interconnect class (col 38) is derived
only from what the request says: an option on one node talks over that
node's intra-node link (its class's ``interconnect_gbps``, col 8); one on
several nodes of one locality (``ClusterState.locality``, the interconnect
domain: rack, NVLink or InfiniBand island) crosses the links between nodes of
a domain; one on several localities crosses domains, the slowest tier. The
contract carries no bandwidth between nodes or domains, so the class is an
ordinal tier, not a number invented for it; ``workload.gang_size`` is not
read (the options say the shape).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.contract.actions import PlacementOptions
from service.contract.devices import node_devices
from service.contract.hardware import HardwareClass, is_known_class
from service.contract.imputation import IMPUTED_CAPABILITIES, capability_numbers
from service.contract.state import ClusterState
from service.contract.workload import Workload, WorkloadKind

FEATURE_VERSION = "features-v2"

FEATURE_NAMES: tuple[str, ...] = (
    "n_nodes",
    "cross_node",
    "zones_spanned",
    "localities_spanned",
    "accel_memory",
    "accel_memory_headroom",
    "peak_tflops",
    "memory_bandwidth",
    "interconnect",
    "known_hardware",
    "utilisation",
    "queue_length",
    "take_fraction",
    "free_after",
    "cpu_free_fraction",
    "memory_free_fraction",
    "unavailable",
    "kind_train",
    "kind_finetune",
    "kind_infer",
    "kind_batch",
    "kind_other",
    "qos_latency_sensitive",
    "qos_best_effort",
    "qos_burstable",
    "qos_other",
    "model_size",
    "accelerators_requested",
    "accelerator_share",
    "priority",
    "slo",
    "compute_per_param",
    "capability_unknown",
    "accel_memory_unknown",
    "device_free_share",
    "device_memory_headroom",
    "accelerators_per_node_min",
    "accelerators_per_node_max",
    "interconnect_class",
)
N_FEATURES = len(FEATURE_NAMES)

KIND_COLUMNS: tuple[str, ...] = tuple(k.value for k in WorkloadKind)
"""Known kinds in one-hot order (columns 17-20); any other kind sets `kind_other`."""

QOS_GROUPS: tuple[tuple[str, ...], ...] = (
    ("LS", "Guaranteed"),
    ("BE", "BestEffort"),
    ("Burstable",),
)
"""QoS classes per one-hot column 22-24 (latency-sensitive, best-effort, burstable);
any other non-empty class sets `qos_other` (column 25), an unset one none."""


@dataclass(frozen=True, slots=True)
class FeatureConstants:
    """Scales that keep features near unit range; part of the definition hash."""

    memory_scale_gb: float = 80.0
    tflops_scale: float = 1000.0
    bandwidth_scale_gbps: float = 3350.0
    interconnect_scale_gbps: float = 900.0
    priority_scale: float = 10.0
    slo_log_scale: float = 12.0


def kind_code(kind: str) -> int:
    """Column offset of `kind` among the kind columns: 0-3 known, 4 = other (never raises)."""
    return KIND_COLUMNS.index(kind) if kind in KIND_COLUMNS else len(KIND_COLUMNS)


def qos_code(qos_class: str) -> int:
    """Column offset of `qos_class` among the QoS columns: 0-2 grouped, 3 = other, -1 = unset."""
    if not qos_class:
        return -1
    for code, group in enumerate(QOS_GROUPS):
        if qos_class in group:
            return code
    return len(QOS_GROUPS)


def _min_per_option(values: NDArray[np.float64], starts: NDArray[np.int64]) -> NDArray[np.float64]:
    return np.minimum.reduceat(values, starts) if len(values) else np.zeros(0)


def _distinct_per_option(
    codes: NDArray[np.int64], entry_option: NDArray[np.int64], n_options: int
) -> NDArray[np.float64]:
    """Distinct codes per option, counted with one unique over (option, code) pairs."""
    if len(codes) == 0:
        return np.zeros(n_options)
    pairs = np.unique(entry_option * (int(codes.max()) + 1) + codes)
    counts = np.bincount(pairs // (int(codes.max()) + 1), minlength=n_options)
    return counts.astype(np.float64)


def _device_fit(
    items: Sequence[tuple[ClusterState, Workload, PlacementOptions]],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Best free share and best free memory (GB) among each option's compatible devices.

    One function for both forms (the per-request form calls it with one item),
    so they agree by construction. Per request it reads the devices through
    `node_devices` and marks compatible classes (allowed, with accelerators);
    then every (option, device) pair of the whole batch is expanded in one
    pass and reduced with an order-independent maximum from 0.
    """
    imputed_memory = IMPUTED_CAPABILITIES["accelerator_memory_gb"]
    shares: list[NDArray[np.float64]] = []
    memories: list[NDArray[np.float64]] = []
    named_parts: list[NDArray[np.int64]] = []
    starts: list[NDArray[np.int64]] = []
    counts: list[NDArray[np.int64]] = []
    named_entry: list[NDArray[np.bool_]] = []
    entry_option: list[NDArray[np.int64]] = []
    dev_base = named_base = option_base = 0
    for state, workload, options in items:
        devices = node_devices(state)
        allowed = workload.allowed_hardware
        ok_class = np.array(
            [h.has_accelerators and (not allowed or h.name in allowed) for h in state.hardware]
            + [False],
            dtype=bool,
        )
        ok = ok_class[devices.hardware]
        memory = devices.free_memory_gb.astype(np.float64)
        memory = np.where(np.isnan(memory), imputed_memory, memory)
        shares.append(np.where(ok, devices.free_share.astype(np.float64), 0.0))
        memories.append(np.where(ok, memory, 0.0))
        n_entries = len(options.node_index)
        if options.names_devices:
            named_parts.append(np.asarray(options.device_index, dtype=np.int64) + dev_base)
            offsets = np.asarray(options.device_offsets, dtype=np.int64)
            starts.append(offsets[:-1] + named_base)
            counts.append(np.diff(offsets))
            named_entry.append(np.ones(n_entries, dtype=bool))
            named_base += len(options.device_index)
        else:
            nodes = np.asarray(options.node_index, dtype=np.int64)
            starts.append(devices.offsets[:-1][nodes] + dev_base)
            counts.append(np.diff(devices.offsets)[nodes])
            named_entry.append(np.zeros(n_entries, dtype=bool))
        entry_option.append(np.asarray(options.entry_option, dtype=np.int64) + option_base)
        dev_base += devices.n_devices
        option_base += options.n_options
    n_opt = option_base
    best_share = np.zeros(n_opt)
    best_memory = np.zeros(n_opt)
    count = np.concatenate(counts).astype(np.int64)
    if count.sum() == 0:
        return best_share, best_memory
    start = np.concatenate(starts).astype(np.int64)
    named = np.concatenate(named_entry)
    # one pointer space: every device (identity), then every named-device list
    pointer = np.concatenate([np.arange(dev_base, dtype=np.int64), *named_parts], dtype=np.int64)
    start = np.where(named, start + dev_base, start)
    first = np.cumsum(count) - count
    position = np.repeat(start - first, count) + np.arange(int(count.sum()), dtype=np.int64)
    device = pointer[position]
    option = np.repeat(np.concatenate(entry_option), count)
    np.maximum.at(best_share, option, np.concatenate(shares)[device])
    np.maximum.at(best_memory, option, np.concatenate(memories)[device])
    return best_share, best_memory


def compute_features(
    constants: FeatureConstants,
    state: ClusterState,
    workload: Workload,
    options: PlacementOptions,
) -> NDArray[np.float32]:
    """Feature matrix of shape ``(n_options, N_FEATURES)``, float32, all finite.

    Every option must have at least one node (the validator guarantees it).
    """
    c = constants
    n_opt = options.n_options
    starts = options.node_offsets[:-1]
    entry_option = options.entry_option
    nodes = options.node_index
    taken = options.accelerators.astype(np.float64)
    per_opt_nodes = options.nodes_per_option.astype(np.float64)

    hw = np.array([_hardware_numbers(h) for h in state.hardware], dtype=np.float64).reshape(-1, 7)
    hw_mem, hw_tflops, hw_bw, hw_link, hw_known, hw_unknown, hw_mem_unknown = hw.T
    cls = state.node_hardware[nodes]

    def total(values: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.bincount(entry_option, weights=values, minlength=n_opt).astype(np.float64)

    zone_codes = np.unique(np.asarray(state.zone, dtype=object), return_inverse=True)[1]
    locality_codes = np.unique(np.asarray(state.locality, dtype=object), return_inverse=True)[1]
    free = state.accelerators_free[nodes].astype(np.float64)
    total_accel = state.accelerators_total[nodes].astype(np.float64)
    min_mem = _min_per_option(hw_mem[cls], starts)
    min_tflops = _min_per_option(hw_tflops[cls], starts)
    cpu_frac = state.cpu_free[nodes] / np.maximum(state.cpu_total[nodes], 1e-9)
    mem_frac = state.memory_free_gb[nodes] / np.maximum(state.memory_total_gb[nodes], 1e-9)
    unavailable = (state.draining[nodes] | ~state.healthy[nodes]).astype(np.float64)
    share = workload.accelerator_share or 0.0
    best_share, best_memory = _device_fit([(state, workload, options)])

    out = np.empty((n_opt, N_FEATURES), dtype=np.float64)
    out[:, 0] = np.log1p(per_opt_nodes)
    out[:, 1] = per_opt_nodes > 1
    out[:, 2] = _distinct_per_option(zone_codes[nodes], entry_option, n_opt) - 1
    out[:, 3] = _distinct_per_option(locality_codes[nodes], entry_option, n_opt) - 1
    out[:, 4] = min_mem / c.memory_scale_gb
    out[:, 5] = (min_mem - workload.accelerator_memory_gb) / c.memory_scale_gb
    out[:, 6] = np.log1p(min_tflops) / np.log1p(c.tflops_scale)
    out[:, 7] = _min_per_option(hw_bw[cls], starts) / c.bandwidth_scale_gbps
    out[:, 8] = _min_per_option(hw_link[cls], starts) / c.interconnect_scale_gbps
    out[:, 9] = _min_per_option(hw_known[cls], starts)
    out[:, 10] = total(state.utilisation[nodes].astype(np.float64)) / per_opt_nodes
    out[:, 11] = np.log1p(np.maximum.reduceat(state.queue_length[nodes].astype(np.float64), starts))
    out[:, 12] = total(taken) / np.maximum(total(free), 1.0)
    out[:, 13] = (total(free) - total(taken)) / np.maximum(total(total_accel), 1.0)
    out[:, 14] = _min_per_option(cpu_frac.astype(np.float64), starts)
    out[:, 15] = _min_per_option(mem_frac.astype(np.float64), starts)
    out[:, 16] = np.maximum.reduceat(unavailable, starts)
    out[:, 17:26] = 0.0
    out[:, 17 + kind_code(workload.kind)] = 1.0
    qos = qos_code(workload.qos_class)
    if qos >= 0:
        out[:, 22 + qos] = 1.0
    out[:, 26] = np.log1p(workload.model_size_b)
    out[:, 27] = np.log2(1.0 + workload.accelerators)
    out[:, 28] = share
    out[:, 29] = workload.priority / c.priority_scale
    out[:, 30] = np.log1p(workload.slo_seconds) / c.slo_log_scale if workload.slo_seconds else 0.0
    option_tflops = total(hw_tflops[cls] * taken)
    out[:, 31] = np.log1p(option_tflops / (1.0 + workload.model_size_b))
    out[:, 32] = np.maximum.reduceat(hw_unknown[cls], starts)
    out[:, 33] = np.maximum.reduceat(hw_mem_unknown[cls], starts)
    out[:, 34] = best_share
    out[:, 35] = (best_memory - workload.accelerator_memory_gb) / c.memory_scale_gb
    out[:, 36] = np.log2(1.0 + _min_per_option(taken, starts))
    out[:, 37] = np.log2(1.0 + np.maximum.reduceat(taken, starts))
    out[:, 38] = out[:, 1] + (out[:, 3] > 0)  # 0 one node, 1 one locality, 2 several
    return out.astype(np.float32)


def _hardware_numbers(
    hardware: HardwareClass,
) -> tuple[float, float, float, float, float, float, float]:
    """(memory, TFLOP/s, bandwidth, link, known, any unknown, memory unknown) of one class.

    Unknown numbers are imputed (`capability_numbers`) and flagged in the last two.
    """
    return (
        *capability_numbers(hardware),
        1.0 if is_known_class(hardware) else 0.0,
        1.0 if hardware.unknown_capabilities else 0.0,
        1.0 if hardware.accelerator_memory_gb is None else 0.0,
    )


def _distinct_of_request(
    state: ClusterState, options: PlacementOptions
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Distinct zones and interconnect domains per option of one request."""
    nodes = options.node_index
    entry_option = options.entry_option
    n_opt = options.n_options
    zone_codes = np.unique(np.asarray(state.zone, dtype=object), return_inverse=True)[1]
    locality_codes = np.unique(np.asarray(state.locality, dtype=object), return_inverse=True)[1]
    return (
        _distinct_per_option(zone_codes[nodes], entry_option, n_opt),
        _distinct_per_option(locality_codes[nodes], entry_option, n_opt),
    )


_NODE_COLUMNS = (
    "node_hardware",
    "accelerators_free",
    "accelerators_total",
    "cpu_free",
    "cpu_total",
    "memory_free_gb",
    "memory_total_gb",
    "utilisation",
    "queue_length",
    "healthy",
    "draining",
)


def _same_dtypes(states: Sequence[ClusterState]) -> bool:
    """Whether every node column has one dtype across `states`.

    Some columns are computed in their own precision (``cpu_free / cpu_total``
    in float32, as the wire delivers them; ``~healthy`` on bools); concatenating
    a float32 state with a float64 one would silently widen the first, so such
    a (rare, hand-built) batch is featurised request by request instead.
    """
    first = states[0]
    for name in _NODE_COLUMNS:
        dtype = getattr(first, name).dtype
        if any(getattr(s, name).dtype != dtype for s in states):
            return False
    return True


def compute_features_batch(
    constants: FeatureConstants,
    items: Sequence[tuple[ClusterState, Workload, PlacementOptions]],
) -> NDArray[np.float32]:
    """Features of every option of every request, stacked: ``(sum of n_options, N_FEATURES)``.

    Row for row the same float32 values as `compute_features` on each request
    (tests/contract/test_features_batch.py holds them bit-identical), computed
    with one numpy pass per column over the whole micro-batch instead of one per
    request: per-request numpy calls, not arithmetic, are what a row costs.
    Every element goes through the same float64 operations in the same order —
    sums accumulate a node's entries in CSR order in both — so batching cannot
    change a bit. Zones and interconnect domains are only counted for requests
    that have a multi-node option: a one-node option spans one of each.
    """
    c = constants
    n_req = len(items)
    if n_req == 0:
        return np.zeros((0, N_FEATURES), dtype=np.float32)
    node_base = np.zeros(n_req, dtype=np.int64)
    hw_base = np.zeros(n_req, dtype=np.int64)
    n_options = np.zeros(n_req, dtype=np.int64)
    n_entries = np.zeros(n_req, dtype=np.int64)
    per_workload = np.zeros((n_req, 9), dtype=np.float64)
    hardware: list[tuple[float, float, float, float, float, float, float]] = []
    n_nodes_total = 0
    for r, (state, workload, options) in enumerate(items):
        node_base[r] = n_nodes_total
        n_nodes_total += len(state.node_hardware)
        hw_base[r] = len(hardware)
        hardware += [_hardware_numbers(h) for h in state.hardware]
        n_options[r] = len(options.node_offsets) - 1
        n_entries[r] = len(options.node_index)
        per_workload[r] = (
            workload.accelerator_memory_gb,
            workload.model_size_b,
            workload.accelerators,
            workload.priority,
            workload.slo_seconds or 0.0,
            1.0 if workload.slo_seconds else 0.0,
            kind_code(workload.kind),
            qos_code(workload.qos_class),
            workload.accelerator_share or 0.0,
        )
    states = [s for s, _, _ in items]
    opts = [o for _, _, o in items]
    if not _same_dtypes(states):
        return np.concatenate([compute_features(c, s, w, o) for s, w, o in items])
    n_opt = int(n_options.sum())
    entry_base = np.concatenate([[0], np.cumsum(n_entries)[:-1]]).astype(np.int64)
    option_base = np.concatenate([[0], np.cumsum(n_options)[:-1]]).astype(np.int64)
    req_of_entry = np.repeat(np.arange(n_req), n_entries)
    nodes = np.concatenate([o.node_index for o in opts]).astype(np.int64) + node_base[req_of_entry]
    starts = np.concatenate([o.node_offsets[:-1] for o in opts]).astype(np.int64) + np.repeat(
        entry_base, n_options
    )
    per_opt_nodes_int = np.concatenate([np.diff(o.node_offsets) for o in opts])
    entry_option = np.repeat(np.arange(n_opt), per_opt_nodes_int)
    taken = np.concatenate([o.accelerators for o in opts]).astype(np.float64)
    per_opt_nodes = per_opt_nodes_int.astype(np.float64)

    def column(name: str) -> NDArray[Any]:
        joined: NDArray[Any] = np.concatenate([getattr(s, name) for s in states])
        picked: NDArray[Any] = joined[nodes]
        return picked

    hw = np.array(hardware, dtype=np.float64).reshape(-1, 7)
    cls = column("node_hardware").astype(np.int64) + hw_base[req_of_entry]
    hw_mem, hw_tflops, hw_bw, hw_link, hw_known, hw_unknown, hw_mem_unknown = (
        hw[:, k] for k in range(7)
    )

    def total(values: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.bincount(entry_option, weights=values, minlength=n_opt).astype(np.float64)

    free = column("accelerators_free").astype(np.float64)
    total_accel = column("accelerators_total").astype(np.float64)
    min_mem = _min_per_option(hw_mem[cls], starts)
    min_tflops = _min_per_option(hw_tflops[cls], starts)
    cpu_frac = column("cpu_free") / np.maximum(column("cpu_total"), 1e-9)
    mem_frac = column("memory_free_gb") / np.maximum(column("memory_total_gb"), 1e-9)
    unavailable = (column("draining") | ~column("healthy")).astype(np.float64)
    w = np.repeat(per_workload, n_options, axis=0)
    best_share, best_memory = _device_fit(items)
    rows = np.arange(n_opt)

    out = np.empty((n_opt, N_FEATURES), dtype=np.float64)
    out[:, 0] = np.log1p(per_opt_nodes)
    out[:, 1] = per_opt_nodes > 1
    out[:, 2:4] = 0.0
    request_of_option = np.repeat(np.arange(n_req), n_options)
    for r in np.unique(request_of_option[per_opt_nodes_int > 1]):
        span = slice(option_base[r], option_base[r] + n_options[r])
        zones, localities = _distinct_of_request(states[r], opts[r])
        out[span, 2] = zones - 1
        out[span, 3] = localities - 1
    out[:, 4] = min_mem / c.memory_scale_gb
    out[:, 5] = (min_mem - w[:, 0]) / c.memory_scale_gb
    out[:, 6] = np.log1p(min_tflops) / np.log1p(c.tflops_scale)
    out[:, 7] = _min_per_option(hw_bw[cls], starts) / c.bandwidth_scale_gbps
    out[:, 8] = _min_per_option(hw_link[cls], starts) / c.interconnect_scale_gbps
    out[:, 9] = _min_per_option(hw_known[cls], starts)
    out[:, 10] = total(column("utilisation").astype(np.float64)) / per_opt_nodes
    out[:, 11] = np.log1p(np.maximum.reduceat(column("queue_length").astype(np.float64), starts))
    out[:, 12] = total(taken) / np.maximum(total(free), 1.0)
    out[:, 13] = (total(free) - total(taken)) / np.maximum(total(total_accel), 1.0)
    out[:, 14] = _min_per_option(cpu_frac.astype(np.float64), starts)
    out[:, 15] = _min_per_option(mem_frac.astype(np.float64), starts)
    out[:, 16] = np.maximum.reduceat(unavailable, starts)
    out[:, 17:26] = 0.0
    out[rows, 17 + w[:, 6].astype(np.int64)] = 1.0
    qos = w[:, 7].astype(np.int64)
    out[rows[qos >= 0], 22 + qos[qos >= 0]] = 1.0
    out[:, 26] = np.log1p(w[:, 1])
    out[:, 27] = np.log2(1.0 + w[:, 2])
    out[:, 28] = w[:, 8]
    out[:, 29] = w[:, 3] / c.priority_scale
    out[:, 30] = np.where(w[:, 5] > 0, np.log1p(w[:, 4]) / c.slo_log_scale, 0.0)
    option_tflops = total(hw_tflops[cls] * taken)
    out[:, 31] = np.log1p(option_tflops / (1.0 + w[:, 1]))
    out[:, 32] = np.maximum.reduceat(hw_unknown[cls], starts)
    out[:, 33] = np.maximum.reduceat(hw_mem_unknown[cls], starts)
    out[:, 34] = best_share
    out[:, 35] = (best_memory - w[:, 0]) / c.memory_scale_gb
    out[:, 36] = np.log2(1.0 + _min_per_option(taken, starts))
    out[:, 37] = np.log2(1.0 + np.maximum.reduceat(taken, starts))
    out[:, 38] = out[:, 1] + (out[:, 3] > 0)  # 0 one node, 1 one locality, 2 several
    return out.astype(np.float32)


_DEFINITION = (
    compute_features,
    kind_code,
    qos_code,
    _min_per_option,
    _distinct_per_option,
    _device_fit,
    compute_features_batch,
    _hardware_numbers,
    _distinct_of_request,
    _same_dtypes,
    capability_numbers,
    node_devices,
)
"""Every function whose source defines the features (the hash covers them all)."""


@dataclass(frozen=True)
class FeatureFunction:
    """The feature function with its identity (version + definition hash)."""

    constants: FeatureConstants = dataclasses.field(default_factory=FeatureConstants)
    version: str = FEATURE_VERSION
    names: tuple[str, ...] = FEATURE_NAMES

    def __call__(
        self, state: ClusterState, workload: Workload, options: PlacementOptions
    ) -> NDArray[np.float32]:
        """Features of every option, shape ``(n_options, N_FEATURES)``."""
        return compute_features(self.constants, state, workload, options)

    def batch(
        self, items: Sequence[tuple[ClusterState, Workload, PlacementOptions]]
    ) -> NDArray[np.float32]:
        """Features of every option of every (state, workload, options), stacked in order."""
        return compute_features_batch(self.constants, items)

    @functools.cached_property
    def definition_hash(self) -> str:
        """sha256 over version, names, constants, imputed numbers, vocabularies and the source.

        Computed once per instance: it reads source files (`inspect.getsource`), which
        cost ~2.8% of the service's CPU when the scorer asked for it on every batch. The
        fields are frozen, so the value cannot go stale.

        The batched form is what online scoring runs and the per-request form
        what offline tools run; they are held bit-identical by a test, and both
        are covered, so editing either one changes the hash.
        """
        material = json.dumps(
            {
                "version": self.version,
                "names": list(self.names),
                "constants": dataclasses.asdict(self.constants),
                "imputed": dict(IMPUTED_CAPABILITIES),
                "kinds": list(KIND_COLUMNS),
                "qos": [list(g) for g in QOS_GROUPS],
                "source": [inspect.getsource(fn) for fn in _DEFINITION],
            },
            sort_keys=True,
        )
        return hashlib.sha256(material.encode()).hexdigest()


DEFAULT_FEATURES = FeatureFunction()
