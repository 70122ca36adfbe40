"""Whatever an agent does — defer, pick masked options, pick padding — the books stay balanced."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from service.environment import ClusterEnv, Simulator, scenario_names
from service.environment.sim import DONE, RUNNING

ENVS = {name: ClusterEnv(name, max_decisions=400) for name in scenario_names()}


def _check(sim: Simulator) -> None:
    s, w, jobs = sim.state, sim.world, sim.jobs
    empty = s.occ[:, 0] < 0
    np.testing.assert_array_equal(s.idle, np.add.reduceat(empty.astype(np.int64), w.gpu_start[:-1]))
    assert not (empty & (s.occ[:, 1] >= 0)).any()  # a second tenant only beside a first
    for g in np.flatnonzero(s.occ[:, 1] >= 0):
        a, b = int(s.occ[g, 0]), int(s.occ[g, 1])
        assert jobs.gpus[a] == jobs.gpus[b] == 1
        assert jobs.shares[a] and jobs.shares[b]  # only share jobs co-locate
        assert s.partner[a] == b and s.partner[b] == a
    assert jobs.share is not None and jobs.memory_gb is not None
    for g in range(len(s.occ)):  # a device's books: its tenants' shares and memory
        tenants = [int(t) for t in s.occ[g] if t >= 0]
        whole = [t for t in tenants if not jobs.shares[t]]
        share = 1.0 if whole else sum(float(jobs.share[t]) for t in tenants)
        memory = 0.0 if whole else sum(float(jobs.memory_gb[t]) for t in tenants)
        assert s.used_share[g] == np.float64(share) or abs(s.used_share[g] - share) < 1e-12
        if not whole:
            assert abs(s.used_memory_gb[g] - memory) < 1e-9
        assert s.used_share[g] <= 1.0 + 1e-12
    assert (sim.device_free_memory_gb()[np.isfinite(w.device_memory_gb)] >= -1e-9).all()
    for j in np.flatnonzero(s.status == RUNNING):
        gpus = s.gpus_of[j][s.gpus_of[j] >= 0]
        assert len(gpus) == jobs.gpus[j]
        assert all(j in s.occ[g] for g in gpus)
        assert s.rate[j] > 0 and s.remaining[j] >= 0
    held = s.occ[s.occ >= 0]
    assert set(held.tolist()) <= set(np.flatnonzero(s.status == RUNNING).tolist())


@settings(max_examples=30, deadline=None, database=None)
@given(
    name=st.sampled_from(scenario_names()),
    seed=st.integers(0, 2**16),
    p_defer=st.floats(0.0, 0.5),
    p_wild=st.floats(0.0, 0.3),
)
def test_random_agents_keep_the_simulator_consistent(
    name: str, seed: int, p_defer: float, p_wild: float
) -> None:
    env = ENVS[name]
    rng = np.random.default_rng(seed)
    _, info = env.reset(seed=seed)
    last_time, terminated, truncated = 0.0, False, False
    while not (terminated or truncated):
        u = rng.random()
        if u < p_defer:
            action = env.world.max_options
        elif u < p_defer + p_wild:
            action = int(rng.integers(env.world.max_options + 1))  # masked or padding slots too
        else:
            action = int(rng.choice(np.flatnonzero(info["action_mask"])))
        _, reward, terminated, truncated, info = env.step(action)
        assert reward >= 0.0 and info["cost"] >= 0.0
        assert info["time_s"] >= last_time
        last_time = info["time_s"]
        _check(env.simulator)
    if terminated:
        assert (env.simulator.state.status == DONE).all()
        assert (env.simulator.state.occ < 0).all()
