"""Share jobs: the sharing rule, co-located rates from Gavel's pairs (or the documented model),
and the v2 requests the simulator sends for them.
"""

from __future__ import annotations

import csv
import dataclasses
import statistics

import numpy as np
import pytest

from service.contract import SCHEMA_VERSION, check_feasibility
from service.environment import (
    Scenario,
    ThroughputAware,
    ThroughputTable,
    World,
    build_pool,
    data_dir,
    log_episode,
    new_episode,
    on_policy,
)
from service.environment.reproduction import _jobs, bench_world, measured_pairs, pair_run
from service.environment.scenario import SharingConfig
from service.environment.sim import Randomness, Simulator


def _pair_rows() -> list[dict[str, str]]:
    path = data_dir() / "gavel-throughputs" / "colocated_pair_throughputs.csv"
    with path.open() as f:
        return [r for r in csv.DictReader(f) if r["scale_factor"] == r["other_scale_factor"] == "1"]


def _alone_rows() -> dict[tuple[str, str], float]:
    path = data_dir() / "gavel-throughputs" / "isolated_throughputs.csv"
    with path.open() as f:
        return {
            (r["job_type"], r["worker_type"]): float(r["throughput_simulation_steps_per_s"])
            for r in csv.DictReader(f)
            if r["scale_factor"] == "1" and r["consolidated"] == "1"
        }


@pytest.mark.parametrize("hardware", ["K80", "P100", "V100"])
def test_co_located_rates_are_the_measured_pair_values(
    scenarios: dict[str, Scenario], hardware: str
) -> None:
    """While two share jobs share a GPU each runs at the CSV's pair value, read here directly."""
    world = bench_world(scenarios["train"], hardware, "P100", 1, sigma=0.0)
    worker = hardware.lower()
    csv_rate = {
        (r["job_type"], r["other_job_type"]): float(r["throughput_self_steps_per_s"])
        for r in _pair_rows()
        if r["worker_type"] == worker
    }
    pairs = measured_pairs(world)
    rng = np.random.default_rng(7)
    for i in rng.choice(len(pairs), size=30, replace=False):
        a, b = pairs[int(i)]
        sim = _two_sharing(world, a, b)
        assert sim.state.rate[0] == csv_rate[(a, b)]
        assert sim.state.rate[2] == csv_rate[(b, a)]
        run = pair_run(world, a, b, (5000.0, 3000.0))
        np.testing.assert_allclose(run.simulated, run.expected, rtol=1e-9)


def _two_sharing(world: World, a: str, b: str) -> Simulator:
    """Share jobs `a` and `b` on one GPU of `world` (one 2-GPU server), right after both start.

    A whole-GPU job takes the other GPU in between, so `b` must join `a`.
    """
    jobs = _jobs(world, [a, a, b], [1, 1, 1], [1e6, 1e9, 1e6], share=[0.5, 0.0, 0.5])
    sim = Simulator(world, jobs, Randomness.draw((0,), 3, 0.0))
    for _ in range(3):
        j = sim.next_decision()
        assert j is not None
        assert sim.apply(j, int(np.flatnonzero(sim.options(j).mask)[0]))
    assert sim.state.gpus_of[0, 0] == sim.state.gpus_of[2, 0] != sim.state.gpus_of[1, 0]
    return sim


def test_a_missing_pair_follows_the_documented_model(
    scenarios: dict[str, Scenario], table: ThroughputTable
) -> None:
    """Knock a pair out of the table: the simulator runs it at alone x the type's median
    co-location ratio (computed here from the CSVs), never at the isolated rate."""
    a, b = "ResNet-18 (batch size 32)", "LM (batch size 20)"
    ia, ib, c = table.type_index(a), table.type_index(b), table.class_index("V100")
    pair = table.pair.copy()
    pair[ia, ib, c] = np.nan
    knocked = dataclasses.replace(table, pair=pair)
    base = bench_world(scenarios["train"], "V100", "P100", 1, sigma=0.0)  # one 2-GPU server
    world = World(base.scenario, table=knocked)
    assert not world.pair_measured[ia, ib, 0] and world.pair_measured[ib, ia, 0]

    alone = _alone_rows()
    ratios = [
        float(r["throughput_self_steps_per_s"]) / alone[(a, r["worker_type"])]
        for r in _pair_rows()
        if r["job_type"] == a
        and float(r["throughput_self_steps_per_s"]) > 0
        and not (r["other_job_type"] == b and r["worker_type"] == "v100")
    ]
    expected = alone[(a, "v100")] * statistics.median(ratios)
    sim = _two_sharing(world, a, b)
    assert sim.state.rate[0] == pytest.approx(expected, rel=1e-12)
    assert sim.state.rate[0] != alone[(a, "v100")]
    assert sim.state.rate[2] == float(table.pair[ib, ia, c])  # the other way is measured


def test_scenarios_without_sharing_draw_the_same_episodes(scenarios: dict[str, Scenario]) -> None:
    """The share draws come after every other draw: `shared` = `train` without sharing + shares."""
    train = World(scenarios["train"].replace(sharing=SharingConfig()))
    shared = World(scenarios["shared"])
    for e in range(5):
        a, b = new_episode(train, 0, e).jobs, new_episode(shared, 0, e).jobs
        for f in ("type_idx", "gpus", "steps", "arrival_s", "trace_row"):
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
        assert not a.shares.any()
        assert b.shares.any() and (b.gpus[b.shares] == 1).all()
        assert ((b.share[b.shares] > 1 / 3) & (b.share[b.shares] <= 0.5)).all()


def test_shared_requests_are_v2_with_devices(worlds: dict[str, World]) -> None:
    log = log_episode(worlds["shared"], 0, 0)  # raises if a mask disagrees with the contract
    jobs = {r.workload.workload_id: r.workload.is_share for r in log.requests}
    assert sum(jobs.values()) > 0.4 * len(jobs)  # sharing is common here
    partly = 0
    for r in log.requests:
        s, o, w = r.state, r.options, r.workload
        assert r.schema_version == SCHEMA_VERSION == 2 and s.has_devices
        per_node = np.diff(s.device_offsets)
        np.testing.assert_array_equal(s.accelerators_total, per_node)
        whole = np.add.reduceat((s.device_free_share >= 1).astype(np.int64), s.device_offsets[:-1])
        np.testing.assert_array_equal(s.accelerators_free, whole)
        partly += int(((s.device_free_share > 0) & (s.device_free_share < 1)).sum())
        if w.is_share:
            assert w.accelerators == 0 and 1 / 3 < (w.accelerator_share or 0) <= 0.5
            assert w.kind in ("infer", "finetune") and o.names_devices
            assert (np.diff(o.node_offsets) == 1).all() and (o.accelerators == 0).all()
            for e in range(len(o.node_index)):
                for d in o.device_index[o.device_offsets[e] : o.device_offsets[e + 1]]:
                    node = int(o.node_index[e])
                    assert s.device_offsets[node] <= d < s.device_offsets[node + 1]
            feas = check_feasibility(s, w, o)
            assert feas.mask.any() or r.production is None or r.production.option == -1
        else:
            assert not o.names_devices and w.accelerators >= 1
    assert partly > 0


def test_ground_truth_covers_shared_devices(scenarios: dict[str, Scenario]) -> None:
    """Per-decision counterfactual truth on the shared scenario: share decisions are in it."""
    world = World(scenarios["shared"].replace(jobs_per_episode=16))
    pool = build_pool(world, seed=3, n_episodes=2, n_worlds=2)
    shares = np.array([r.workload.is_share for r in pool.logged().requests])
    assert shares.any()
    q, _ = pool.q(world.scenario.reward)
    assert np.isfinite(q[pool.mask]).all()
    target = ThroughputAware(world.table)
    assert 0 <= pool.truth(target).value.value <= 1  # per-decision counterfactual truth
    assert 0 <= on_policy(world, target, 3, 2).value.value <= 1  # on-policy truth


def test_packing_off_means_share_jobs_never_co_locate(scenarios: dict[str, Scenario]) -> None:
    world = World(scenarios["shared"].replace(packing=False, sharing=SharingConfig(fraction=1.0)))
    sim = new_episode(world, 0, 0)
    while (j := sim.next_decision()) is not None:
        assert (sim.state.occ[:, 1] < 0).all()
        sim.apply(j, int(np.flatnonzero(sim.options(j).mask)[0]))


def test_every_single_gpu_job_sharing_without_memory_is_the_former_packing(
    scenarios: dict[str, Scenario],
) -> None:
    """``fraction = 1, memory = false``: a single-GPU job's option on a server is feasible iff
    the server (up, allowed class) has an idle GPU or one held by exactly one single-GPU job
    with a positive pair both ways: the packing rule the simulator had before contract v2."""
    assert scenarios["train"].sharing == SharingConfig(fraction=1.0, memory=False, kind="train")
    world = World(scenarios["train"].replace(background_fraction=0.5))
    sim = new_episode(world, 5, 0)
    jobs, checked = sim.jobs, 0
    while (j := sim.next_decision()) is not None:
        o, s = sim.options(j), sim.state
        if jobs.gpus[j] == 1:
            for i in range(o.n):
                n = int(o.node[i])
                c = int(world.node_class[n])
                ok = False
                for g in range(int(world.gpu_start[n]), int(world.gpu_start[n + 1])):
                    t0, t1 = int(s.occ[g, 0]), int(s.occ[g, 1])
                    ok |= t0 < 0 or (
                        t1 < 0
                        and jobs.gpus[t0] == 1
                        and world.pair_rate[jobs.type_idx[j], jobs.type_idx[t0], c] > 0
                        and world.pair_rate[jobs.type_idx[t0], jobs.type_idx[j], c] > 0
                    )
                ok &= not world.node_draining[n] and bool(world.allowed[jobs.type_idx[j], 0, c])
                assert bool(o.mask[i]) == ok
                checked += 1
        sim.apply(j, int(np.flatnonzero(o.mask)[0]))
    assert checked > 100
