"""Episodes: seeding, the contract view of a decision, outcomes, and the two drivers.

- `new_episode`: episode ``i`` of seed ``s`` — its jobs and its worlds of
  randomness — is a pure function of ``(s, i)``; world 0 is the one the
  logged trajectory lives in, worlds 1.. are Monte Carlo replicates.
- `contract_request`: the `MirrorRequest` Runtime would mirror for the
  pending decision (state snapshot, workload, options, production's decision).
- `run_production`: the logging policy drives the episode through the fast
  path (no contract objects unless recording).
- `run_policy`: any `Policy` drives the episode through the contract path
  (snapshot -> features -> feasibility -> ``decide``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from service.contract import (
    DEFAULT_FEATURES,
    DEFER,
    SCHEMA_VERSION,
    ClusterState,
    FailureKind,
    MirrorRequest,
    Outcome,
    PlacementOptions,
    ProductionDecision,
    check_feasibility,
)
from service.environment.emulator import emulator_distribution, packing_scores
from service.environment.policy_kit import Distribution, sample
from service.environment.samples import host_free
from service.environment.sim import DONE, UNIFORMS_PER_JOB, Options, Randomness, Simulator
from service.environment.world import EPOCH_S, World
from service.policies.base import Policy, ScoringBatch

_T = TypeVar("_T", bound=np.generic)

OUTCOME_FIELDS: tuple[str, ...] = ("queue_delay_s", "throughput", "completion_time_s", "slo_met")
"""Outcome columns per decided job, the contract's reward fields."""


def _column(values: object, dtype: type[_T]) -> NDArray[_T]:
    """A read-only 1-D copy, as the contract's frozen dataclasses expect."""
    out: NDArray[_T] = np.array(values, dtype=dtype).reshape(-1)
    out.flags.writeable = False
    return out


def episode_seed(seed: int, episode: int) -> tuple[int, int]:
    """The key of episode `episode` under base seed `seed`."""
    return (int(seed), int(episode))


def new_episode(world: World, seed: int, episode: int, world_index: int = 0) -> Simulator:
    """A fresh simulator for episode `episode` of `seed`, in world `world_index`."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(episode), 0]))
    jobs = world.sample_episode(rng)
    return Simulator(world, jobs, episode_world(world, jobs.n, seed, episode, world_index))


def episode_world(world: World, n_jobs: int, seed: int, episode: int, index: int) -> Randomness:
    """World `index` of an episode: the speeds and uniforms shared by all its forks."""
    return Randomness.draw((int(seed), int(episode), 1, int(index)), n_jobs, world.noise_sigma)


def request_id(sim: Simulator, prefix: str, j: int) -> str:
    """Id of job `j`'s current request: one per decision, retries get new ids."""
    return f"{prefix}-j{j}-r{int(sim.state.requests[j])}"


def contract_request(
    sim: Simulator, j: int, prefix: str, production: ProductionDecision | None = None
) -> MirrorRequest:
    """The `MirrorRequest` (schema version 2) for pending job `j`.

    Devices (GPUs, or partition slices) in CSR form per server, each with
    its class, the share of it *this* request could take
    (`Simulator.device_free_share`: ``1 - used``, 0 where a share job may not
    join the tenant) and its free memory. Node counts agree with them:
    ``accelerators_total`` = devices, ``accelerators_free`` = wholly free
    devices. A share job's options each name the device the server's
    allocator would use. ``utilisation`` is busy devices / devices. Host CPU
    and memory free fall with the device share the server's jobs hold
    (`service.environment.samples.host_free`, an assumption); they never bind,
    as jobs ask for none. queue_length is 0 (the queue is global, not per
    server). ``locality`` names each server's interconnect domain
    (`world.LOCALITY_SERVERS` servers each); ``workload.gang_size`` is the most
    servers any option spans (the contract's rule); a gang's option id lists
    its servers and GPUs.
    """
    w, opts = sim.world, sim.options(j)
    n = w.n_nodes
    total = w.node_gpus
    used = np.bincount(w.gpu_node, weights=sim.state.used_share, minlength=n)
    state = ClusterState(
        node_ids=w.node_ids,
        hardware=w.classes,
        node_hardware=_column(w.node_class, np.int32),
        accelerators_free=_column(opts.free, np.int32),
        accelerators_total=_column(total, np.int32),
        cpu_free=_column(host_free(w.node_cpu, total, used), np.float32),
        cpu_total=_column(w.node_cpu, np.float32),
        memory_free_gb=_column(host_free(w.node_memory_gb, total, used), np.float32),
        memory_total_gb=_column(w.node_memory_gb, np.float32),
        utilisation=_column(sim.busy_per_node() / total, np.float32),
        queue_length=_column(np.zeros(n), np.int32),
        healthy=_column(np.ones(n), np.bool_),
        draining=_column(w.node_draining, np.bool_),
        zone=("zone-a",) * n,
        locality=w.node_locality_ids,  # interconnect domains (`world.LOCALITY_SERVERS`)
        labels=tuple(frozenset({f"class={w.classes[c].name}"}) for c in w.node_class),
        device_offsets=_column(w.gpu_start, np.int64),
        device_hardware=_column(w.device_class, np.int32),
        device_free_share=_column(opts.device_free_share, np.float32),
        device_free_memory_gb=_column(sim.device_free_memory_gb(), np.float32),
        device_ids=w.device_ids,
    )
    named = opts.device >= 0
    options = PlacementOptions(
        node_offsets=opts.offsets.copy(),
        node_index=opts.node.copy(),
        accelerators=opts.take.copy(),
        option_ids=tuple(_option_id(sim, opts, i) for i in range(opts.n)),
        # a share job's entries name their device (none where the server has none that
        # fits); whole-GPU options name no device (empty columns)
        device_offsets=_column(
            np.concatenate([[0], np.cumsum(named)]) if len(opts.device) else [], np.int64
        ),
        device_index=_column(opts.device[named], np.int32),
    )
    return MirrorRequest(
        schema_version=SCHEMA_VERSION,
        request_id=request_id(sim, prefix, j),
        request_time=EPOCH_S + sim.state.time,
        state=state,
        workload=w.workload(sim.jobs, j, f"{prefix}-j{j}", gang_size=_gang_size(opts)),
        options=options,
        production=production,
    )


def _option_id(sim: Simulator, opts: Options, i: int) -> str:
    """A server's id, or ``gang-<server>x<GPUs>+...`` for a gang (unique per request)."""
    w, lo, hi = sim.world, int(opts.offsets[i]), int(opts.offsets[i + 1])
    if not opts.spread[i]:
        return w.node_ids[int(opts.node[lo])]
    parts = (f"{w.node_ids[int(opts.node[e])]}x{int(opts.take[e])}" for e in range(lo, hi))
    return "gang-" + "+".join(parts)


def _gang_size(opts: Options) -> int:
    """The most servers any option of the request spans (the contract's `gang_size`)."""
    return int(np.diff(opts.offsets).max()) if opts.n else 1


@dataclass(frozen=True, eq=False)
class JobOutcomes:
    """Outcome columns of an episode's decided (non-background) jobs, shape ``(n_jobs,)``."""

    job: NDArray[np.int64]
    queue_delay_s: NDArray[np.float64]
    throughput: NDArray[np.float64]
    completion_time_s: NDArray[np.float64]
    slo_met: NDArray[np.float64]

    def columns(self) -> dict[str, NDArray[np.float64]]:
        """Field name -> column, as `RewardSpec.evaluate` takes them."""
        return {f: getattr(self, f) for f in OUTCOME_FIELDS}


def job_outcomes(sim: Simulator, jobs: NDArray[np.int64] | None = None) -> JobOutcomes:
    """Outcomes of `jobs` (default: every non-background job); NaN where not finished."""
    s, e = sim.state, sim.jobs
    idx = np.flatnonzero(~e.background) if jobs is None else np.asarray(jobs, dtype=np.int64)
    done = s.status[idx] == DONE
    arrival = e.arrival_s[idx]
    completion = np.where(done, s.finish[idx] - arrival, np.nan)
    run = s.finish[idx] - s.start[idx]
    with np.errstate(divide="ignore", invalid="ignore"):
        throughput = np.where(done & (run > 0), e.steps[idx] / run, np.nan)
    return JobOutcomes(
        job=idx,
        queue_delay_s=np.where(np.isfinite(s.start[idx]), s.start[idx] - arrival, np.nan),
        throughput=throughput,
        completion_time_s=completion,
        slo_met=np.where(done, (completion <= e.slo_s[idx]).astype(np.float64), np.nan),
    )


def outcome_for(sim: Simulator, j: int, rid: str, production: ProductionDecision | None) -> Outcome:
    """The delayed `Outcome` Runtime reports for request `rid` of finished job `j`."""
    o = job_outcomes(sim, np.array([j]))
    return Outcome(
        request_id=rid,
        observed_at=EPOCH_S + float(sim.state.finish[j]),
        queue_delay_s=float(o.queue_delay_s[0]),
        throughput=float(o.throughput[0]),
        completion_time_s=float(o.completion_time_s[0]),
        slo_met=bool(o.slo_met[0]),
        failure=FailureKind.NONE,
        production=production,
    )


def production_distribution(sim: Simulator, j: int) -> Distribution:
    """The emulator's distribution for pending job `j`, computed on simulator arrays."""
    o = sim.options(j)
    config = sim.world.scenario.production
    w = sim.world
    idle = sim.idle_per_node().astype(np.float64)
    shares = None
    if len(o.device):  # a share job: does the named device already hold a job?
        named = o.device >= 0
        shares = named & (o.device_free_share[np.where(named, o.device, 0)] < 1.0)
    total = w.node_gpus.astype(np.float64)
    scores = packing_scores(o.offsets, o.node, o.take, idle, total, config, shares)
    return emulator_distribution(scores, o.mask, config)


def production_uniform(sim: Simulator, j: int) -> float:
    """The keyed uniform of job `j`'s current attempt in the simulator's world."""
    return float(sim.randomness.uniform[j, int(sim.state.attempts[j]) % UNIFORMS_PER_JOB])


def run_production(
    sim: Simulator,
    until_done: int | None = None,
    on_decision: Callable[[Simulator, int, Distribution, int], None] | None = None,
    on_forced: Callable[[int], None] | None = None,
) -> None:
    """Let the emulator decide every request until the end (or until `until_done` finishes).

    `on_decision` sees (simulator before the action, job, distribution, choice);
    `on_forced` sees each request that had no feasible option.
    """
    while (j := sim.next_decision(until_done, on_forced)) is not None:
        dist = production_distribution(sim, j)
        choice = sample(dist, production_uniform(sim, j))
        if on_decision is not None:
            on_decision(sim, j, dist, choice)
        sim.apply(j, choice)


@dataclass(frozen=True, slots=True)
class PolicyRunStats:
    """What a policy did in one episode besides its outcomes."""

    decisions: int
    voluntary_defers: int
    infeasible_choices: int
    truncated: bool


def run_policy(
    sim: Simulator, policy: Policy, key: tuple[int, ...], max_decisions: int | None = None
) -> PolicyRunStats:
    """Let `policy` decide every request through the contract path.

    Its rng is keyed by (key, job, attempt), so two policies (or two runs) in
    the same world see the same randomness where they face the same decision.
    """
    limit = max_decisions if max_decisions is not None else 50 * sim.jobs.n
    decisions = defers = bad = 0
    while (j := sim.next_decision()) is not None:
        if decisions >= limit:
            return PolicyRunStats(decisions, defers, bad, truncated=True)
        request = contract_request(sim, j, "run")
        feas = check_feasibility(request.state, request.workload, request.options)
        batch = ScoringBatch(
            features=DEFAULT_FEATURES(request.state, request.workload, request.options),
            offsets=np.array([0, request.options.n_options], dtype=np.int64),
            mask=feas.mask,
            requests=(request,),
        )
        rng = np.random.default_rng([*key, j, int(sim.state.attempts[j])])
        choice = int(policy.decide(batch, rng).chosen[0])
        decisions += 1
        defers += choice == DEFER
        bad += choice != DEFER and not bool(feas.mask[choice])
        sim.apply(j, choice)
    return PolicyRunStats(decisions, defers, bad, truncated=False)
