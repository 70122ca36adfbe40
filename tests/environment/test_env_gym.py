"""The Gymnasium environment: conformance, determinism, masks, costs apart from reward."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from service.contract import DEFAULT_FEATURES, DEFER, SIGNALS, check_feasibility, validate_request
from service.contract.feasibility import CAPACITY_GROUP
from service.environment import ENV_ID, ClusterEnv, log_episode, scenario_names


@pytest.mark.parametrize("name", scenario_names())
def test_check_env_passes_for_every_scenario(name: str) -> None:
    env = gym.make(ENV_ID, scenario=name)  # through the registry, so the spec checks run too
    check_env(env.unwrapped)
    env.close()


def _rollout(env: ClusterEnv, seed: int, steps: int) -> list[tuple[Any, ...]]:
    """Random feasible actions chosen by a seeded generator; everything returned, kept."""
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    out: list[tuple[Any, ...]] = [(obs, info)]
    for _ in range(steps):
        action = rng.choice(np.flatnonzero(info["action_mask"]))
        obs, reward, term, trunc, info = env.step(action)
        out.append((obs, reward, term, trunc, info))
        if term or trunc:
            break
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and bool(np.array_equal(a, b))
    return bool(a == b)


def test_same_seed_same_trajectory_different_seed_different() -> None:
    env = ClusterEnv("train")
    first = _rollout(env, seed=3, steps=40)
    again = _rollout(env, seed=3, steps=40)
    other = _rollout(env, seed=4, steps=40)
    assert _same(first, again)
    assert not _same(first, other)


def test_observation_is_the_contract_view_of_the_pending_request() -> None:
    env = ClusterEnv("fragmented")
    obs, info = env.reset(seed=0)
    for _ in range(15):
        request = env.mirror_request()
        assert request is not None
        validate_request(request)
        feas = check_feasibility(request.state, request.workload, request.options)
        n = request.options.n_options
        np.testing.assert_array_equal(obs["action_mask"][:n], feas.mask)
        assert obs["action_mask"][-1] == 1 and not obs["action_mask"][n:-1].any()
        np.testing.assert_allclose(
            obs["options"][:n], DEFAULT_FEATURES(request.state, request.workload, request.options)
        )
        np.testing.assert_array_equal(info["action_mask"], obs["action_mask"])
        obs, _, term, _, info = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
        if term:
            break


def test_infeasible_choice_costs_and_does_not_place() -> None:
    env = ClusterEnv("fragmented")  # a draining server: its options are masked
    _, info = env.reset(seed=1)
    for _ in range(200):
        masked = np.flatnonzero(info["action_mask"][:-1] == 0)
        request = env.mirror_request()
        assert request is not None
        real = masked[masked < request.options.n_options]
        if len(real):
            break
        _, _, _, _, info = env.step(int(np.flatnonzero(info["action_mask"])[0]))
    else:
        pytest.fail("no masked option met in 200 steps")
    a = int(real[0])
    feas = check_feasibility(request.state, request.workload, request.options)
    pending = env.simulator.pending
    running_before = int((env.simulator.state.status == 2).sum())
    _, _, _, _, info = env.step(a)
    np.testing.assert_array_equal(info["constraint_signals"], feas.violations[a])
    weights = env.world.scenario.cost.signal_weights
    fired = {s for s, hit in zip(SIGNALS, feas.violations[a], strict=True) if hit}
    group = weights.get("capacity", 0.0) if fired & set(CAPACITY_GROUP) else 0.0
    assert info["cost"] == pytest.approx(sum(weights.get(s.value, 0.0) for s in fired) + group)
    assert info["cost"] > 0
    assert pending is not None and env.simulator.state.status[pending] == 1  # still waiting
    assert int((env.simulator.state.status == 2).sum()) <= running_before
    assert not info["invalid_action"]


def test_padding_actions_are_flagged_not_placed() -> None:
    env = ClusterEnv("train")
    _, info = env.reset(seed=2)
    request = env.mirror_request()
    assert request is not None
    k = env.world.max_options
    if request.options.n_options == k:
        pytest.skip("no padding slot in this request")
    _, _, _, _, info = env.step(k - 1)
    assert info["invalid_action"] and info["cost"] == 0.0


def test_episode_reward_is_the_reward_of_every_job_once() -> None:
    env = ClusterEnv("train")
    _, info = env.reset(seed=5)
    total, outcomes, done = 0.0, [], False
    while not done:
        _, reward, done, trunc, info = env.step(int(np.flatnonzero(info["action_mask"])[0]))
        assert not trunc
        total += reward
        outcomes += info["outcomes"]
    jobs = env.simulator.jobs
    assert len(outcomes) == int((~jobs.background).sum())
    assert len({o.request_id for o in outcomes}) == len(outcomes)
    columns = {
        f: np.array([float(getattr(o, f)) for o in outcomes])
        for f in ("queue_delay_s", "throughput", "completion_time_s", "slo_met")
    }
    assert total == pytest.approx(float(env.world.scenario.reward.evaluate(columns).sum()))
    assert env.simulator.done


def test_step_before_reset_is_refused() -> None:
    with pytest.raises(RuntimeError, match="reset"):
        ClusterEnv("train").step(0)


def test_replaying_production_in_the_env_is_the_logged_run() -> None:
    """A driver stepping with `production_action` mirrors exactly what `log_episode` records."""
    env = ClusterEnv("train")
    env.reset(seed=9)
    log = log_episode(env.world, *env.episode_key)
    requests, outcomes, done = [], [], False
    while not done:
        request = env.mirror_request(with_production=True)
        assert request is not None and request.production is not None
        requests.append(request)
        _, _, done, _, info = env.step(env.production_action())
        outcomes += info["outcomes"]
    logged = [r for r in log.requests if r.production and r.production.option != DEFER]
    assert [r.production for r in requests] == [r.production for r in logged]
    assert [r.workload.workload_id.rsplit("-", 1)[1] for r in requests] == [
        r.workload.workload_id.rsplit("-", 1)[1] for r in logged
    ]
    by_job = {o.request_id.split("-j")[1].split("-")[0]: o.completion_time_s for o in outcomes}
    final = log.job_outcomes()
    for j, completion in zip(final.job, final.completion_time_s, strict=True):
        assert by_job[str(j)] == completion
