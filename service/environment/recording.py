"""Recorded production runs: what Runtime would mirror, what it reports later, and fork points.

`log_episode` lets the production emulator schedule one episode and keeps,
for every request, the contract `MirrorRequest` (state snapshot + workload +
options + production's decision and propensity) and, when the job has
finished, its delayed `Outcome`. Each decision with a feasible option also
keeps its features, constraint signals and a fork of the simulator taken just
before the action — the starting point of the per-decision ground truth.

Both contract paths are supported: ``mirror_before=False`` puts production's
decision on the request (Runtime mirrors after deciding); ``True`` leaves it
off the request and puts it on the outcome (Runtime mirrors before deciding).

`simulated_episodes` is the same run reduced to what the service receives
(requests and outcomes), for the training summaries' drift references.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.contract import (
    DEFAULT_FEATURES,
    DEFER,
    MirrorRequest,
    Outcome,
    ProductionDecision,
    check_feasibility,
)
from service.environment.episode import (
    JobOutcomes,
    contract_request,
    job_outcomes,
    new_episode,
    outcome_for,
    run_production,
)
from service.environment.policy_kit import Distribution
from service.environment.scenario import load_scenario
from service.environment.sim import Simulator
from service.environment.world import World


@dataclass(frozen=True, eq=False)
class LoggedDecision:
    """One production decision that had at least one feasible option.

    Attributes:
        job: job index in the episode.
        request: the mirrored request (production's decision on it or not, per path).
        features: float32 ``(n_options, N_FEATURES)``, the contract feature function.
        violations: bool ``(n_options, len(SIGNALS))``, the contract feasibility.
        probabilities: float64 ``(n_options,)``, production's distribution.
        defer_probability: production's probability of `DEFER` (0 here: it never
            defers while an option is feasible).
        chosen: the option production took.
        fork: the simulator just before the action (do not advance it; fork it).
    """

    job: int
    request: MirrorRequest
    features: NDArray[np.float32]
    violations: NDArray[np.bool_]
    probabilities: NDArray[np.float64]
    defer_probability: float
    chosen: int
    fork: Simulator

    @property
    def mask(self) -> NDArray[np.bool_]:
        """Feasible options, shape ``(n_options,)``."""
        out: NDArray[np.bool_] = np.logical_not(np.any(self.violations, axis=1))
        return out

    @property
    def propensity(self) -> float:
        """Production's probability of the action it took."""
        return (
            self.defer_probability
            if self.chosen == DEFER
            else float(self.probabilities[self.chosen])
        )


@dataclass(frozen=True, eq=False)
class EpisodeLog:
    """One recorded episode.

    Attributes:
        seed, episode: the episode key (`service.environment.episode.new_episode`).
        decisions: decisions with a feasible option, in time order.
        requests: every mirrored request, forced defers included, in time order.
        outcomes: one delayed outcome per request, ordered by ``observed_at``.
        final: the simulator at the end of the episode.
    """

    scenario: str
    seed: int
    episode: int
    decisions: tuple[LoggedDecision, ...]
    requests: tuple[MirrorRequest, ...]
    outcomes: tuple[Outcome, ...]
    final: Simulator

    def job_outcomes(self) -> JobOutcomes:
        """Outcome columns of the decided jobs."""
        return job_outcomes(self.final)

    def events(self) -> list[MirrorRequest | Outcome]:
        """Requests and outcomes merged in the order Runtime would send them."""
        keyed: list[tuple[float, int, MirrorRequest | Outcome]] = [
            (r.request_time, 0, r) for r in self.requests
        ]
        keyed += [(o.observed_at, 1, o) for o in self.outcomes]
        keyed.sort(key=lambda x: (x[0], x[1]))
        return [x[2] for x in keyed]


def log_episode(world: World, seed: int, episode: int, mirror_before: bool = False) -> EpisodeLog:
    """Run production on episode (`seed`, `episode`) in world 0 and record everything."""
    sim = new_episode(world, seed, episode)
    prefix = f"{world.scenario.name}-s{seed}-e{episode}"
    decisions: list[LoggedDecision] = []
    requests: list[MirrorRequest] = []
    production_of: dict[str, ProductionDecision] = {}
    rids_of_job: dict[int, list[str]] = {}

    def record(j: int, production: ProductionDecision) -> MirrorRequest:
        request = contract_request(sim, j, prefix, None if mirror_before else production)
        requests.append(request)
        production_of[request.request_id] = production
        rids_of_job.setdefault(j, []).append(request.request_id)
        return request

    # production's whole distribution travels with its decision (issue 22 item 8), as
    # Decision Service logs carry it: the diagnostics check support exactly against it
    def on_forced(j: int) -> None:
        n_options = len(sim.options(j).mask)
        record(j, ProductionDecision(DEFER, 1.0, (0.0,) * n_options, 1.0))

    def on_decision(s: Simulator, j: int, dist: Distribution, choice: int) -> None:
        probs, defer = dist
        propensity = defer if choice == DEFER else float(probs[choice])
        whole = tuple(float(p) for p in probs)
        request = record(j, ProductionDecision(choice, propensity, whole, float(defer)))
        feas = check_feasibility(request.state, request.workload, request.options)
        if not np.array_equal(feas.mask, s.options(j).mask):
            raise RuntimeError(
                f"simulator mask disagrees with the contract for {request.request_id}"
            )
        decisions.append(
            LoggedDecision(
                job=j,
                request=request,
                features=DEFAULT_FEATURES(request.state, request.workload, request.options),
                violations=feas.violations,
                probabilities=probs,
                defer_probability=defer,
                chosen=choice,
                fork=s.fork(),
            )
        )

    run_production(sim, on_decision=on_decision, on_forced=on_forced)
    outcomes = [
        outcome_for(sim, j, rid, production_of[rid] if mirror_before else None)
        for j, rids in rids_of_job.items()
        for rid in rids
    ]
    outcomes.sort(key=lambda o: o.observed_at)
    return EpisodeLog(
        scenario=world.scenario.name,
        seed=seed,
        episode=episode,
        decisions=tuple(decisions),
        requests=tuple(requests),
        outcomes=tuple(outcomes),
        final=sim,
    )


def simulated_episodes(
    scenario: str, seed: int, episodes: range, jobs_per_episode: int | None = None
) -> list[tuple[list[MirrorRequest], dict[str, Outcome]]]:
    """Each episode's mirrored requests (forced defers included) and its outcomes by request id.

    What Runtime would send for episodes `episodes` of `scenario` under `seed`:
    the training summaries' drift references are built on it (the
    ``Episode`` of `service.policies.outcome_summary`). It lives here, with the
    simulator, so that ``policies`` never imports the environment: the build
    code that needs episodes (`service.learning.training_summaries`) calls it
    and passes them down.
    """
    s = load_scenario(scenario)
    if jobs_per_episode is not None:
        s = s.replace(jobs_per_episode=jobs_per_episode)
    world = World(s)
    out: list[tuple[list[MirrorRequest], dict[str, Outcome]]] = []
    for e in episodes:
        log = log_episode(world, seed, e)
        out.append((list(log.requests), {o.request_id: o for o in log.outcomes}))
    return out
