"""``understudy sweep``: on-policy value vs production as each shift grows.

For every shift family and size (`shifts`), every seed and episode, the
production emulator and each candidate schedule the same episode (same jobs,
same randomness); the candidate's value minus production's is paired by
episode, averaged per seed, and reported with a 95% t-interval over seeds
(`stats`). Only the on-policy (deployment) truth is swept: the per-decision
truth forks every decision into every action and would cost ~50x more per
point; `compare` reports both truths at the named scenarios.

Outputs (``out/sweep`` by default): ``sweep.json`` (deterministic; rerun
from ``run_manifest.json`` gives the same bytes), ``sweep.csv`` (one row per
family x size x policy) and ``sweep.png`` (one panel per family, a curve with
interval bars per candidate).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from service.environment import job_outcomes, load_scenario, run_policy, run_production
from service.environment.scenario import Scenario
from service.learning.compare import load_candidates
from service.learning.shifts import FAMILIES, Condition, condition
from service.learning.stats import interval_dict, over_seeds, rounded
from service.policies.base import Policy

SCHEMA = "understudy-sweep/v1"
DEFAULT_POLICIES = ("lcb-planner", "iwr-scorer", "throughput-greedy")


@dataclass(frozen=True)
class SweepSpec:
    """Everything a sweep depends on besides files (recorded in the run manifest)."""

    families: tuple[str, ...] = tuple(FAMILIES)
    sizes: dict[str, tuple[float, ...]] = dataclasses.field(default_factory=lambda: dict(FAMILIES))
    seeds: tuple[int, ...] = (100, 101, 102)
    episodes: int = 4
    jobs_per_episode: int | None = None
    policies: tuple[str, ...] = DEFAULT_POLICIES
    policies_dir: str = "policies"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        d = dataclasses.asdict(self)
        d["sizes"] = {k: list(v) for k, v in self.sizes.items()}
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> SweepSpec:
        """Inverse of `to_dict`."""
        fields = {f.name for f in dataclasses.fields(SweepSpec)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ValueError(f"`spec.{unknown[0]}` is not a sweep setting")
        kw: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        kw["sizes"] = {k: tuple(v) for k, v in d.get("sizes", FAMILIES).items()}
        return SweepSpec(**kw)

    def points(self) -> int:
        """(family, size) points."""
        return sum(len(self.sizes[f]) for f in self.families)


def _episode_reward(cond: Condition, policy: Policy | None, seed: int, episode: int) -> float:
    """Mean reward over the episode's jobs when `policy` (None = production) schedules it."""
    sim = cond.simulator(seed, episode)
    if policy is None:
        run_production(sim)
    else:
        run_policy(sim, policy, (seed, episode, 7))
    o = job_outcomes(sim)
    return float(np.nanmean(cond.world.scenario.reward.evaluate(o.columns())))


def sweep_point(
    cond: Condition, policies: list[Policy], seeds: tuple[int, ...], episodes: int
) -> dict[str, Any]:
    """Production's value and each policy's paired difference at one condition."""
    prod = {(s, e): _episode_reward(cond, None, s, e) for s in seeds for e in range(episodes)}
    out: dict[str, Any] = {
        "production": interval_dict(
            *over_seeds([float(np.mean([prod[(s, e)] for e in range(episodes)])) for s in seeds])
        )
    }
    for p in policies:
        value, diff = [], []
        for s in seeds:
            r = [_episode_reward(cond, p, s, e) for e in range(episodes)]
            value.append(float(np.mean(r)))
            diff.append(float(np.mean([r[e] - prod[(s, e)] for e in range(episodes)])))
        out[p.name] = {
            "value": interval_dict(*over_seeds(value)),
            "vs_production": interval_dict(*over_seeds(diff)),
            "per_seed_vs_production": [rounded(d) for d in diff],
        }
    return out


def run_sweep(
    spec: SweepSpec, root: Path, advance: Callable[[str], None] = lambda _what: None
) -> dict[str, Any]:
    """The ``sweep.json`` document; `advance` is called once per (family, size)."""
    policies = load_candidates(root, spec.policies)
    doc: dict[str, Any] = {"schema": SCHEMA, "spec": spec.to_dict(), "families": {}}
    for family in spec.families:
        points = []
        for size in spec.sizes[family]:
            cond = condition(family, size, _base(spec))
            points.append({"size": size, **sweep_point(cond, policies, spec.seeds, spec.episodes)})
            advance(f"{family} = {size:g}")
        doc["families"][family] = points
    return doc


def _base(spec: SweepSpec) -> Scenario:
    train = load_scenario("train")
    if spec.jobs_per_episode is None:
        return train
    return train.replace(jobs_per_episode=spec.jobs_per_episode)


def to_csv(doc: dict[str, Any]) -> str:
    """One row per family x size x policy: value and difference with intervals."""
    lines = ["family,size,policy,value,value_lo,value_hi,diff,diff_lo,diff_hi,seeds"]

    def cell(x: Any) -> str:
        return "" if x is None else f"{x}"

    for family, points in doc["families"].items():
        for point in points:
            prod = point["production"]
            lines.append(
                f"{family},{point['size']},production,{cell(prod['mean'])},{cell(prod['lo'])},"
                f"{cell(prod['hi'])},,,,{prod['n']}"
            )
            for name, v in point.items():
                if name in ("size", "production"):
                    continue
                a, d = v["value"], v["vs_production"]
                lines.append(
                    f"{family},{point['size']},{name},{cell(a['mean'])},{cell(a['lo'])},"
                    f"{cell(a['hi'])},{cell(d['mean'])},{cell(d['lo'])},{cell(d['hi'])},{d['n']}"
                )
    return "\n".join(lines) + "\n"
