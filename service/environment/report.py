"""The acceptance figures, computed from the data files: ``python -m service.environment.report``.

1. Reproduction: simulated / measured run time of jobs alone (consolidated
   and spread), and of co-located pairs against the closed form.
2. Heterogeneity: least-loaded minus throughput-aware mean completion time,
   on-policy, paired by episode, 95% interval, per scenario.
3. Both ground truths for several policies in every scenario and their gap.

Every number is printed with its Monte Carlo error; sizes are flags so a
quick run and a careful one use the same code.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.environment.dataset import ContextPool, build_pool
from service.environment.emulator import ProductionEmulator
from service.environment.reference import LeastLoaded, RandomFeasible, ThroughputAware
from service.environment.reproduction import (
    bench_world,
    heterogeneity,
    isolated_run,
    measured_configs,
    measured_pairs,
    pair_run,
)
from service.environment.scenario import load_scenario, scenario_names
from service.environment.truth import Estimate, on_policy
from service.environment.world import World
from service.policies.base import Policy


@dataclass(frozen=True, slots=True)
class TruthRow:
    """Both truths of one policy in one scenario (rewards per job; errors across episodes).

    Attributes:
        per_decision: mean over episodes of the per-decision counterfactual value.
        per_decision_mc_se: the Monte Carlo part of its error (finite worlds).
        on_policy: on-policy deployment value.
        gap: ``on_policy - per_decision``, paired by episode.
    """

    scenario: str
    policy: str
    per_decision: Estimate
    per_decision_mc_se: float
    on_policy: Estimate
    gap: Estimate


def reference_policies(world: World) -> list[tuple[str, Policy | None]]:
    """(name, policy) pairs the report evaluates; None = the production emulator itself."""
    return [
        ("production-emulator", None),
        ("throughput-aware", ThroughputAware(world.table)),
        ("least-loaded", LeastLoaded()),
        ("random-feasible", RandomFeasible()),
    ]


def truth_rows(
    world: World,
    policies: Sequence[tuple[str, Policy | None]],
    seed: int,
    n_episodes: int,
    n_worlds: int,
    pool: ContextPool | None = None,
) -> list[TruthRow]:
    """Per-decision and on-policy truths of `policies` on episodes ``0..n_episodes-1``."""
    pool = pool or build_pool(world, seed, n_episodes, n_worlds)
    rows = []
    for name, policy in policies:
        target = ProductionEmulator(world.scenario.production) if policy is None else policy
        truth = pool.truth(target)
        per_episode = np.array(
            [truth.per_decision[pool.episode == e].mean() for e in range(n_episodes)]
        )
        on = on_policy(world, policy, seed, n_episodes)
        rows.append(
            TruthRow(
                scenario=world.scenario.name,
                policy=name,
                per_decision=Estimate.of(per_episode),
                per_decision_mc_se=truth.value.se,
                on_policy=on.value,
                gap=Estimate.of(on.reward - per_episode),
            )
        )
    return rows


def _fmt(e: Estimate, digits: int = 3) -> str:
    return f"{e.value:.{digits}f} ± {e.se:.{digits}f}"


def _reproduction(seed: int, runs: int) -> None:
    base = load_scenario("train")
    print("== 1. Reproduction (ratio simulated / measured run time; ± Monte Carlo SE)")
    benches = (("K80", "MISC", 1), ("P100", "P100", 3), ("V100", "V100", 1))
    for b, (hw, machine, count) in enumerate(benches):
        world = bench_world(base, hw, machine, count, None)
        configs = measured_configs(world)
        rng = np.random.default_rng([seed, b])
        picks = [configs[int(i)] for i in rng.choice(len(configs), size=3, replace=False)]
        spread = [c for c in configs if c[1] > int(world.node_gpus.max())]
        if spread:  # show one spread run where the cluster forces one
            picks[-1] = spread[int(rng.integers(len(spread)))]
        for i, (job_type, gpus) in enumerate(picks):
            r = isolated_run(world, job_type, gpus, runs, seed * 1000 + b * 10 + i)
            kind = "consolidated" if r.consolidated else "spread"
            print(
                f"  {hw:5s} {r.job_type:34s} x{r.gpus} {kind:12s} "
                f"measured {r.measured_steps_per_s:8.3f} steps/s  ratio {_fmt(r.ratio)}"
            )
    world = bench_world(base, "V100", "P100", 1, 0.0)
    pairs = measured_pairs(world)
    rng = np.random.default_rng(seed)
    worst = 0.0
    for i in rng.choice(len(pairs), size=min(50, len(pairs)), replace=False):
        p = pair_run(world, *pairs[int(i)], (4000.0, 2500.0))
        worst = max(
            worst, *(abs(a / b - 1.0) for a, b in zip(p.simulated, p.expected, strict=True))
        )
    print(
        "  co-located pairs on a V100 server: 50 measured pairs, "
        f"max |simulated / closed form - 1| = {worst:.2e}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Print the acceptance figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenarios", nargs="*", default=list(scenario_names()))
    ap.add_argument("--episodes", type=int, default=8, help="episodes per truth (paired)")
    ap.add_argument("--worlds", type=int, default=4, help="Monte Carlo worlds per fork")
    ap.add_argument("--hetero-episodes", type=int, default=60)
    ap.add_argument("--runs", type=int, default=400, help="runs per reproduction check")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    started = time.time()
    _reproduction(args.seed, args.runs)
    print("\n== 2. Heterogeneity: mean completion time (s), on-policy, paired by episode")
    for name in args.scenarios:
        h = heterogeneity(World(load_scenario(name)), args.hetero_episodes, args.seed)
        lo, hi = h.difference_s.interval()
        print(
            f"  {name:11s} throughput-aware {_fmt(h.throughput_aware_s, 0)}  "
            f"least-loaded {_fmt(h.least_loaded_s, 0)}  "
            f"LL - TA {h.difference_s.value:.0f} [95% {lo:.0f}, {hi:.0f}]  (n={h.difference_s.n})"
        )
    print(
        f"\n== 3. Ground truths (reward per job; {args.episodes} episodes, "
        f"{args.worlds} Monte Carlo worlds per fork)"
    )
    print(f"  {'scenario':11s} {'policy':20s} {'per-decision':>16s} {'(MC se)':>8s} "
          f"{'on-policy':>16s} {'gap on - pd':>16s}")  # fmt: skip
    for name in args.scenarios:
        world = World(load_scenario(name))
        for row in truth_rows(
            world, reference_policies(world), args.seed, args.episodes, args.worlds
        ):
            print(
                f"  {row.scenario:11s} {row.policy:20s} {_fmt(row.per_decision):>16s} "
                f"{row.per_decision_mc_se:8.4f} {_fmt(row.on_policy):>16s} {_fmt(row.gap):>16s}"
            )
    print(f"\n(done in {time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
