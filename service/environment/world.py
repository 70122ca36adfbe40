"""A scenario bound to the data: the static cluster, the rate tables, the job source.

`World` is built once per scenario and shared by every episode and fork: it
is immutable. `World.sample_episode` draws one episode's jobs (`EpisodeJobs`)
from the scenario's Philly-derived trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.contract import KNOWN_HARDWARE, HardwareClass, Workload, WorkloadKind
from service.environment.colocation import colocated_rates, median_colocation_ratio
from service.environment.data import (
    SCALE_FACTORS,
    ThroughputTable,
    Trace,
    load_throughputs,
    load_trace,
    machine_shape,
    philly_surge_factor,
)
from service.environment.partitions import MIG_PROFILES, partition_class, scale_from_v100
from service.environment.samples import family_memory_gb, family_model_size_b
from service.environment.scenario import NodeGroup, Scenario

MAX_GPUS_PER_JOB = max(SCALE_FACTORS)
LOCALITY_SERVERS = 2
"""Servers per interconnect domain (the contract's ``locality``): each node group's
servers are racked in consecutive pairs (an assumption: the data names no racks),
so a class with more than two servers offers gangs inside one domain and across two."""
GANGS_PER_CLASS = 1 + 2 * 3
"""Most gang options per class: the packed gang, plus an even spread over 2, 4 or 8
servers, each inside one domain and across domains (`sharing.gang_options`)."""
_Shares = (
    tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]] | tuple[None, None, None]
)
EPOCH_S = 1_504_483_200.0
"""Unix time of episode time 0 (2017-09-04, the start of the Philly trace), for `request_time`."""


@dataclass(frozen=True, eq=False)
class EpisodeJobs:
    """The jobs of one episode, in arrival order; arrays have shape ``(n_jobs,)``.

    Background jobs (the fragmented scenario's GPUs busy at time 0) come first,
    run from time 0 and are never decisions; the rest arrive as requests.

    Attributes:
        type_idx: index into `World.table.job_types`.
        gpus: GPUs requested.
        steps: total training steps (from the trace).
        remaining0: steps left at time 0 (< steps only for background jobs).
        arrival_s: arrival, seconds from episode start.
        slo_s: deadline from arrival, seconds.
        background: True for background jobs.
        trace_row: row of the job in the (filtered) trace, for provenance.
        share: share of one GPU a *share job* asks for, 0 for a whole-GPU job
            (the scenario's `SharingConfig`; default all 0).
        memory_gb: device memory a share job needs (0 for whole-GPU jobs).
        infer: True for a share job that is an inference server, False for a
            small fine-tune (meaningless for whole-GPU jobs).
    """

    type_idx: NDArray[np.int64]
    gpus: NDArray[np.int64]
    steps: NDArray[np.float64]
    remaining0: NDArray[np.float64]
    arrival_s: NDArray[np.float64]
    slo_s: NDArray[np.float64]
    background: NDArray[np.bool_]
    trace_row: NDArray[np.int64]
    share: NDArray[np.float64] | None = None
    memory_gb: NDArray[np.float64] | None = None
    infer: NDArray[np.bool_] | None = None

    def __post_init__(self) -> None:
        n = len(self.type_idx)
        if self.share is None:  # no share jobs: every job asks for whole GPUs
            object.__setattr__(self, "share", np.zeros(n))
        if self.memory_gb is None:
            object.__setattr__(self, "memory_gb", np.zeros(n))
        if self.infer is None:
            object.__setattr__(self, "infer", np.zeros(n, dtype=bool))

    @property
    def shares(self) -> NDArray[np.bool_]:
        """True for share jobs (a share of one GPU), shape ``(n_jobs,)``."""
        assert self.share is not None
        out: NDArray[np.bool_] = self.share > 0
        return out

    @property
    def n(self) -> int:
        """Jobs including background ones."""
        return len(self.type_idx)

    @property
    def n_background(self) -> int:
        """Background jobs (indices ``0 .. n_background - 1``)."""
        return int(self.background.sum())


class World:
    """Scenario + data: node layout, per-class rates (degradation applied), the usable trace.

    Attributes (arrays indexed by node ``(n_nodes,)``, GPU ``(n_gpus,)`` or class):
        classes: contract `HardwareClass` per class present, datasheet numbers
            (a degraded class keeps its datasheet: the slowdown is hidden).
        node_class, node_gpus, node_cpu, node_memory_gb, node_draining: per node.
        gpu_start: int64 ``(n_nodes + 1,)``: node i owns GPUs ``gpu_start[i]:gpu_start[i+1]``.
        cons_rate, spread_rate: ``(n_types, len(SCALE_FACTORS), n_classes)`` steps/s,
            NaN = not measured, 0 = cannot run; degradation applied. A class Gavel
            never measured gets V100's consolidated rate x `class_scale`
            (`partitions.scale_from_v100`, documented rule) instead of being refused.
        measured_cons: Gavel's consolidated rates only (NaN for other classes; SLOs).
        pair_rate: ``(n_types, n_types, n_classes)`` rate of the row type sharing a GPU
            with the column type: Gavel's pair where measured, else the documented
            model (`service.environment.colocation`); degradation applied.
        pair_measured: same shape, True where the pair was measured.
        gavel_spread_ratio: Gavel's unconsolidated / consolidated rate, NaN where
            not both measured (used by `sharing.gang_factor`).
        node_locality, node_locality_ids: interconnect domain per node (index,
            contract ``locality`` string; `LOCALITY_SERVERS` servers each).
        device_class, device_memory_gb: per device (GPU or partition slice).
        allowed: ``(n_types, len(SCALE_FACTORS), n_classes)`` bool, consolidated rate > 0.
        time_scale: multiplier on trace inter-arrival gaps (surge applied).
        noise_sigma: log-sd of a job's speed multiplier.
    """

    def __init__(
        self,
        scenario: Scenario,
        data_root: str | None = None,
        table: ThroughputTable | None = None,
    ) -> None:
        """Bind `scenario` to the data; `table` replaces Gavel's (tests knock pairs out)."""
        scenario.validate()
        self.scenario = scenario
        self.table: ThroughputTable = table or load_throughputs(data_root)
        self.trace_full: Trace = load_trace(scenario.trace_vc, data_root)
        names = tuple(dict.fromkeys(_class_name(g) for g in scenario.nodes))
        by_name = {_class_name(g): _class_of(g) for g in scenario.nodes}
        self.classes: tuple[HardwareClass, ...] = tuple(by_name[n] for n in names)
        node_class, node_gpus, cpu, mem, locality = [], [], [], [], []
        for gi, g in enumerate(scenario.nodes):
            shape = machine_shape(g.machine, data_root)
            per_gpu = MIG_PROFILES[(g.hardware, g.partition)].per_gpu if g.partition else 1
            for i in range(g.count):
                locality.append(f"{_class_name(g).lower()}-g{gi}-rack{i // LOCALITY_SERVERS}")
                node_class.append(names.index(_class_name(g)))
                node_gpus.append(shape.gpus * per_gpu)
                cpu.append(shape.cpu_cores)
                mem.append(shape.memory_gb)
        self.node_class = np.asarray(node_class, dtype=np.int64)
        self.node_gpus = np.asarray(node_gpus, dtype=np.int64)
        self.node_cpu = np.asarray(cpu, dtype=np.float64)
        self.node_memory_gb = np.asarray(mem, dtype=np.float64)
        self.node_locality_ids: tuple[str, ...] = tuple(locality)
        self.node_locality = np.unique(np.asarray(locality), return_inverse=True)[1].astype(
            np.int64
        )  # interconnect domain per node (`LOCALITY_SERVERS`)
        self.node_draining = np.zeros(len(node_class), dtype=bool)
        self.node_draining[list(scenario.draining)] = True
        self.gpu_start = np.concatenate([[0], np.cumsum(self.node_gpus)]).astype(np.int64)
        self.gpu_node = np.repeat(np.arange(len(node_class)), self.node_gpus)
        self.nodes_fitting = {
            k: np.flatnonzero(self.node_gpus >= k) for k in SCALE_FACTORS
        }  # servers that could ever hold k GPUs of one job
        self.class_nodes_up = [
            np.flatnonzero((self.node_class == c) & ~self.node_draining) for c in range(len(names))
        ]
        self.node_ids = tuple(
            f"{self.classes[c].name.lower()}-{i}" for i, c in enumerate(node_class)
        )
        self.device_ids = tuple(
            f"{self.node_ids[n]}/gpu{g - self.gpu_start[n]}" for g, n in enumerate(self.gpu_node)
        )

        measured = [n in self.table.classes for n in names]
        cols = self._class_cols = [
            self.table.class_index(n) if m else 0 for n, m in zip(names, measured, strict=True)
        ]
        unmeasured = ~np.asarray(measured, dtype=bool)  # not Gavel's: rates by `scale_from_v100`
        degrade = np.array([scenario.degrade.get(n, 1.0) for n in names])
        self.measured_cons = _nan_where(self.table.isolated[:, :, cols, 1], unmeasured)
        self.class_scale = np.array([scale_from_v100(c) for c in self.classes])
        derived = np.where(  # unmeasured classes: V100's rate x `scale_from_v100` (NaN: none)
            unmeasured, self.table.isolated[:, :, [self.table.class_index("V100")], 1], 1.0
        ) * np.where(unmeasured, self.class_scale, 1.0)
        alone = np.where(unmeasured, derived, self.measured_cons)
        self.cons_rate = alone * degrade
        self.spread_rate = _nan_where(self.table.isolated[:, :, cols, 0], unmeasured) * degrade
        with np.errstate(invalid="ignore", divide="ignore"):
            self.gavel_spread_ratio = self.spread_rate / self.cons_rate  # NaN: not both measured
        self._gang_factors: dict[tuple[int, int, int, tuple[int, ...], int], float] = {}
        self.colocation_ratio = median_colocation_ratio(
            self.table.pair, self.table.isolated[:, 0, :, 1]
        )
        pair, self.pair_measured = colocated_rates(
            _nan_where(self.table.pair[:, :, cols], unmeasured),
            alone[:, 0],
            self.colocation_ratio,
        )
        self.pair_rate = pair * degrade
        self.device_class = self.node_class[self.gpu_node]
        self.device_memory_gb = np.array(
            [np.nan if c.accelerator_memory_gb is None else c.accelerator_memory_gb
             for c in self.classes]
        )[self.device_class]  # fmt: skip
        self.allowed = np.nan_to_num(self.cons_rate) > 0
        surge = philly_surge_factor(root=data_root) if scenario.surge else 1.0
        self.surge_factor = surge
        self.time_scale = scenario.arrival_time_scale / surge
        self.noise_sigma = (
            self.table.noise_sigma() if scenario.noise_sigma is None else scenario.noise_sigma
        )
        self._usable = self._placeable_rows()
        self.dropped_unplaceable = int((~self._usable).sum())
        self._rows = np.flatnonzero(self._usable)
        if len(self._rows) < scenario.jobs_per_episode:
            raise ValueError(
                f"trace {scenario.trace_vc} has {len(self._rows)} placeable jobs, "
                f"fewer than jobs_per_episode={scenario.jobs_per_episode}"
            )

    @property
    def n_nodes(self) -> int:
        """Servers."""
        return len(self.node_class)

    @property
    def n_classes(self) -> int:
        """Hardware classes present."""
        return len(self.classes)

    @property
    def max_options(self) -> int:
        """Most options a request can have: one per node plus `GANGS_PER_CLASS` per class."""
        return self.n_nodes + GANGS_PER_CLASS * self.n_classes

    def _placeable_rows(self) -> NDArray[np.bool_]:
        """Trace rows some option of this cluster could ever run (empty cluster, no drain)."""
        t = self.trace_full
        types = np.array([self.table.type_index(x) for x in t.job_type], dtype=np.int64)
        sf = np.searchsorted(SCALE_FACTORS, t.gpus)
        up = ~self.node_draining
        ok = np.zeros(len(types), dtype=bool)
        for c in range(self.n_classes):
            on_c = up & (self.node_class == c)
            biggest = int(self.node_gpus[on_c].max()) if on_c.any() else 0
            cons_ok = (np.nan_to_num(self.cons_rate[types, sf, c]) > 0) & (t.gpus <= biggest)
            spread_ok = (  # a gang runs at the consolidated rate x its shape factor
                (np.nan_to_num(self.cons_rate[types, sf, c]) > 0)
                & (t.gpus <= int(self.node_gpus[on_c].sum()))
                & (on_c.sum() >= 2)
                & (t.gpus >= 2)
            )
            ok |= cons_ok | spread_ok
        return ok

    def sample_episode(self, rng: np.random.Generator) -> EpisodeJobs:
        """A window of consecutive placeable trace jobs, gaps scaled, plus background jobs."""
        n = self.scenario.jobs_per_episode
        t = self.trace_full
        start = int(rng.integers(0, len(self._rows) - n + 1))
        rows = self._rows[start : start + n]
        arrival = (t.arrival_s[rows] - t.arrival_s[rows[0]]) * self.time_scale
        types = np.array([self.table.type_index(t.job_type[r]) for r in rows], dtype=np.int64)
        gpus = t.gpus[rows].astype(np.int64)
        steps = t.total_steps[rows].astype(np.float64)

        n_bg = self._background_count()
        singles = self._rows[t.gpus[self._rows] == 1]
        bg_rows = rng.choice(singles, size=n_bg) if n_bg else np.zeros(0, dtype=np.int64)
        bg_types = np.array([self.table.type_index(t.job_type[r]) for r in bg_rows], dtype=np.int64)
        bg_steps = t.total_steps[bg_rows].astype(np.float64)
        bg_left = bg_steps * rng.uniform(0.0, 1.0, size=n_bg)

        all_types = np.concatenate([bg_types, types])
        all_gpus = np.concatenate([np.ones(n_bg, dtype=np.int64), gpus])
        all_steps = np.concatenate([bg_steps, steps])
        share, memory, infer = self._draw_shares(rng, all_types, all_gpus)
        return EpisodeJobs(
            type_idx=all_types,
            gpus=all_gpus,
            steps=all_steps,
            remaining0=np.concatenate([bg_left, steps]),
            arrival_s=np.concatenate([np.zeros(n_bg), arrival]),
            slo_s=self.slo(all_types, all_gpus, all_steps),
            background=np.concatenate([np.ones(n_bg, dtype=bool), np.zeros(n, dtype=bool)]),
            trace_row=np.concatenate([bg_rows, rows]).astype(np.int64),
            share=share,
            memory_gb=memory,
            infer=infer,
        )

    def _draw_shares(
        self,
        rng: np.random.Generator,
        types: NDArray[np.int64],
        gpus: NDArray[np.int64],
    ) -> _Shares:
        """The sharing rule (`SharingConfig`): which single-GPU jobs ask for a share.

        Drawn after every other draw of the episode and only when sharing is
        on, so scenarios without sharing get exactly the episodes they had.
        Background jobs (single-GPU) follow the same rule.
        """
        cfg = self.scenario.sharing
        if cfg.fraction <= 0:
            return None, None, None
        n = len(types)
        pick = (rng.random(n) < cfg.fraction) & (gpus == 1)
        lo, hi = cfg.share
        share = np.where(pick, np.round(rng.uniform(lo, hi, n), 2), 0.0)
        share = np.where(pick, np.clip(share, np.nextafter(1 / 3, 1), 0.5), 0.0)
        infer = pick & (rng.random(n) < cfg.infer_fraction)
        family = [family_memory_gb(self.table.job_types[int(t)]) for t in types]
        memory = np.where(pick & cfg.memory, np.asarray(family, dtype=np.float64), 0.0)
        return share, memory, infer

    def _background_count(self) -> int:
        return int(sum(self.background_per_node()))

    def background_per_node(self) -> list[int]:
        """GPUs per node held by background jobs at time 0 (none on draining nodes)."""
        f = self.scenario.background_fraction
        return [
            0 if self.node_draining[i] else round(f * int(g)) for i, g in enumerate(self.node_gpus)
        ]

    def slo(
        self, types: NDArray[np.int64], gpus: NDArray[np.int64], steps: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """SLO = slo_factor x steps / fastest *measured* consolidated rate among present classes.

        Measured, not degraded: deadlines are set from the datasheet-era
        measurements, unaware of a hidden slowdown.
        """
        sf = np.searchsorted(SCALE_FACTORS, gpus)
        best = np.nan_to_num(self.measured_cons[types, sf]).max(axis=1)
        spread = np.nan_to_num(self.table.isolated[types, sf][:, self._class_cols, 0]).max(axis=1)
        best = np.where(best > 0, best, spread)  # only a spread rate measured: use it
        with np.errstate(divide="ignore"):  # nothing measured at all: no deadline (inf)
            out: NDArray[np.float64] = self.scenario.slo_factor * steps / best
        return out

    def workload(self, jobs: EpisodeJobs, j: int, workload_id: str, gang_size: int = 1) -> Workload:
        """The contract `Workload` of job `j`.

        ``model_family`` is the Gavel job type (model and batch size);
        ``model_size_b`` is the family's documented size
        (`service.environment.samples.family_model_size_b`). The trace has no
        host CPU, host memory, priority or tenant beyond the VC, so those are
        0 / the VC rather than made up. `gang_size` is the caller's: the most
        servers any option of the request spans (the contract's rule).
        """
        k = int(jobs.gpus[j])
        sf = SCALE_FACTORS.index(k)
        allowed = frozenset(
            self.classes[c].name
            for c in range(self.n_classes)
            if self.allowed[jobs.type_idx[j], sf, c]
        )
        assert jobs.share is not None and jobs.memory_gb is not None and jobs.infer is not None
        share = float(jobs.share[j])
        kind: str = WorkloadKind.TRAIN
        if share > 0 and self.scenario.sharing.kind:
            kind = self.scenario.sharing.kind
        elif share > 0:
            kind = WorkloadKind.INFER if jobs.infer[j] else WorkloadKind.FINETUNE
        return Workload(
            workload_id=workload_id,
            kind=kind,
            model_family=self.table.job_types[int(jobs.type_idx[j])],
            model_size_b=family_model_size_b(self.table.job_types[int(jobs.type_idx[j])]),
            accelerators=0 if share > 0 else k,
            accelerator_memory_gb=float(jobs.memory_gb[j]),
            accelerator_share=share if share > 0 else None,
            cpu_per_node=0.0,
            memory_per_node_gb=0.0,
            gang_size=gang_size,
            priority=0,
            tenant=self.scenario.trace_vc,
            slo_seconds=float(jobs.slo_s[j]) if np.isfinite(jobs.slo_s[j]) else None,
            work_units=float(jobs.steps[j]),
            allowed_hardware=allowed,
        )


def _class_name(group: NodeGroup) -> str:
    """The class of a group's devices: the hardware, or its partition class."""
    return f"{group.hardware}-{group.partition}" if group.partition else group.hardware


def _class_of(group: NodeGroup) -> HardwareClass:
    if group.partition:
        return partition_class(group.hardware, group.partition)
    return KNOWN_HARDWARE[group.hardware]


def _nan_where(values: NDArray[np.float64], unmeasured: NDArray[np.bool_]) -> NDArray[np.float64]:
    """A copy of `values` (classes on the last axis) with the unmeasured classes' columns NaN."""
    out = np.array(values, dtype=np.float64)
    out[..., unmeasured] = np.nan
    return out
