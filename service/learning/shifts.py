"""Shifts of a controllable size away from the training condition, for `sweep`.

Each shift family turns one number into a simulator condition; size 0 of
every family (share 0, factor 1, rate 1) is the training condition itself:

- ``workload_mix`` (share in [0, 1]): each job of an episode is, with
  probability ``share``, replaced by the job in the same slot of an episode
  of the ``mix_shift`` scenario's trace (Philly VC ee9e8c: more multi-GPU,
  longer jobs). Arrival times stay the training trace's, so only the mix
  moves; SLOs are recomputed for the jobs as drawn. Share 1 is the mix of
  ``mix_shift`` with the training arrival pattern.
- ``degradation`` (factor in [1, 2]): V100 servers run ``factor`` times
  slower than measured (Scenario ``degrade: {V100: 1 / factor}``), invisibly
  to requests — the ``degraded`` scenario is factor 2.
- ``arrival_rate`` (multiplier): trace gaps divided by the multiplier
  (``arrival_time_scale = 0.4 / multiplier``); ``surge`` is about 4.7.

A `Condition` builds episode ``(seed, e)`` exactly as
`service.environment.new_episode` does (same key, same draws), so at size 0
every family reproduces the training scenario's episodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.environment import EpisodeJobs, Simulator, World, load_scenario
from service.environment.episode import episode_world
from service.environment.scenario import Scenario

FAMILIES: dict[str, tuple[float, ...]] = {
    "workload_mix": (0.0, 0.25, 0.5, 0.75, 1.0),
    "degradation": (1.0, 1.25, 1.5, 1.75, 2.0),
    "arrival_rate": (0.5, 1.0, 2.0, 3.0, 4.0),
}
"""Default sizes per family."""
AXIS_LABELS = {
    "workload_mix": "share of jobs from the held-out mix (VC ee9e8c)",
    "degradation": "V100 slowdown factor (hidden)",
    "arrival_rate": "arrival rate, x training",
}
_MIX_SOURCE = "mix_shift"


@dataclass(frozen=True, eq=False)
class Condition:
    """A world, and (for ``workload_mix``) a second world whose jobs are mixed in."""

    world: World
    other: World | None = None
    share: float = 0.0

    def jobs(self, seed: int, episode: int) -> EpisodeJobs:
        """Episode ``(seed, episode)``'s jobs, drawn as `new_episode` draws them."""
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(episode), 0]))
        base = self.world.sample_episode(rng)
        if self.other is None or self.share <= 0.0:
            return base
        alt = self.other.sample_episode(rng)
        pick = rng.random(base.n) < self.share
        types = np.where(pick, alt.type_idx, base.type_idx)
        gpus = np.where(pick, alt.gpus, base.gpus)
        steps = np.where(pick, alt.steps, base.steps)
        return EpisodeJobs(
            type_idx=types,
            gpus=gpus,
            steps=steps,
            remaining0=steps.copy(),
            arrival_s=base.arrival_s,
            slo_s=self.world.slo(types, gpus, steps),
            background=base.background,
            trace_row=np.where(pick, alt.trace_row, base.trace_row),
        )

    def simulator(self, seed: int, episode: int) -> Simulator:
        """A fresh simulator for the episode, world 0."""
        jobs = self.jobs(seed, episode)
        return Simulator(self.world, jobs, episode_world(self.world, jobs.n, seed, episode, 0))


def condition(family: str, size: float, base: Scenario | None = None) -> Condition:
    """The condition at `size` of `family` (see the module docstring)."""
    train = base or load_scenario("train")
    if family == "workload_mix":
        if not 0.0 <= size <= 1.0:
            raise ValueError(f"`workload_mix` share must be in [0, 1], got {size}")
        source = load_scenario(_MIX_SOURCE)
        other = train.replace(name=f"{train.name}-mix", trace_vc=source.trace_vc)
        return Condition(World(train), World(other), size)
    if family == "degradation":
        if not size >= 1.0:
            raise ValueError(f"`degradation` factor must be >= 1, got {size}")
        return Condition(World(train.replace(degrade={"V100": 1.0 / size})))
    if family == "arrival_rate":
        if not size > 0:
            raise ValueError(f"`arrival_rate` multiplier must be > 0, got {size}")
        return Condition(World(train.replace(arrival_time_scale=train.arrival_time_scale / size)))
    raise ValueError(f"`family` must be one of {', '.join(FAMILIES)}, got {family!r}")
