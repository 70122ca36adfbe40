"""The versioned feature function: (state, workload, option) -> float32 row.

Online scoring and offline replay call this same function, so a policy sees
identical inputs in both. It comes in two forms: `compute_features` for one
request (offline tools, replay of one decision) and `compute_features_batch`
for a whole scorer micro-batch (one numpy pass per column instead of one per
request); they give the same float32 rows bit for bit
(tests/contract/test_features_batch.py). Each decision logs
`FeatureFunction.version` and `FeatureFunction.definition_hash`; the hash
covers the version string, every scaling constant and the source of both
forms of the computation, so any edit to the definition — even one constant —
changes it, and a policy trained on another definition is detected instead of
silently fed shifted inputs.

Features per option (aggregated over the option's nodes; "min" for capabilities
because a gang runs at the pace of its slowest member):

====  ===============================  ==========================================
col   name                             definition
====  ===============================  ==========================================
0     n_nodes                          log1p(nodes in option)
1     cross_node                       1 if the option spans more than one node
2     zones_spanned                    distinct zones - 1
3     localities_spanned               distinct interconnect domains - 1
4     accel_memory                     min per-accelerator memory / memory_scale_gb
5     accel_memory_headroom            (min memory - needed) / memory_scale_gb
6     peak_tflops                      log1p(min TFLOP/s) / log1p(tflops_scale)
7     memory_bandwidth                 min bandwidth / bandwidth_scale_gbps
8     interconnect                     min intra-node link / interconnect_scale_gbps
9     known_hardware                   1 if every class is a known one
10    utilisation                      mean accelerator utilisation of the nodes
11    queue_length                     log1p(max queue length)
12    take_fraction                    accelerators taken / accelerators free on the nodes
13    free_after                       (free - taken) / total accelerators on the nodes
14    cpu_free_fraction                min host CPU free / total
15    memory_free_fraction             min host memory free / total
16    unavailable                      1 if any node drains or is unhealthy
17-20 kind_train..kind_batch           workload kind, one-hot
21    model_size                       log1p(model size in billions)
22    accelerators_requested           log2(1 + accelerators requested)
23    priority                         priority / priority_scale
24    slo                              log1p(SLO seconds) / slo_log_scale; 0 if none
25    compute_per_param                log1p(total TFLOP/s of option / (1 + size_b))
====  ===============================  ==========================================
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
from service.contract.hardware import HardwareClass, is_known_class
from service.contract.state import ClusterState
from service.contract.workload import Workload, WorkloadKind

FEATURE_VERSION = "features-v1"

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
    "model_size",
    "accelerators_requested",
    "priority",
    "slo",
    "compute_per_param",
)
N_FEATURES = len(FEATURE_NAMES)


@dataclass(frozen=True, slots=True)
class FeatureConstants:
    """Scales that keep features near unit range; part of the definition hash."""

    memory_scale_gb: float = 80.0
    tflops_scale: float = 1000.0
    bandwidth_scale_gbps: float = 3350.0
    interconnect_scale_gbps: float = 900.0
    priority_scale: float = 10.0
    slo_log_scale: float = 12.0


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

    hw_mem = np.array([h.accelerator_memory_gb for h in state.hardware], dtype=np.float64)
    hw_tflops = np.array([h.peak_dense_tflops for h in state.hardware], dtype=np.float64)
    hw_bw = np.array([h.memory_bandwidth_gbps for h in state.hardware], dtype=np.float64)
    hw_link = np.array([h.interconnect_gbps for h in state.hardware], dtype=np.float64)
    hw_known = np.array([is_known_class(h) for h in state.hardware], dtype=np.float64)
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
    for col, kind in enumerate(WorkloadKind, start=17):
        out[:, col] = workload.kind == kind
    out[:, 21] = np.log1p(workload.model_size_b)
    out[:, 22] = np.log2(1.0 + workload.accelerators)
    out[:, 23] = workload.priority / c.priority_scale
    out[:, 24] = np.log1p(workload.slo_seconds) / c.slo_log_scale if workload.slo_seconds else 0.0
    option_tflops = total(hw_tflops[cls] * taken)
    out[:, 25] = np.log1p(option_tflops / (1.0 + workload.model_size_b))
    return out.astype(np.float32)


def _hardware_numbers(hardware: HardwareClass) -> tuple[float, float, float, float, float]:
    """(memory, TFLOP/s, bandwidth, link, known) of one class, as the row builder reads them."""
    return (
        hardware.accelerator_memory_gb,
        hardware.peak_dense_tflops,
        hardware.memory_bandwidth_gbps,
        hardware.interconnect_gbps,
        1.0 if is_known_class(hardware) else 0.0,
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
    per_workload = np.zeros((n_req, 7), dtype=np.float64)
    hardware: list[tuple[float, float, float, float, float]] = []
    kinds = list(WorkloadKind)
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
            kinds.index(workload.kind),
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

    hw = np.array(hardware, dtype=np.float64).reshape(-1, 5)
    cls = column("node_hardware").astype(np.int64) + hw_base[req_of_entry]
    hw_mem, hw_tflops, hw_bw, hw_link, hw_known = (hw[:, k] for k in range(5))

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

    out = np.empty((n_opt, N_FEATURES), dtype=np.float64)
    out[:, 0] = np.log1p(per_opt_nodes)
    out[:, 1] = per_opt_nodes > 1
    out[:, 2:4] = 0.0
    request_of_option = np.repeat(np.arange(n_req), n_options)
    for r in np.unique(request_of_option[per_opt_nodes_int > 1]):
        rows = slice(option_base[r], option_base[r] + n_options[r])
        zones, localities = _distinct_of_request(states[r], opts[r])
        out[rows, 2] = zones - 1
        out[rows, 3] = localities - 1
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
    for col in range(len(kinds)):
        out[:, 17 + col] = w[:, 6] == col
    out[:, 21] = np.log1p(w[:, 1])
    out[:, 22] = np.log2(1.0 + w[:, 2])
    out[:, 23] = w[:, 3] / c.priority_scale
    out[:, 24] = np.where(w[:, 5] > 0, np.log1p(w[:, 4]) / c.slo_log_scale, 0.0)
    option_tflops = total(hw_tflops[cls] * taken)
    out[:, 25] = np.log1p(option_tflops / (1.0 + w[:, 1]))
    return out.astype(np.float32)


_DEFINITION = (
    compute_features,
    _min_per_option,
    _distinct_per_option,
    compute_features_batch,
    _hardware_numbers,
    _distinct_of_request,
    _same_dtypes,
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
        """sha256 over version, names, constants and the source of both forms of the computation.

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
                "source": [inspect.getsource(fn) for fn in _DEFINITION],
            },
            sort_keys=True,
        )
        return hashlib.sha256(material.encode()).hexdigest()


DEFAULT_FEATURES = FeatureFunction()
