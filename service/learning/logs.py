"""Simulated production logs as training rows: one row per logged decision.

What a learner may use is what Runtime would give Understudy: the mirrored
request (state, workload, options), production's choice and its propensity,
and the delayed outcome of that choice. Nothing else — in particular not the
simulator's counterfactual rollouts, which are ground truth and are kept for
evaluation (`service.learning.compare`).

A row is the option production *chose*; its features are computed with the
same feature functions the service calls at scoring time (`OUTCOME_FEATURES`
for the predictor, the contract's `DEFAULT_FEATURES` for the scorer), so
training and serving agree by construction. Episodes are keyed by
``(seed, episode)`` exactly as `service.environment.log_episode` keys them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.contract import N_FEATURES
from service.environment import World, log_episode
from service.policies.outcome_features import N_OUTCOME_FEATURES, OUTCOME_FEATURES


@dataclass(frozen=True, eq=False)
class LoggedRows:
    """Production's logged decisions, one row each; arrays have shape ``(n,)`` unless noted.

    Attributes:
        scenario: the scenario the logs come from.
        seed: the simulator seed of the episodes.
        episode: the episode of each row (the group for cross-validation).
        outcome_x: float32 ``(n, N_OUTCOME_FEATURES)``, the chosen option's outcome features.
        contract_x: float32 ``(n, N_FEATURES)``, the chosen option's contract features.
        propensity: production's probability of the chosen option.
        reward: the scenario's reward of the outcome (``slo_met`` for the shipped ones).
        throughput: steps/s the job got (the outcome's ``throughput``).
        run_time: seconds from start to finish (completion time minus queue delay).
        queue_delay: seconds from arrival to start.
        job_type: the Gavel job type (``Workload.model_family``).
        hardware: class of the chosen option's (first) node.
        work_units: steps of the job.
    """

    scenario: str
    seed: int
    episode: NDArray[np.int64]
    outcome_x: NDArray[np.float32]
    contract_x: NDArray[np.float32]
    propensity: NDArray[np.float64]
    reward: NDArray[np.float64]
    throughput: NDArray[np.float64]
    run_time: NDArray[np.float64]
    queue_delay: NDArray[np.float64]
    job_type: NDArray[np.str_]
    hardware: NDArray[np.str_]
    work_units: NDArray[np.float64]

    @property
    def n(self) -> int:
        """Rows."""
        return len(self.episode)

    @property
    def log_throughput(self) -> NDArray[np.float64]:
        """The predictor's target: log steps/s."""
        out: NDArray[np.float64] = np.log(self.throughput)
        return out


def collect(
    world: World,
    seed: int,
    episodes: range,
    on_episode: Callable[[int], None] | None = None,
) -> LoggedRows:
    """Log `episodes` of production on `world` under `seed`; one row per decision.

    `on_episode` is called after each episode (a progress bar's advance).
    """
    spec = world.scenario.reward
    cols: dict[str, list[object]] = {k: [] for k in LoggedRows.__dataclass_fields__}
    ox: list[NDArray[np.float32]] = []
    cx: list[NDArray[np.float32]] = []
    for e in episodes:
        log = log_episode(world, seed, e)
        done = log.job_outcomes()
        row_of_job = {int(j): i for i, j in enumerate(done.job)}
        reward = spec.evaluate(done.columns())
        for d in log.decisions:
            i, a = row_of_job[d.job], d.chosen
            request = d.request
            nodes = request.options.nodes_of(a)
            ox.append(OUTCOME_FEATURES([request])[a])
            cx.append(d.features[a])
            cols["episode"].append(e)
            cols["propensity"].append(float(d.probabilities[a]))
            cols["reward"].append(float(reward[i]))
            cols["throughput"].append(float(done.throughput[i]))
            cols["run_time"].append(float(done.completion_time_s[i] - done.queue_delay_s[i]))
            cols["queue_delay"].append(float(done.queue_delay_s[i]))
            cols["job_type"].append(request.workload.model_family)
            cols["hardware"].append(request.state.hardware_of(int(nodes[0])).name)
            cols["work_units"].append(float(request.workload.work_units or 0.0))
        if on_episode is not None:
            on_episode(e)
    return LoggedRows(
        scenario=world.scenario.name,
        seed=seed,
        episode=np.asarray(cols["episode"], dtype=np.int64),
        outcome_x=np.stack(ox) if ox else np.zeros((0, N_OUTCOME_FEATURES), np.float32),
        contract_x=np.stack(cx) if cx else np.zeros((0, N_FEATURES), np.float32),
        propensity=np.asarray(cols["propensity"], dtype=np.float64),
        reward=np.asarray(cols["reward"], dtype=np.float64),
        throughput=np.asarray(cols["throughput"], dtype=np.float64),
        run_time=np.asarray(cols["run_time"], dtype=np.float64),
        queue_delay=np.asarray(cols["queue_delay"], dtype=np.float64),
        job_type=np.asarray(cols["job_type"], dtype=np.str_),
        hardware=np.asarray(cols["hardware"], dtype=np.str_),
        work_units=np.asarray(cols["work_units"], dtype=np.float64),
    )
