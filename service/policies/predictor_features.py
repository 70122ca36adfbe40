"""The throughput predictor's own small, versioned feature function.

The contract's feature rows describe an option for a scoring policy; the
predictor needs something narrower: *which job* (model family and batch size)
on *which hardware* (capability numbers, never a class name) at *what scale*
(accelerators taken) and whether the gang sits on one server. A capability number
a class leaves unknown (None) is imputed with the contract's documented value
(`service.contract.imputation`: the median of the known accelerator
classes), so a row is never NaN. Every column is
computed from contract objects at scoring time, and the build script calls the
same `compute_predictor_features` on the Gavel table, so training and serving
agree by construction. Like the contract's function, the definition hash
covers the version, names, constants and source, and the registry refuses a
predictor built on another definition.

``Workload.model_family`` may carry a batch size the way Gavel names job
types, e.g. ``"ResNet-50 (batch size 64)"``; without one, the family's
default batch size is assumed.

====  =====================  ==============================================
col   name                   definition
====  =====================  ==============================================
0-6   family_*               one-hot over `GAVEL_FAMILIES`; all 0 = unknown
7     log2_batch_size        log2(batch size); 0 for families without one
8     log2_peak_tflops       log2(1 + min peak TFLOP/s over the option)
9     memory_bandwidth_tbps  min memory bandwidth, TB/s
10    accel_memory_gb        min per-accelerator memory, GB
11    interconnect_100gbps   min intra-node link, 100 GB/s
12    log2_accelerators      log2(accelerators taken by the option)
13    consolidated           1 if the option is one node
14    log2_nodes             log2(nodes the option spans)
15    log2_per_node_min      log2(fewest accelerators the option takes on one node)
16    log2_per_node_max      log2(most accelerators the option takes on one node)
17    cross_locality         1 if its nodes span more than one ``state.locality``
====  =====================  ==============================================

Gang shape (issue 23), columns 14-17: a 4-GPU option placed ``4`` (one node),
``22`` (two nodes of two) or ``1111`` (four nodes of one) has log2_nodes 0 / 1 / 2
and per-node min = max = 2 / 1 / 0, so the three rows differ, and measured
throughput does differ between them (`service.environment.shapes`); an uneven
gang (``31``) has min != max. ``cross_locality`` says whether the gang
crosses an interconnect domain (the contract's `locality`), so the same shape
across two racks is a different row from the same shape inside one; a bit,
not a count, because the measured-data model charges a domain crossing once
(a ring all-reduce runs at its slowest link: `service.environment.shapes`).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.contract import MirrorRequest, Workload
from service.contract.imputation import IMPUTED_CAPABILITIES, capability_numbers

PREDICTOR_FEATURE_VERSION = "gavel-predictor-features-v2"

GAVEL_FAMILIES: tuple[str, ...] = (
    "A3C",
    "CycleGAN",
    "LM",
    "Recommendation",
    "ResNet-18",
    "ResNet-50",
    "Transformer",
)
"""Model families measured by Gavel, in one-hot column order."""

DEFAULT_BATCH_SIZE: Mapping[str, int] = MappingProxyType(
    {"LM": 20, "Recommendation": 2048, "ResNet-18": 64, "ResNet-50": 32, "Transformer": 64}
)
"""Batch size assumed when ``model_family`` names none (the middle Gavel size)."""

PREDICTOR_FEATURE_NAMES: tuple[str, ...] = (
    *(f"family_{f.lower().replace('-', '')}" for f in GAVEL_FAMILIES),
    "log2_batch_size",
    "log2_peak_tflops",
    "memory_bandwidth_tbps",
    "accel_memory_gb",
    "interconnect_100gbps",
    "log2_accelerators",
    "consolidated",
    "log2_nodes",
    "log2_per_node_min",
    "log2_per_node_max",
    "cross_locality",
)
N_PREDICTOR_FEATURES = len(PREDICTOR_FEATURE_NAMES)

_BATCH_SUFFIX = re.compile(r"^\s*(?P<family>.*?)\s*\(batch size (?P<batch>\d+)\)\s*$")


@dataclass(frozen=True, slots=True)
class JobType:
    """A model family and its batch size (None when the family has none)."""

    family: str
    batch_size: int | None

    @property
    def known(self) -> bool:
        """Whether the family is one Gavel measured."""
        return self.family in GAVEL_FAMILIES


def parse_job_type(model_family: str) -> JobType:
    """Split ``"ResNet-50 (batch size 64)"`` into family and batch size.

    Family names match `GAVEL_FAMILIES` case-insensitively; an unknown family
    is kept as written (its one-hot row is all zeros).
    """
    match = _BATCH_SUFFIX.match(model_family)
    name = match.group("family") if match else model_family.strip()
    batch = int(match.group("batch")) if match else None
    canonical = {f.lower(): f for f in GAVEL_FAMILIES}.get(name.lower(), name)
    if batch is None:
        batch = DEFAULT_BATCH_SIZE.get(canonical)
    return JobType(canonical, batch)


def job_columns(job: JobType) -> NDArray[np.float64]:
    """The job's columns (0-7): family one-hot and log2 batch size."""
    cols = np.zeros(len(GAVEL_FAMILIES) + 1)
    if job.known:
        cols[GAVEL_FAMILIES.index(job.family)] = 1.0
    cols[-1] = math.log2(job.batch_size) if job.batch_size else 0.0
    return cols


def compute_predictor_features(
    job: NDArray[np.float64],
    peak_tflops: NDArray[np.float64],
    memory_bandwidth_gbps: NDArray[np.float64],
    accelerator_memory_gb: NDArray[np.float64],
    interconnect_gbps: NDArray[np.float64],
    accelerators: NDArray[np.float64],
    consolidated: NDArray[np.float64],
    nodes: NDArray[np.float64] | None = None,
    per_node_min: NDArray[np.float64] | None = None,
    per_node_max: NDArray[np.float64] | None = None,
    localities: NDArray[np.float64] | None = None,
) -> NDArray[np.float32]:
    """Rows of shape ``(n, N_PREDICTOR_FEATURES)``, float32.

    `job` has shape ``(8,)`` (one job for every row) or ``(n, 8)``; the other
    arrays have shape ``(n,)`` and hold the option's slowest member's
    capabilities, accelerators taken in total, 1.0 for a one-node option, and
    the gang's shape: nodes, fewest and most accelerators on one node, and
    distinct localities. Shape arrays left None describe the shape Gavel's
    table implies: one node of all the accelerators when consolidated, else
    one accelerator on each of `accelerators` nodes, in one locality.
    """
    n = len(peak_tflops)
    out = np.empty((n, N_PREDICTOR_FEATURES), dtype=np.float64)
    out[:, :8] = job
    out[:, 8] = np.log2(1.0 + peak_tflops)
    out[:, 9] = memory_bandwidth_gbps / 1000.0
    out[:, 10] = accelerator_memory_gb
    out[:, 11] = interconnect_gbps / 100.0
    out[:, 12] = np.log2(np.maximum(accelerators, 1.0))
    out[:, 13] = consolidated
    acc = np.maximum(accelerators, 1.0)
    spread = consolidated < 0.5
    if nodes is None:
        nodes = np.where(spread, acc, 1.0)
    if per_node_min is None:
        per_node_min = np.where(spread, 1.0, acc)
    if per_node_max is None:
        per_node_max = per_node_min
    if localities is None:
        localities = np.ones(n)
    out[:, 14] = np.log2(np.maximum(nodes, 1.0))
    out[:, 15] = np.log2(np.maximum(per_node_min, 1.0))
    out[:, 16] = np.log2(np.maximum(per_node_max, 1.0))
    out[:, 17] = localities > 1.0
    return out.astype(np.float32)


def distinct_localities(
    locality: Sequence[str],
    nodes: NDArray[np.integer[Any]],
    entry_option: NDArray[np.integer[Any]],
    n_opt: int,
) -> NDArray[np.float64]:
    """Distinct localities among each option's nodes (1 for a one-node option).

    `locality` is indexed by `nodes` (one entry per option entry); strings are
    coded by one `np.unique`, so a batch may pass all its requests' localities
    joined: equal strings of two requests never meet inside one option.
    """
    if len(nodes) == 0:
        return np.ones(n_opt)
    codes = np.unique(np.asarray(locality, dtype=object), return_inverse=True)[1]
    code = codes.reshape(-1)[nodes].astype(np.int64)
    width = int(code.max()) + 1
    pairs = np.unique(entry_option * width + code)
    return np.bincount(pairs // width, minlength=n_opt).astype(np.float64)


def per_node_extremes(
    accelerators: NDArray[np.float64], starts: NDArray[np.int64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(fewest, most) accelerators any one entry of each option takes (exact in any grouping)."""
    if len(accelerators) == 0:
        return np.zeros(0), np.zeros(0)
    lo = np.minimum.reduceat(accelerators, starts).astype(np.float64)
    hi = np.maximum.reduceat(accelerators, starts).astype(np.float64)
    return lo, hi


def _request_features(request: MirrorRequest) -> NDArray[np.float32]:
    """Predictor rows for every option of one request."""
    state, options = request.state, request.options
    n_opt = options.n_options
    if n_opt == 0:
        return np.zeros((0, N_PREDICTOR_FEATURES), dtype=np.float32)
    hw = state.hardware
    cls = state.node_hardware[options.node_index]
    starts = options.node_offsets[:-1]

    numbers = [capability_numbers(h) for h in hw]  # (memory, TFLOP/s, bandwidth, link)

    def slowest(k: int) -> NDArray[np.float64]:
        values = np.asarray([n[k] for n in numbers], dtype=np.float64)
        return np.minimum.reduceat(values[cls], starts)

    take = options.accelerators.astype(np.float64)
    taken = np.bincount(options.entry_option, weights=take, minlength=n_opt).astype(np.float64)
    per_min, per_max = per_node_extremes(take, starts)
    return compute_predictor_features(
        job_columns(parse_job_type(request.workload.model_family)),
        slowest(1),
        slowest(2),
        slowest(0),
        slowest(3),
        taken,
        (options.nodes_per_option == 1).astype(np.float64),
        options.nodes_per_option.astype(np.float64),
        per_min,
        per_max,
        distinct_localities(state.locality, options.node_index, options.entry_option, n_opt),
    )


@dataclass(frozen=True, eq=False)
class BatchLayout:
    """A micro-batch's option CSR arrays joined into one, with batch-wide indices.

    Request ``r``'s nodes, node entries and options follow those of requests
    ``0..r-1``; every index here is batch-wide, so one numpy pass over the
    joined arrays does what one pass per request did.

    Attributes:
        n_options: int64, shape ``(n_requests,)``, options per request.
        node_base: int64, shape ``(n_requests,)``, first batch-wide node of each request.
        nodes: int64, shape ``(n_entries,)``, batch-wide node of every option entry.
        starts: int64, shape ``(n_options_total,)``, first entry of every option.
        entry_option: int64, shape ``(n_entries,)``, batch-wide option of every entry.
        request_of_entry: int64, shape ``(n_entries,)``.
        nodes_per_option: int64, shape ``(n_options_total,)``.
        accelerators: float64, shape ``(n_entries,)``, accelerators every entry takes.
    """

    n_options: NDArray[np.int64]
    node_base: NDArray[np.int64]
    nodes: NDArray[np.int64]
    starts: NDArray[np.int64]
    entry_option: NDArray[np.int64]
    request_of_entry: NDArray[np.int64]
    nodes_per_option: NDArray[np.int64]
    accelerators: NDArray[np.float64]

    @property
    def n_options_total(self) -> int:
        """Option rows of the whole batch."""
        return len(self.starts)

    @classmethod
    def of(cls, requests: Sequence[MirrorRequest]) -> BatchLayout:
        """The layout of `requests` (each option has at least one node, as validated)."""
        n_req = len(requests)
        n_nodes = np.fromiter((len(r.state.node_hardware) for r in requests), np.int64, n_req)
        n_entries = np.fromiter((len(r.options.node_index) for r in requests), np.int64, n_req)
        n_options = np.fromiter((r.options.n_options for r in requests), np.int64, n_req)
        node_base = np.cumsum(n_nodes) - n_nodes
        entry_base = np.cumsum(n_entries) - n_entries
        request_of_entry = np.repeat(np.arange(n_req, dtype=np.int64), n_entries)
        opts = [r.options for r in requests]
        nodes = np.concatenate([o.node_index for o in opts], dtype=np.int64)
        nodes += node_base[request_of_entry]
        starts = np.concatenate([o.node_offsets[:-1] for o in opts], dtype=np.int64)
        starts += np.repeat(entry_base, n_options)
        per_option = np.concatenate([o.nodes_per_option for o in opts], dtype=np.int64)
        return cls(
            n_options=n_options,
            node_base=node_base,
            nodes=nodes,
            starts=starts,
            entry_option=np.repeat(np.arange(len(per_option), dtype=np.int64), per_option),
            request_of_entry=request_of_entry,
            nodes_per_option=per_option,
            accelerators=np.concatenate([o.accelerators for o in opts], dtype=np.float64),
        )

    def per_option(self, values: NDArray[np.float64]) -> NDArray[np.float64]:
        """Sum of `values` (one per entry) over each option's entries, in entry order."""
        out: NDArray[np.float64] = np.bincount(
            self.entry_option, weights=values, minlength=self.n_options_total
        ).astype(np.float64)
        return out


@functools.lru_cache(maxsize=256)
def _job_row(model_family: str) -> tuple[float, ...]:
    """`job_columns` of a model family, memoised: a batch repeats a handful of families."""
    return tuple(float(x) for x in job_columns(parse_job_type(model_family)))


def batch_features(requests: Sequence[MirrorRequest]) -> NDArray[np.float32]:
    """`_request_features` of every request, stacked, in one numpy pass over the batch.

    Bit for bit the rows of the per-request form (tests/policies/
    test_batch_equivalence.py holds them equal): a minimum is exact whatever
    the grouping, accelerators taken are summed per option in entry order in
    both, and every other column is the same elementwise float64 operation
    followed by the same cast to float32 (`compute_predictor_features`).
    The definition hash covers the per-request form; this one is its
    vectorised twin, as `compute_features_batch` is the contract's.
    """
    if not requests:
        return np.zeros((0, N_PREDICTOR_FEATURES), dtype=np.float32)
    layout = BatchLayout.of(requests)
    hardware = [r.state.hardware for r in requests]
    n_hw = np.fromiter((len(h) for h in hardware), np.int64, len(hardware))
    caps = np.array(
        [capability_numbers(h) for classes in hardware for h in classes], dtype=np.float64
    ).reshape(-1, 4)[:, [1, 2, 0, 3]]  # (TFLOP/s, bandwidth, memory, link)
    hw_base = np.cumsum(n_hw) - n_hw
    node_cls = np.concatenate([r.state.node_hardware for r in requests], dtype=np.int64)
    cls = node_cls[layout.nodes] + hw_base[layout.request_of_entry]
    slowest = np.minimum.reduceat(caps[cls], layout.starts, axis=0) if len(cls) else caps[:0]
    jobs = np.array([_job_row(r.workload.model_family) for r in requests], dtype=np.float64)
    per_min, per_max = per_node_extremes(layout.accelerators, layout.starts)
    locality = [loc for r in requests for loc in r.state.locality]
    return compute_predictor_features(
        np.repeat(jobs, layout.n_options, axis=0),
        slowest[:, 0],
        slowest[:, 1],
        slowest[:, 2],
        slowest[:, 3],
        layout.per_option(layout.accelerators),
        (layout.nodes_per_option == 1).astype(np.float64),
        layout.nodes_per_option.astype(np.float64),
        per_min,
        per_max,
        distinct_localities(locality, layout.nodes, layout.entry_option, layout.n_options_total),
    )


class LastBatchRows:
    """The rows of the last micro-batch a feature function saw, handed out again.

    In one micro-batch several consumers ask for the same rows: the Gavel
    predictor, and the outcome features (for the planner and for the outcome
    predictor) that extend them. A scorer batch's requests are one tuple of
    frozen requests, so its identity is the key; the tuple is held, so its id
    cannot be reused while it is the key. Rows handed out twice are
    read-only. Other sequences (lists can change in place) are never kept.
    """

    def __init__(self) -> None:
        self._last: tuple[tuple[MirrorRequest, ...], NDArray[np.float32]] | None = None

    def rows(
        self,
        requests: Sequence[MirrorRequest],
        compute: Callable[[Sequence[MirrorRequest]], NDArray[np.float32]],
    ) -> NDArray[np.float32]:
        """`compute(requests)`, or the rows computed for this very tuple last time."""
        last = self._last
        if last is not None and last[0] is requests:
            return last[1]
        rows = compute(requests)
        if type(requests) is tuple:
            rows.flags.writeable = False
            self._last = (requests, rows)
        return rows

    def __reduce__(self) -> tuple[type[LastBatchRows], tuple[()]]:
        """A copy (e.g. pickled to a scorer process) starts empty, without the last batch."""
        return (LastBatchRows, ())


@dataclass(frozen=True)
class PredictorFeatureFunction:
    """The predictor's feature function with its identity (version + hash)."""

    version: str = PREDICTOR_FEATURE_VERSION
    names: tuple[str, ...] = PREDICTOR_FEATURE_NAMES
    _memo: LastBatchRows = field(
        default_factory=LastBatchRows, init=False, repr=False, compare=False
    )

    def __call__(self, requests: Sequence[MirrorRequest]) -> NDArray[np.float32]:
        """Rows for every option of every request, concatenated in batch order.

        Read-only when `requests` is a tuple (a scorer batch): see `LastBatchRows`.
        """
        return self._memo.rows(requests, batch_features)

    def for_workload(self, workload: Workload) -> NDArray[np.float64]:
        """The job columns of `workload` (for tests and the build script)."""
        return job_columns(parse_job_type(workload.model_family))

    @property
    def definition_hash(self) -> str:
        """sha256 over version, names, default batch sizes and the computation's source."""
        material = json.dumps(
            {
                "version": self.version,
                "names": list(self.names),
                "families": list(GAVEL_FAMILIES),
                "default_batch": dict(DEFAULT_BATCH_SIZE),
                "imputed": dict(IMPUTED_CAPABILITIES),
                "source": [
                    inspect.getsource(fn)
                    for fn in (
                        parse_job_type,
                        job_columns,
                        compute_predictor_features,
                        _request_features,
                        distinct_localities,
                        per_node_extremes,
                        capability_numbers,
                    )
                ],
            },
            sort_keys=True,
        )
        return hashlib.sha256(material.encode()).hexdigest()


PREDICTOR_FEATURES = PredictorFeatureFunction()
