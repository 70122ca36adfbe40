"""The simulator reproduces its data, and its contract view is the contract's."""

from __future__ import annotations

import numpy as np
import pytest

from service.contract import (
    DEFER,
    ConstraintSignal,
    Outcome,
    check_feasibility,
    validate_outcome,
    validate_request,
)
from service.environment import (
    NodeGroup,
    Randomness,
    Scenario,
    Simulator,
    ThroughputTable,
    World,
    contract_request,
    job_outcomes,
    log_episode,
    run_production,
)
from service.environment.data import SCALE_FACTORS
from service.environment.reproduction import (
    _jobs,
    bench_world,
    isolated_run,
    measured_configs,
    measured_pairs,
    pair_run,
)
from service.environment.sim import DONE, RUNNING

BENCHES = [("K80", "MISC", 1), ("P100", "P100", 3), ("V100", "V100", 1)]


@pytest.mark.parametrize(("hardware", "machine", "count"), BENCHES)
def test_alone_without_noise_every_measured_config_takes_steps_over_throughput(
    scenarios: dict[str, Scenario], hardware: str, machine: str, count: int
) -> None:
    world = bench_world(scenarios["train"], hardware, machine, count, sigma=0.0)
    configs = measured_configs(world)
    assert configs
    for job_type, gpus in configs:
        run = isolated_run(world, job_type, gpus, n_runs=1, seed=0)
        assert run.ratio.value == pytest.approx(1.0, rel=1e-12), (job_type, gpus)


@pytest.mark.parametrize(("hardware", "machine", "count"), BENCHES)
def test_alone_with_noise_the_mean_run_time_matches_within_monte_carlo_error(
    scenarios: dict[str, Scenario], hardware: str, machine: str, count: int
) -> None:
    world = bench_world(scenarios["train"], hardware, machine, count, sigma=None)
    assert world.noise_sigma > 0
    configs = measured_configs(world)
    rng = np.random.default_rng(7)
    for i in rng.choice(len(configs), size=4, replace=False):
        job_type, gpus = configs[int(i)]
        run = isolated_run(world, job_type, gpus, n_runs=600, seed=100 + int(i))
        assert abs(run.ratio.value - 1.0) < 4 * run.ratio.se, run
        assert run.ratio.se < 0.01


def test_gang_jobs_run_at_the_consolidated_measurement_times_their_gang_factor(
    scenarios: dict[str, Scenario], table: ThroughputTable
) -> None:
    world = bench_world(scenarios["train"], "P100", "P100", 3, sigma=0.0)  # 2-GPU servers
    spread = [(t, k) for t, k in measured_configs(world) if k > 2]
    assert spread
    for job_type, gpus in spread:
        run = isolated_run(world, job_type, gpus, n_runs=1, seed=0)
        assert not run.consolidated
        assert run.measured_steps_per_s == table.rate(job_type, gpus, "P100", consolidated=True)
        assert run.ratio.value == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("hardware", ["K80", "P100", "V100"])
def test_a_shared_gpu_runs_at_the_pair_measurements(
    scenarios: dict[str, Scenario], hardware: str
) -> None:
    world = bench_world(scenarios["train"], hardware, "P100", 1, sigma=0.0)  # one 2-GPU server
    pairs = measured_pairs(world)
    rng = np.random.default_rng(len(hardware))
    for i in rng.choice(len(pairs), size=40, replace=False):
        run = pair_run(world, *pairs[int(i)], (5000.0, 3000.0))
        np.testing.assert_allclose(run.simulated, run.expected, rtol=1e-9)


def test_a_pair_measured_unable_to_share_never_shares(
    scenarios: dict[str, Scenario], table: ThroughputTable
) -> None:
    c = table.class_index("K80")
    zero = np.argwhere(table.pair[:, :, c] == 0.0)
    assert len(zero), "the data has pairs measured as unable to share"
    a, b = (table.job_types[int(x)] for x in zero[0])
    world = bench_world(scenarios["train"], "K80", "P100", 1, sigma=0.0)  # one 2-GPU server
    # a whole-GPU job holds GPU 0 for long; share job `a` takes GPU 1; share job `b`
    # may not join `a` (pair 0.0), so it waits for `a` and then runs alone
    jobs = _jobs(world, [a, a, b], [1, 1, 1], [1e6, 1000.0, 10.0], share=[0.0, 0.5, 0.5])
    sim = Simulator(world, jobs, Randomness.draw((0,), 3, 0.0))
    run_production(sim)
    assert sim.state.start[2] == pytest.approx(sim.state.finish[1])
    assert sim.state.finish[2] - sim.state.start[2] == pytest.approx(10.0 / table.rate(b, 1, "K80"))


def test_a_class_measured_unable_to_run_is_a_compatibility_signal(
    worlds: dict[str, World], table: ThroughputTable
) -> None:
    world = worlds["train"]
    c = table.class_index("K80")
    bad = [
        (t, k)
        for ti, t in enumerate(table.job_types)
        for si, k in enumerate(SCALE_FACTORS)
        if table.isolated[ti, si, c, 1] == 0.0
    ]
    assert bad, "the data marks some configurations as unable to run on K80"
    job_type, gpus = bad[0]
    jobs = _jobs(world, [job_type], [gpus], [100.0])
    sim = Simulator(world, jobs, Randomness.draw((0,), 1, 0.0))
    j = sim.next_decision()
    assert j == 0
    request = contract_request(sim, j, "t")
    feas = check_feasibility(request.state, request.workload, request.options)
    on_k80 = [i for i in range(request.options.n_options) if sim.options(j).cls[i] == 0]
    assert on_k80 and all(ConstraintSignal.HARDWARE_COMPATIBILITY in feas.failed(i) for i in on_k80)


def test_degraded_class_runs_at_the_stated_factor(scenarios: dict[str, Scenario]) -> None:
    s = scenarios["degraded"]
    ((cls, factor),) = s.degrade.items()
    world = World(s.replace(nodes=(NodeGroup(cls, 1, "V100"),), noise_sigma=0.0))
    run = isolated_run(world, world.table.job_types[0], 1, n_runs=1, seed=0)
    assert run.ratio.value == pytest.approx(1.0 / factor)


def test_background_jobs_fill_the_stated_fraction(worlds: dict[str, World]) -> None:
    world = worlds["fragmented"]
    sim = Simulator(
        world, world.sample_episode(np.random.default_rng(0)), Randomness.draw((0,), 1000, 0.0)
    )
    f = world.scenario.background_fraction
    expected = np.where(world.node_draining, 0, np.round(f * world.node_gpus))
    np.testing.assert_array_equal(world.node_gpus - sim.idle_per_node(), expected)


@pytest.mark.parametrize("mirror_before", [False, True])
def test_recorded_runs_speak_the_contract(worlds: dict[str, World], mirror_before: bool) -> None:
    """Every scenario: masks equal the contract's (log_episode raises otherwise), requests and
    outcomes validate, one outcome per request, production's decision on exactly one of them."""
    for world in worlds.values():
        small = World(world.scenario.replace(jobs_per_episode=20))
        log = log_episode(small, seed=1, episode=0, mirror_before=mirror_before)
        ids = [r.request_id for r in log.requests]
        assert len(set(ids)) == len(ids)
        assert {o.request_id for o in log.outcomes} == set(ids)
        for r in log.requests:
            validate_request(r)
            assert (r.production is None) == mirror_before
        for o in log.outcomes:
            validate_outcome(o)
            assert (o.production is not None) == mirror_before
        times = [e.observed_at if isinstance(e, Outcome) else e.request_time for e in log.events()]
        assert times == sorted(times)
        forced = [r for r in log.requests if r.production and r.production.option == DEFER]
        assert all(r.production.propensity == 1.0 for r in forced if r.production)
        assert len(log.decisions) == int((~log.final.jobs.background).sum())  # one per job


def test_forking_in_the_logged_world_replays_the_log(small_world: World) -> None:
    log = log_episode(small_world, seed=3, episode=0)
    done = log.job_outcomes()
    for d in log.decisions:
        fork = d.fork.fork()
        fork.apply(d.job, d.chosen)
        run_production(fork, until_done=d.job)
        o = job_outcomes(fork, np.array([d.job]))
        i = int(np.flatnonzero(done.job == d.job)[0])
        assert o.completion_time_s[0] == done.completion_time_s[i]
        assert o.queue_delay_s[0] == done.queue_delay_s[i]


def test_a_gang_spreads_over_servers_when_no_server_holds_it(
    scenarios: dict[str, Scenario],
) -> None:
    world = bench_world(scenarios["train"], "P100", "P100", 3, sigma=0.0)
    jobs = _jobs(world, ["ResNet-18 (batch size 64)"], [4], [100.0])
    sim = Simulator(world, jobs, Randomness.draw((0,), 1, 0.0))
    j = sim.next_decision()
    assert j == 0
    opts = sim.options(j)
    # two gangs of 2+2: inside one interconnect domain (servers 0, 1) and across two
    assert opts.n == 2 and opts.spread.all() and (np.diff(opts.offsets) == 2).all()
    assert int(opts.take.sum()) == 8
    assert opts.localities is not None and opts.factor is not None
    assert sorted(opts.localities.tolist()) == [1, 2]
    inside, across = np.argsort(opts.localities)
    assert 0 < opts.factor[across] < opts.factor[inside] < 1  # crossing a domain costs more
    sim.apply(j, 0)
    assert sim.state.status[j] == RUNNING and sim.state.spread[j]
    run_production(sim)
    assert sim.state.status[j] == DONE
