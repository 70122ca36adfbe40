"""The discrete-event core: jobs arrive, are placed or wait, run at measured rates, finish.

Time advances from event to event (an arrival or a completion). At each event
every waiting job is offered again, in arrival order; a request with no
feasible option is deferred without asking anyone (a *forced* defer). The
caller decides the rest through `Simulator.next_decision` / `Simulator.apply`.

Rates (steps/s) of a running job ``j`` on class ``c``, times its speed
multiplier ``s_j`` (drawn when it starts) and the class's degradation:

- alone on one server: Gavel's consolidated measurement for (type, GPUs, c);
- a gang over servers: the consolidated measurement x the placement's
  `sharing.gang_factor` (Pollux's measured shape ratios, a documented model
  where unmeasured, a cross-locality penalty, and Gavel's unconsolidated
  figure where it shows a larger loss). Gangs of several shapes (packed,
  spread evenly over 2 / 4 / 8 servers, inside one interconnect domain or
  across domains) are offered next to the single servers (`sharing.gang_options`);
- sharing one GPU with job ``i`` (share jobs only: a share of one GPU, see
  `SharingConfig`): Gavel's pair measurement of ``j`` next to ``i``, or the
  documented model where the pair is missing (`colocation`); when ``i``
  leaves, ``j`` returns to its alone rate. Pairs measured as 0 never share.
  Whole-GPU jobs take wholly free GPUs only (contract v2: a whole-device
  request gets whole devices).

Randomness is keyed, not sequential, so forks share it (common random
numbers): a world ``w`` fixes each job's speed and each (job, attempt)'s
uniform used by the production emulator. `Simulator.fork` copies the state and
may switch to another world for everything not yet started.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from service.contract import DEFER
from service.environment import sharing
from service.environment.data import SCALE_FACTORS
from service.environment.sim_state import (
    DONE,
    RUNNING,
    UNIFORMS_PER_JOB,
    WAITING,
    Options,
    Randomness,
    SimState,
)
from service.environment.world import MAX_GPUS_PER_JOB, EpisodeJobs, World

__all__ = [
    "DONE",
    "RUNNING",
    "UNIFORMS_PER_JOB",
    "WAITING",
    "Options",
    "Randomness",
    "SimState",
    "Simulator",
]


class Simulator:
    """One episode of a `World`: state, event loop, options, placement."""

    def __init__(self, world: World, jobs: EpisodeJobs, randomness: Randomness) -> None:
        self.world = world
        self.jobs = jobs
        self.randomness = randomness
        n, g = jobs.n, int(world.gpu_start[-1])
        self.state = SimState(
            time=0.0,
            status=np.zeros(n, dtype=np.int8),
            remaining=jobs.remaining0.copy(),
            rate=np.zeros(n),
            speed=np.ones(n),
            start=np.full(n, np.nan),
            finish=np.full(n, np.nan),
            cls_of=np.full(n, -1, dtype=np.int64),
            spread=np.zeros(n, dtype=bool),
            shape_factor=np.ones(n),
            partner=np.full(n, -1, dtype=np.int64),
            gpus_of=np.full((n, MAX_GPUS_PER_JOB), -1, dtype=np.int64),
            occ=np.full((g, 2), -1, dtype=np.int64),
            attempts=np.zeros(n, dtype=np.int64),
            requests=np.zeros(n, dtype=np.int64),
            idle=world.node_gpus.copy(),
            used_share=np.zeros(g),
            used_memory_gb=np.zeros(g),
            infeasible_at=np.full(n, -1, dtype=np.int64),
            next_arrival=jobs.n_background,
            completions=0,
            queue=[],
        )
        self._sf = np.searchsorted(SCALE_FACTORS, jobs.gpus)
        assert jobs.share is not None and jobs.memory_gb is not None
        self._share, self._memory = jobs.share, jobs.memory_gb
        self._current: tuple[int, Options] | None = None
        self._place_background()

    # ---------------------------------------------------------------- forks
    def fork(self, randomness: Randomness | None = None) -> Simulator:
        """A copy at the same instant; with `randomness`, jobs not yet started use that world."""
        other = object.__new__(Simulator)
        other.world, other.jobs, other._sf = self.world, self.jobs, self._sf
        other._share, other._memory = self._share, self._memory
        other.randomness = randomness or self.randomness
        other.state = self.state.copy()
        other._current = self._current
        return other

    # ---------------------------------------------------------------- rates
    def _alone_rate(self, j: int, c: int, spread: bool) -> float:
        """Consolidated rate x the job's placement factor (1 on one server) x its speed."""
        rate = float(self.world.cons_rate[self.jobs.type_idx[j], self._sf[j], c])
        return rate * float(self.state.shape_factor[j]) * float(self.state.speed[j])

    def _pair_rate(self, j: int, other: int, c: int) -> float:
        t = self.jobs.type_idx
        return float(self.world.pair_rate[t[j], t[other], c]) * float(self.state.speed[j])

    # ---------------------------------------------------------------- placement
    def _place_background(self) -> None:
        s, w = self.state, self.world
        j = 0
        for node, count in enumerate(w.background_per_node()):
            gpus = range(int(w.gpu_start[node]), int(w.gpu_start[node]) + count)
            for g in gpus:
                s.speed[j] = self.randomness.speed[j]
                self._start(j, [g], int(w.node_class[node]), spread=False)
                j += 1

    def _start(self, j: int, gpus: list[int], c: int, spread: bool, factor: float = 1.0) -> None:
        s = self.state
        s.status[j], s.start[j], s.cls_of[j], s.spread[j] = RUNNING, s.time, c, spread
        s.shape_factor[j] = factor
        s.gpus_of[j, : len(gpus)] = gpus
        s.rate[j] = self._alone_rate(j, c, spread)
        share = float(self._share[j])
        for g in gpus:
            if share > 0:
                s.used_share[g] += share
                s.used_memory_gb[g] += float(self._memory[j])
            else:
                s.used_share[g] = 1.0
            if s.occ[g, 0] < 0:
                s.occ[g, 0] = j
                s.idle[self.world.gpu_node[g]] -= 1
            else:
                other = int(s.occ[g, 0])
                s.occ[g, 1] = j
                s.partner[j], s.partner[other] = other, j
                s.rate[j] = self._pair_rate(j, other, c)
                s.rate[other] = self._pair_rate(other, j, c)

    def _finish(self, j: int) -> None:
        s = self.state
        s.status[j], s.finish[j], s.remaining[j], s.rate[j] = DONE, s.time, 0.0, 0.0
        s.completions += 1
        for g in s.gpus_of[j][s.gpus_of[j] >= 0]:
            if s.occ[g, 0] == j:
                s.occ[g, 0], s.occ[g, 1] = s.occ[g, 1], -1
                if s.occ[g, 0] < 0:
                    s.idle[self.world.gpu_node[g]] += 1
            elif s.occ[g, 1] == j:
                s.occ[g, 1] = -1
            if s.occ[g, 0] < 0:  # empty: exactly free again (no float residue)
                s.used_share[g] = s.used_memory_gb[g] = 0.0
            else:
                s.used_share[g] -= float(self._share[j])
                s.used_memory_gb[g] -= float(self._memory[j])
        other = int(s.partner[j])
        if other >= 0:
            s.partner[j] = s.partner[other] = -1
            s.rate[other] = self._alone_rate(other, int(s.cls_of[other]), bool(s.spread[other]))

    def idle_per_node(self) -> NDArray[np.int64]:
        """GPUs with no job, per node, shape ``(n_nodes,)`` (a copy)."""
        return self.state.idle.copy()

    def busy_per_node(self) -> NDArray[np.int64]:
        """GPUs with at least one job, per node."""
        out: NDArray[np.int64] = self.world.node_gpus - self.state.idle
        return out

    def device_free_share(self, j: int) -> NDArray[np.float64]:
        """Per device, the share of it request `j` could take (`sharing.device_free_share`)."""
        return sharing.device_free_share(self.world, self.jobs, self.state, j)

    def device_free_memory_gb(self) -> NDArray[np.float64]:
        """Per device, free memory (`sharing.device_free_memory_gb`)."""
        return sharing.device_free_memory_gb(self.world, self.state)

    def options(self, j: int) -> Options:
        """Options for job `j` now: one per server big enough, plus gangs of several shapes."""
        if self._current is not None and self._current[0] == j:
            return self._current[1]
        if self._share[j] > 0:
            opts = sharing.share_options(self.world, self.jobs, self.state, j, self._pair_rate)
            self._current = (j, opts)
            return opts
        w, k = self.world, int(self.jobs.gpus[j])
        idle = self.state.idle
        free = idle.copy()
        nodes = w.nodes_fitting[k]
        allowed = w.allowed[self.jobs.type_idx[j], self._sf[j]]
        found = (
            [g for c in range(w.n_classes) for g in self._gang_options(j, c, k)] if k >= 2 else []
        )
        factor = np.ones(len(nodes) + len(found))
        localities = np.ones(len(nodes) + len(found), dtype=np.int64)
        if not found:  # the common case: one entry per option
            node = nodes.astype(np.int32)
            take = np.full(len(nodes), k, dtype=np.int32)
            cls = w.node_class[nodes]
            mask = (take <= free[nodes]) & ~w.node_draining[nodes] & allowed[cls]
            offsets = np.arange(len(nodes) + 1, dtype=np.int64)
            spread = np.zeros(len(nodes), dtype=bool)
        else:
            node_l = [int(n) for n in nodes] + [n for _, g in found for n, _ in g]
            take_l = [k] * len(nodes) + [t for _, g in found for _, t in g]
            counts = [1] * len(nodes) + [len(g) for _, g in found]
            t_j, sf_j = int(self.jobs.type_idx[j]), int(self._sf[j])
            for i, (c, g) in enumerate(found):
                span = len({int(w.node_locality[n]) for n, _ in g})
                localities[len(nodes) + i] = span
                per_node = tuple(t for _, t in g)
                factor[len(nodes) + i] = sharing.gang_factor(w, t_j, sf_j, c, per_node, span)
            offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            node = np.asarray(node_l, dtype=np.int32)
            take = np.asarray(take_l, dtype=np.int32)
            cls = np.concatenate([w.node_class[nodes], [c for c, _ in found]]).astype(np.int64)
            entry_bad = (take > free[node]) | w.node_draining[node]
            bad = np.add.reduceat(entry_bad.astype(np.int64), offsets[:-1])
            mask = (bad == 0) & allowed[cls]
            spread = np.concatenate([np.zeros(len(nodes), bool), np.ones(len(found), bool)])
        no_device = np.zeros(0, dtype=np.int64)
        opts = Options(
            offsets,
            node,
            take,
            cls,
            spread,
            free,
            mask,
            no_device,
            self.device_free_share(j),
            factor,
            localities,
        )
        self._current = (j, opts)
        return opts

    def _gang_options(self, j: int, c: int, k: int) -> list[sharing.Gang]:
        return sharing.gang_options(self.world, self.state, self.jobs, self._sf, j, c, k)

    def apply(self, j: int, option: int) -> bool:
        """Place job `j` (the head of the queue) on `option`, or defer it (`DEFER`).

        Returns True when placed. An infeasible option is not placed (the job
        waits, as for a defer); the caller records its constraint signals.
        """
        s = self.state
        if not s.queue or s.queue[0] != j:
            raise RuntimeError(f"job {j} is not the pending decision")
        opts = self.options(j)
        s.queue.pop(0)
        s.requests[j] += 1
        s.attempts[j] += 1
        self._current = None
        if option == DEFER or not 0 <= option < opts.n or not opts.mask[option]:
            return False
        s.speed[j] = self.randomness.speed[j]
        lo, hi = int(opts.offsets[option]), int(opts.offsets[option + 1])
        c, spread = int(opts.cls[option]), bool(opts.spread[option])
        assert opts.factor is not None
        if self._share[j] > 0:  # the device the option names (the allocator's pick)
            self._start(j, [int(opts.device[lo])], c, spread)
            return True
        gpus: list[int] = []
        for e in range(lo, hi):
            n, t = int(opts.node[e]), int(opts.take[e])
            span = np.arange(int(self.world.gpu_start[n]), int(self.world.gpu_start[n + 1]))
            idle = span[s.occ[span, 0] < 0]
            gpus += [int(g) for g in idle[:t]]
        self._start(j, gpus, c, spread, float(opts.factor[option]))
        return True

    # ---------------------------------------------------------------- events
    def _advance(self) -> bool:
        """Process the next event; False when none is left."""
        s, jobs = self.state, self.jobs
        run = np.flatnonzero(s.status == RUNNING)
        t_fin, first = math.inf, -1
        if len(run):
            ttf = s.remaining[run] / s.rate[run]
            i = int(np.argmin(ttf))
            t_fin, first = s.time + float(ttf[i]), int(run[i])
        t_arr = float(jobs.arrival_s[s.next_arrival]) if s.next_arrival < jobs.n else math.inf
        if math.isinf(t_fin) and math.isinf(t_arr):
            return False
        t_next = min(t_fin, t_arr)
        if len(run):
            s.remaining[run] = np.maximum(s.remaining[run] - s.rate[run] * (t_next - s.time), 0.0)
        s.time = t_next
        if t_fin <= t_arr:
            self._finish(first)
        else:
            s.status[s.next_arrival] = WAITING
            s.next_arrival += 1
        s.queue = [int(x) for x in np.flatnonzero(s.status == WAITING)]
        self._current = None
        return True

    def next_decision(
        self, until_done: int | None = None, on_forced: Callable[[int], None] | None = None
    ) -> int | None:
        """Advance to the next request with a feasible option and return its job.

        Requests with none are deferred on the spot (counted in `requests`;
        `on_forced` sees each one first). Returns None when the episode is
        over, or once job `until_done` has finished (a fork rolls forward only
        as far as its reward needs).
        """
        s = self.state
        stalled = False
        while True:
            if until_done is not None and s.status[until_done] == DONE:
                return None
            while s.queue:
                j = s.queue[0]
                # Placements only take capacity away: a request found infeasible
                # stays so until the next completion; it is not enumerated again.
                if s.infeasible_at[j] != s.completions:
                    if self.options(j).mask.any():
                        return j
                    s.infeasible_at[j] = s.completions
                if on_forced is not None:
                    on_forced(j)
                s.queue.pop(0)
                s.requests[j] += 1
                self._current = None
            if self._advance():
                stalled = False
                continue
            waiting = [int(x) for x in np.flatnonzero(s.status == WAITING)]
            if not waiting:
                return None
            if stalled:
                raise RuntimeError(f"jobs {waiting} can never be placed: nothing runs or arrives")
            s.queue, stalled = waiting, True

    def settled_finish(self, j: int) -> float | None:
        """Job `j`'s finish time if nothing can change its rate any more, else None.

        A running job's rate changes only when a job shares its GPU or leaves
        it, which needs a share job; a whole-GPU job's finish is
        ``now + remaining / rate`` and a fork need not roll further.
        """
        s = self.state
        if s.status[j] == DONE:
            return float(s.finish[j])
        if s.status[j] != RUNNING or self._share[j] > 0:
            return None
        return float(s.time + s.remaining[j] / s.rate[j])

    @property
    def pending(self) -> int | None:
        """The job at the head of the queue (its request is the current decision)."""
        return self.state.queue[0] if self.state.queue else None

    @property
    def done(self) -> bool:
        """Whether every job has finished."""
        return bool((self.state.status == DONE).all())
