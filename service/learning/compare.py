"""``understudy compare``: every candidate and baseline on every scenario, both ground truths.

Per scenario and seed (a seed is one independent replication):

- **per-decision truth** on ``pool_episodes`` episodes of production's logged
  contexts, forked into every action x ``pool_worlds`` worlds
  (`service.environment.build_pool`): each policy's value and its paired
  difference from production, context by context;
- **on-policy truth**: the policy schedules ``episodes`` whole episodes
  (`service.environment.on_policy`, same jobs and randomness as production's
  run): value, paired difference per episode, and the *gap* (on-policy minus
  per-decision, paired on the episodes both saw) — the interference a
  per-decision estimate cannot see;
- **cost** (the scenario's `CostSpec` over the chosen options' constraint
  signals), kept apart from reward;
- **reliability**: error rate, raw-favourite-infeasible rate (requests with a
  feasible option), voluntary defers, truncated episodes;
- **operations**: mean completion time and queue delay on-policy.

Figures are averaged per seed and reported as a mean with a 95% t-interval
over seeds (`stats`). Policy seeds start at 100 by default so no compared
episode is one the learned policies were trained on (seeds 0-2).

Latency (wall time per decide call) varies run to run, so it is written to
``timings.json``; ``results.json`` holds only deterministic figures, and a
rerun from ``run_manifest.json`` reproduces it byte for byte.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.environment import ContextPool, World, build_pool, load_scenario, on_policy
from service.environment.scenario import Scenario
from service.learning.instrument import Instrumented
from service.learning.pooled import decide_on_pool
from service.learning.stats import interval_dict, interval_from_dict, over_seeds, rounded
from service.policies.base import Policy
from service.policies.planner import LcbPlanner
from service.policies.registry import load_registry

SCHEMA = "understudy-compare/v1"
PRODUCTION = "production"
EXCLUDED = ("production-mirror",)
"""Replays Runtime's own decision: it *is* production, and cannot schedule a rollout."""


@dataclass(frozen=True)
class CompareSpec:
    """Everything a comparison depends on besides files (recorded in the run manifest)."""

    scenarios: tuple[str, ...] = (
        "train",
        "mix_shift",
        "new_class",
        "degraded",
        "surge",
        "fragmented",
    )
    seeds: tuple[int, ...] = (100, 101, 102)
    episodes: int = 4
    pool_episodes: int = 2
    pool_worlds: int = 3
    jobs_per_episode: int | None = None
    policies: tuple[str, ...] | None = None
    planner_pessimism: tuple[float, ...] = (0.0,)
    policies_dir: str = "policies"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> CompareSpec:
        """Inverse of `to_dict` (lists back to tuples)."""
        fields = {f.name for f in dataclasses.fields(CompareSpec)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ValueError(f"`spec.{unknown[0]}` is not a compare setting")
        kw: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return CompareSpec(**kw)

    def scenario(self, name: str) -> Scenario:
        """The named scenario, with fewer jobs per episode if asked."""
        s = load_scenario(name)
        return (
            s
            if self.jobs_per_episode is None
            else s.replace(jobs_per_episode=self.jobs_per_episode)
        )


def load_candidates(
    root: Path, names: Sequence[str] | None, planner_pessimism: Sequence[float] = ()
) -> list[Policy]:
    """Registered policies named in `names` (all but `EXCLUDED` when None), sorted by name,
    each planner followed by copies at the other `planner_pessimism` values.

    Raises `ValueError` naming any requested policy the registry did not load.
    """
    registry = load_registry(root)
    missing = sorted(set(names or ()) - set(registry.policies))
    if missing:
        refused = {k: v.problem for k, v in registry.refused.items()}
        raise ValueError(f"`policies` {missing} did not load from {root} (refused: {refused})")
    out: list[Policy] = []
    for name in sorted(registry.policies):
        policy = registry.policies[name]
        if name in EXCLUDED or (names is not None and name not in names):
            continue
        out.append(policy)
        if isinstance(policy, LcbPlanner):
            out += [
                policy.with_planning(f"{name}[k={k:g}]", pessimism=k) for k in planner_pessimism
            ]
    return out


def _episode_means(values: NDArray[np.float64], episode: NDArray[np.int64]) -> dict[int, float]:
    return {int(e): float(values[episode == e].mean()) for e in np.unique(episode)}


@dataclass
class _Seed:
    """One policy's figures on one (scenario, seed)."""

    figures: dict[str, float]
    latency_s: list[float]


def _production(
    world: World, pool: ContextPool, seed: int, episodes: int
) -> tuple[dict[str, float], NDArray[np.float64], NDArray[np.float64]]:
    truth = pool.truth(pool.logging_probabilities)
    run = on_policy(world, None, seed, episodes)
    figures = {
        "per_decision": truth.value.value,
        "on_policy": run.value.value,
        "gap": _gap(run.reward, truth.per_decision, pool.episode),
        "completion_time_s": float(run.mean_of("completion_time_s").mean()),
        "queue_delay_s": float(run.mean_of("queue_delay_s").mean()),
        "cost_per_decision": float(
            (pool.logging_probabilities * pool.cost_table()).sum(axis=1).mean()
        ),
    }
    return figures, truth.per_decision, run.reward


def _gap(on: NDArray[np.float64], per: NDArray[np.float64], episode: NDArray[np.int64]) -> float:
    """Mean over pooled episodes of (on-policy - per-decision), paired by episode."""
    per_ep = _episode_means(per, episode)
    return float(np.mean([on[e] - v for e, v in per_ep.items() if e < len(on)]))


def _one(
    policy: Policy,
    world: World,
    pool: ContextPool,
    seed: int,
    episodes: int,
    production: tuple[NDArray[np.float64], NDArray[np.float64]],
) -> _Seed:
    pooled = decide_on_pool(policy, pool)
    truth = pool.truth(pooled.action_dist)
    probe = Instrumented(policy, world.scenario.cost)
    run = on_policy(world, probe, seed, episodes)
    prod_per, prod_on = production
    decided = max(probe.requests, 1)
    figures = {
        "per_decision": truth.value.value,
        "per_decision_vs_production": float((truth.per_decision - prod_per).mean()),
        "on_policy": run.value.value,
        "on_policy_vs_production": float((run.reward - prod_on).mean()),
        "gap": _gap(run.reward, truth.per_decision, pool.episode),
        "cost_per_decision": float((pooled.action_dist * pool.cost_table()).sum(axis=1).mean()),
        "cost_on_policy": probe.cost / decided,
        "error_rate": probe.errors / decided,
        "raw_favourite_infeasible_rate": probe.raw_favourite_infeasible / max(probe.with_choice, 1),
        "voluntary_defer_rate": float(run.voluntary_defers.sum()) / decided,
        "truncated_episodes": float(run.truncated.sum()),
        "completion_time_s": float(run.mean_of("completion_time_s").mean()),
        "queue_delay_s": float(run.mean_of("queue_delay_s").mean()),
    }
    return _Seed(figures, probe.latency_s)


def _summary(per_seed: list[dict[str, float]]) -> dict[str, Any]:
    keys = per_seed[0].keys()
    return {
        "intervals": {k: interval_dict(*over_seeds([s[k] for s in per_seed])) for k in keys},
        "per_seed": [{k: rounded(v) for k, v in s.items()} for s in per_seed],
    }


def run_compare(
    spec: CompareSpec,
    root: Path,
    advance: Callable[[str], None] = lambda _what: None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(results document, timings document).

    `advance` is called once per (scenario, seed, policy), production included.
    """
    policies = load_candidates(root, spec.policies, spec.planner_pessimism)
    results: dict[str, Any] = {"schema": SCHEMA, "spec": spec.to_dict(), "scenarios": {}}
    timings: dict[str, Any] = {}
    for name in spec.scenarios:
        world = World(spec.scenario(name))
        prod_seeds: list[dict[str, float]] = []
        per_policy: dict[str, list[dict[str, float]]] = {p.name: [] for p in policies}
        latency: dict[str, list[float]] = {p.name: [] for p in policies}
        for seed in spec.seeds:
            pool = build_pool(world, seed, spec.pool_episodes, spec.pool_worlds)
            prod, prod_per, prod_on = _production(world, pool, seed, spec.episodes)
            prod_seeds.append(prod)
            advance(f"{name} seed {seed}: {PRODUCTION}")
            for p in policies:
                one = _one(p, world, pool, seed, spec.episodes, (prod_per, prod_on))
                per_policy[p.name].append(one.figures)
                latency[p.name] += one.latency_s
                advance(f"{name} seed {seed}: {p.name}")
        results["scenarios"][name] = {
            PRODUCTION: _summary(prod_seeds),
            **{k: _summary(v) for k, v in per_policy.items()},
        }
        timings[name] = {k: _latency(v) for k, v in latency.items()}
    return results, timings


def _latency(samples: Sequence[float]) -> dict[str, float | None]:
    x = np.asarray(samples) * 1e3
    if len(x) == 0:
        return {"calls": 0, "p50_ms": None, "p99_ms": None}
    return {
        "calls": len(x),
        "p50_ms": rounded(float(np.percentile(x, 50))),
        "p99_ms": rounded(float(np.percentile(x, 99))),
    }


def steps(spec: CompareSpec, n_policies: int) -> int:
    """How many times `run_compare` calls `advance` (for a progress bar's total)."""
    return len(spec.scenarios) * len(spec.seeds) * (n_policies + 1)


def verdict(interval: dict[str, Any]) -> str:
    """``wins`` / ``loses`` / ``no difference`` from a difference's interval dict."""
    sign = interval_from_dict(interval).sign
    return {1: "wins", -1: "loses", 0: "no difference"}[sign]
