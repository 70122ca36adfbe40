"""Does the simulator reproduce its data? Small, self-contained runs against the measurements.

- `isolated_run`: one job alone on one server (or a gang over several)
  completes, on average, in ``total_steps / expected throughput`` (Gavel's
  consolidated measurement; for a gang times `sharing.gang_factor` of the
  placement it took); returns the ratio of simulated to expected run time,
  with its Monte Carlo error over runs.
- `pair_run`: two share jobs on one GPU run at the co-located rates (Gavel's
  pair measurements, or the documented model where a pair is missing) while
  together and at their alone rates after; returns the simulated and the
  closed-form completion times.
- `heterogeneity`: throughput-aware vs least-loaded placement, on-policy,
  paired by episode: the difference in mean completion time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.environment.data import SCALE_FACTORS
from service.environment.episode import run_production
from service.environment.reference import LeastLoaded, ThroughputAware
from service.environment.scenario import NodeGroup, Scenario
from service.environment.sharing import gang_factor
from service.environment.sim import Randomness, Simulator
from service.environment.truth import Estimate, on_policy, paired_difference
from service.environment.world import EpisodeJobs, World


def _jobs(
    world: World,
    types: list[str],
    gpus: list[int],
    steps: list[float],
    share: list[float] | None = None,
) -> EpisodeJobs:
    """Jobs arriving at 0; `share` > 0 makes a share job (no memory need)."""
    t = np.array([world.table.type_index(x) for x in types], dtype=np.int64)
    g = np.asarray(gpus, dtype=np.int64)
    s = np.asarray(steps, dtype=np.float64)
    return EpisodeJobs(
        type_idx=t,
        gpus=g,
        steps=s,
        remaining0=s.copy(),
        arrival_s=np.zeros(len(t)),
        slo_s=world.slo(t, g, s),
        background=np.zeros(len(t), dtype=bool),
        trace_row=np.full(len(t), -1, dtype=np.int64),
        share=None if share is None else np.asarray(share, dtype=np.float64),
    )


def bench_world(
    base: Scenario, hardware: str, machine: str, count: int, sigma: float | None
) -> World:
    """A one-class cluster of `count` `machine`-shaped servers, for reproduction runs."""
    return World(
        base.replace(
            nodes=(NodeGroup(hardware, count, machine),),
            degrade={},
            background_fraction=0.0,
            draining=(),
            noise_sigma=sigma,
            surge=False,
        )
    )


@dataclass(frozen=True, slots=True)
class IsolatedRun:
    """Simulated / measured run time of one job alone, over `ratio.n` runs."""

    job_type: str
    gpus: int
    hardware: str
    consolidated: bool
    measured_steps_per_s: float
    ratio: Estimate


def isolated_run(world: World, job_type: str, gpus: int, n_runs: int, seed: int) -> IsolatedRun:
    """Run one job of (`job_type`, `gpus`) alone `n_runs` times on `world` (one class).

    It is consolidated when one server holds `gpus` (it may still be placed
    as a gang: then `consolidated` is False); the expected rate of a gang is
    recomputed from the GPUs it holds (servers, domains), not read back.
    """
    steps = 1000.0
    c = 0
    measured = world.table.rate(job_type, gpus, world.classes[c].name, True)
    t = world.table.type_index(job_type)
    ratios = np.empty(n_runs)
    consolidated = True
    for r in range(n_runs):
        jobs = _jobs(world, [job_type], [gpus], [steps])
        sim = Simulator(world, jobs, Randomness.draw((seed, r), 1, world.noise_sigma))
        run_production(sim)
        held = sim.state.gpus_of[0][sim.state.gpus_of[0] >= 0]
        nodes, per_node = np.unique(world.gpu_node[held], return_counts=True)
        expected = measured
        if len(nodes) > 1:
            consolidated = False
            span = len(set(world.node_locality[nodes].tolist()))
            sf = SCALE_FACTORS.index(gpus)
            expected *= gang_factor(world, t, sf, c, tuple(int(x) for x in per_node), span)
        ratios[r] = float(sim.state.finish[0]) / (steps / expected)
    return IsolatedRun(
        job_type, gpus, world.classes[c].name, consolidated, measured, Estimate.of(ratios)
    )


@dataclass(frozen=True, slots=True)
class PairRun:
    """Two single-GPU jobs sharing a GPU: simulated vs closed-form completion times (s)."""

    job_type: str
    other_type: str
    hardware: str
    simulated: tuple[float, float]
    expected: tuple[float, float]


def pair_run(world: World, job_type: str, other_type: str, steps: tuple[float, float]) -> PairRun:
    """`job_type` runs alone on each GPU of one server but one, which it shares with `other_type`.

    All are share jobs (share 0.5, no memory need). The server's GPUs are
    filled first with copies of `job_type` (the allocator takes a wholly
    free GPU first), so the last job must share; it shares with a copy of
    `job_type` (all copies are alike). Needs `world` with one server and
    noise 0. Returns the completions of the shared copy and of `other_type`,
    simulated and in closed form from ``world.pair_rate`` (measured, or the
    documented model where the table has no pair).
    """
    g = int(world.node_gpus[0])
    hw = world.classes[0].name
    types = [job_type] * g + [other_type]
    steps_all = [steps[0]] * g + [steps[1]]
    jobs = _jobs(world, types, [1] * (g + 1), steps_all, share=[0.5] * (g + 1))
    sim = Simulator(world, jobs, Randomness.draw((0,), g + 1, 0.0))
    run_production(sim)
    shared = int(sim.state.gpus_of[g, 0])
    host = next(j for j in range(g) if int(sim.state.gpus_of[j, 0]) == shared)
    t = world.table
    a, b = t.type_index(job_type), t.type_index(other_type)
    c = 0
    pa, pb = world.pair_rate[a, b, c], world.pair_rate[b, a, c]
    alone_a, alone_b = world.cons_rate[a, 0, c], world.cons_rate[b, 0, c]
    both = min(steps[0] / pa, steps[1] / pb)  # until the first of the two finishes
    end_a = both + (steps[0] - pa * both) / alone_a
    end_b = both + (steps[1] - pb * both) / alone_b
    return PairRun(
        job_type,
        other_type,
        hw,
        simulated=(float(sim.state.finish[host]), float(sim.state.finish[g])),
        expected=(float(end_a), float(end_b)),
    )


@dataclass(frozen=True, slots=True)
class Heterogeneity:
    """Least-loaded minus throughput-aware mean completion time (s), paired by episode."""

    scenario: str
    throughput_aware_s: Estimate
    least_loaded_s: Estimate
    difference_s: Estimate


def heterogeneity(world: World, n_episodes: int, seed: int) -> Heterogeneity:
    """On-policy mean completion time of both policies on the same episodes."""
    ta = on_policy(world, ThroughputAware(world.table), seed, n_episodes).mean_of(
        "completion_time_s"
    )
    ll = on_policy(world, LeastLoaded(), seed, n_episodes).mean_of("completion_time_s")
    return Heterogeneity(
        world.scenario.name, Estimate.of(ta), Estimate.of(ll), paired_difference(ll, ta)
    )


def measured_pairs(world: World) -> list[tuple[str, str]]:
    """Single-GPU (type, other type) pairs with a positive pair measurement on the world's class."""
    t = world.table
    c = t.class_index(world.classes[0].name)
    ok = (np.nan_to_num(t.pair[:, :, c]) > 0) & (np.nan_to_num(t.pair[:, :, c].T) > 0)
    return [(t.job_types[a], t.job_types[b]) for a, b in zip(*np.nonzero(ok), strict=True)]


def measured_configs(world: World) -> list[tuple[str, int]]:
    """(type, GPUs) with a positive measurement runnable on the world's cluster."""
    out = []
    c = world.table.class_index(world.classes[0].name)
    biggest = int(world.node_gpus.max())
    total = int(world.node_gpus.sum())
    for i, name in enumerate(world.table.job_types):
        for s, k in enumerate(SCALE_FACTORS):
            rate = world.table.isolated[i, s, c, 1]  # a gang scales the consolidated rate
            if (
                np.isfinite(rate)
                and rate > 0
                and k <= total
                and (k <= biggest or len(world.node_gpus) > 1)
            ):
                out.append((name, k))
    return out
