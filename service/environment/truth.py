"""The two ground truths, each with its Monte Carlo error.

**Per-decision counterfactual value** (what off-policy estimators estimate).
At a logged decision ``t`` (job ``j_t``, simulator state ``S_t``), for each
action ``a`` (feasible options and `DEFER`) and each Monte Carlo world
``m = 1..M``: fork ``S_t``, switch everything not yet started to world ``m``,
apply ``a``, and let *production* make every later decision until ``j_t``
finishes. The outcome of ``j_t`` is ``Y[t, a, m]``; the same world ``m`` is
used for every ``a`` (common random numbers), so differences between actions
are not drowned by noise. Then

    q(t, a)  = mean_m  reward(Y[t, a, m])
    V_pd(pi) = 1/n sum_t sum_a pi(a | x_t) q(t, a)

with Monte Carlo standard error from the spread over ``m`` of
``sum_a pi(a|x_t) reward(Y[t, a, m])``.

**On-policy deployment value** (what a rollout would get): ``pi`` schedules
every request of the same episodes (same jobs, world 0, keyed randomness);
``V_on(pi)`` = mean reward over the episodes' jobs, error across episodes.

**Gap** ``V_on - V_pd``, paired by episode. Everything later decisions do in
response to ``pi`` (queues it builds, GPUs it fills, co-tenants it slows) is
in ``V_on`` and not in ``V_pd``: it is the interference an off-policy
estimator of ``V_pd`` cannot see. For ``pi`` = production the gap is 0 in
expectation, which the tests check.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.contract import DEFER, RewardSpec
from service.environment.episode import (
    OUTCOME_FIELDS,
    JobOutcomes,
    episode_world,
    job_outcomes,
    new_episode,
    production_distribution,
    production_uniform,
    run_policy,
    run_production,
)
from service.environment.policy_kit import sample
from service.environment.recording import LoggedDecision
from service.environment.sim import Randomness, Simulator
from service.environment.world import World
from service.policies.base import Policy


@dataclass(frozen=True, slots=True)
class Estimate:
    """A Monte Carlo mean with its standard error over `n` independent units."""

    value: float
    se: float
    n: int

    @staticmethod
    def of(samples: NDArray[np.float64]) -> Estimate:
        """Mean and standard error of i.i.d. `samples` (shape ``(n,)``)."""
        x = np.asarray(samples, dtype=np.float64)
        se = float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else math.inf
        return Estimate(float(x.mean()), se, len(x))

    def interval(self, z: float = 1.959963984540054) -> tuple[float, float]:
        """Normal interval ``value ± z * se`` (95% by default)."""
        return (self.value - z * self.se, self.value + z * self.se)


def mc_worlds(world: World, n_jobs: int, seed: int, episode: int, m: int) -> list[Randomness]:
    """Monte Carlo worlds 1..m of an episode (world 0 is the logged one)."""
    return [episode_world(world, n_jobs, seed, episode, i) for i in range(1, m + 1)]


def counterfactual_outcomes(
    decision: LoggedDecision, worlds: Sequence[Randomness], n_columns: int
) -> NDArray[np.float64]:
    """``Y[a, m, f]`` for one logged decision: shape ``(n_columns, M, len(OUTCOME_FIELDS))``.

    Column ``a < n_options`` is option ``a``, column ``n_columns - 1`` is
    `DEFER`; infeasible and padding columns are NaN.
    """
    j = decision.job
    out = np.full((n_columns, len(worlds), len(OUTCOME_FIELDS)), np.nan)
    actions = [int(a) for a in np.flatnonzero(decision.mask)] + [DEFER]
    for a in actions:
        col = n_columns - 1 if a == DEFER else a
        for m, randomness in enumerate(worlds):
            sim = decision.fork.fork(randomness)
            sim.apply(j, a)
            out[col, m] = _roll_until_settled(sim, j)
    return out


def _roll_until_settled(sim: Simulator, j: int) -> list[float]:
    """Production decides until job `j`'s finish is known; its outcome fields."""
    while (finish := sim.settled_finish(j)) is None:
        if sim.next_decision(until_done=j) is None:
            continue  # j finished: settled now
        k = sim.state.queue[0]
        sim.apply(k, sample(production_distribution(sim, k), production_uniform(sim, k)))
    e, start = sim.jobs, float(sim.state.start[j])
    completion = finish - float(e.arrival_s[j])
    return [
        start - float(e.arrival_s[j]),
        float(e.steps[j]) / (finish - start),
        completion,
        float(completion <= e.slo_s[j]),
    ]


@dataclass(frozen=True, eq=False)
class OnPolicyResult:
    """A policy run as the scheduler over episodes ``0..n_episodes-1`` of `seed`.

    Attributes:
        outcomes: per episode, the outcome columns of its decided jobs.
        reward: per-episode mean reward, shape ``(n_episodes,)``.
        infeasible_choices: per episode, masked options the policy chose.
        voluntary_defers: per episode, defers while an option was feasible.
        truncated: per episode, whether the decision limit cut it short.
    """

    policy: str
    outcomes: tuple[JobOutcomes, ...]
    reward: NDArray[np.float64]
    infeasible_choices: NDArray[np.int64]
    voluntary_defers: NDArray[np.int64]
    truncated: NDArray[np.bool_]

    @property
    def value(self) -> Estimate:
        """On-policy deployment value (mean reward per job), error across episodes."""
        return Estimate.of(self.reward)

    def mean_of(self, field: str) -> NDArray[np.float64]:
        """Per-episode mean of an outcome field, shape ``(n_episodes,)``."""
        return np.array([float(np.nanmean(getattr(o, field))) for o in self.outcomes])


def on_policy(
    world: World,
    policy: Policy | None,
    seed: int,
    n_episodes: int,
    reward: RewardSpec | None = None,
) -> OnPolicyResult:
    """Run `policy` (None = the production emulator, fast path) on episodes of `seed`."""
    spec = reward or world.scenario.reward
    outcomes, rewards, bad, defers, cut = [], [], [], [], []
    for e in range(n_episodes):
        sim = new_episode(world, seed, e)
        if policy is None:
            run_production(sim)
            stats = (0, 0, False)
        else:
            s = run_policy(sim, policy, (seed, e, 7))
            stats = (s.infeasible_choices, s.voluntary_defers, s.truncated)
        o = job_outcomes(sim)
        outcomes.append(o)
        rewards.append(float(np.nanmean(spec.evaluate(o.columns()))))
        bad.append(stats[0])
        defers.append(stats[1])
        cut.append(stats[2])
    return OnPolicyResult(
        policy="production-emulator" if policy is None else policy.name,
        outcomes=tuple(outcomes),
        reward=np.asarray(rewards),
        infeasible_choices=np.asarray(bad, dtype=np.int64),
        voluntary_defers=np.asarray(defers, dtype=np.int64),
        truncated=np.asarray(cut, dtype=bool),
    )


def paired_difference(a: NDArray[np.float64], b: NDArray[np.float64]) -> Estimate:
    """Mean of ``a - b`` paired by episode, with its standard error."""
    return Estimate.of(np.asarray(a) - np.asarray(b))
