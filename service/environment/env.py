"""The Gymnasium environment: one step = one placement decision.

Observation (a `gymnasium.spaces.Dict`, float32 boxes with finite bounds):

==============  ========================  =======================================
key             shape                     content
==============  ========================  =======================================
``nodes``       ``(n_nodes, 7)``          per server: free/total GPUs for this
                                          request, utilisation, draining, class
                                          log-TFLOP/s, memory/80 GB, link/900
                                          GB/s, healthy
``workload``    ``(4,)``                  log2(1+GPUs) (share: the share), log1p(SLO s)/12,
                                          log1p(steps)/12, log1p(waiting jobs)
``options``     ``(K, N_FEATURES)``       the contract's feature rows, zero padded
``action_mask`` ``(K + 1,)`` int8         1 where feasible; the last is `DEFER`
==============  ========================  =======================================

Action: ``Discrete(K + 1)``; ``a < n_options`` places on option ``a``,
``a == K`` defers, anything else is an invalid padding slot (treated as a
defer and flagged). ``K`` is the scenario's most options per request.

Reward is delayed: the `RewardSpec` reward of every job that *finished*
during the transition, summed. Safety is not in the reward:
``info["cost"]`` is the `CostSpec` cost of the constraint signals the chosen
option fired (``info["constraint_signals"]``), as in Safety-Gymnasium; an
infeasible option is not placed (the job waits). ``info["action_mask"]``
repeats the mask; ``info["outcomes"]`` holds the delayed contract `Outcome`
of each job that finished. `ClusterEnv.mirror_request` gives the contract
request of the pending decision (optionally with production's decision);
`ClusterEnv.production_action` is what the production emulator would do, so
a driver can replay production and mirror every request with its
propensity. Requests with no feasible option are deferred without a step.
The episode terminates when every job has finished and truncates after
``max_decisions`` steps.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from numpy.typing import NDArray

from service.contract import (
    DEFAULT_FEATURES,
    DEFER,
    N_FEATURES,
    SIGNALS,
    Feasibility,
    MirrorRequest,
    Outcome,
    ProductionDecision,
    check_feasibility,
)
from service.environment.episode import (
    contract_request,
    new_episode,
    outcome_for,
    production_distribution,
    production_uniform,
)
from service.environment.policy_kit import sample
from service.environment.scenario import Scenario, load_scenario
from service.environment.sim import DONE, Simulator
from service.environment.world import World

ENV_ID = "Understudy/Cluster-v0"
NODE_FEATURES = 7
WORKLOAD_FEATURES = 4
FEATURE_BOUND = 100.0

Obs = dict[str, Any]


class ClusterEnv(gym.Env[Obs, np.int64]):
    """A heterogeneous GPU cluster scheduled one request at a time (see module docstring)."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's class attribute

    def __init__(
        self,
        scenario: str | Scenario = "train",
        data_root: str | None = None,
        max_decisions: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None:
            raise ValueError(f"`render_mode` must be None (no rendering), got {render_mode!r}")
        self.render_mode = render_mode
        sc = load_scenario(scenario) if isinstance(scenario, str) else scenario
        self.world = World(sc, data_root)
        self.max_decisions = max_decisions or 50 * (sc.jobs_per_episode + 1)
        k = self.world.max_options
        self._k = k
        self.action_space = spaces.Discrete(k + 1)
        self.observation_space = spaces.Dict(
            {
                "nodes": spaces.Box(0.0, 10.0, (self.world.n_nodes, NODE_FEATURES), np.float32),
                "workload": spaces.Box(0.0, FEATURE_BOUND, (WORKLOAD_FEATURES,), np.float32),
                "options": spaces.Box(-FEATURE_BOUND, FEATURE_BOUND, (k, N_FEATURES), np.float32),
                "action_mask": spaces.MultiBinary(k + 1),
            }
        )
        self._sim: Simulator | None = None
        self._request: MirrorRequest | None = None
        self._feasibility: Feasibility | None = None
        self._placed_by: dict[int, str] = {}
        self._prefix = ""
        self._steps = 0
        self._job = -1
        self._episode_seed = -1

    # ------------------------------------------------------------------ API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Obs, dict[str, Any]]:
        """Start an episode; `seed` fixes its jobs and randomness."""
        super().reset(seed=seed)
        episode_seed = self._episode_seed = int(self.np_random.integers(0, 2**31 - 1))
        self._sim = new_episode(self.world, episode_seed, 0)
        self._prefix = f"{self.world.scenario.name}-gym{episode_seed}"
        self._placed_by = {}
        self._steps = 0
        done = self._sim.next_decision() is None
        obs = self._observe(done)
        return obs, self._info(obs, 0.0, np.zeros(len(SIGNALS), bool), False, ())

    def step(self, action: np.int64 | int) -> tuple[Obs, float, bool, bool, dict[str, Any]]:
        """Apply `action` to the pending request and run to the next decision."""
        sim, request, feas = self._sim, self._request, self._feasibility
        if sim is None or request is None or feas is None:
            raise RuntimeError("call reset() before step(), and again after the episode ends")
        a = int(action)
        n_options = request.options.n_options
        invalid = not (a < n_options or a == self._k)
        option = a if a < n_options else DEFER
        signals = feas.violations[option] if option != DEFER else np.zeros(len(SIGNALS), bool)
        cost = float(self.world.scenario.cost.evaluate(signals[None, :], ["none"])[0])
        job, rid = self._job, request.request_id
        before = sim.state.status == DONE
        if sim.apply(job, option):
            self._placed_by[job] = rid
        self._steps += 1
        done = sim.next_decision() is None
        finished = np.flatnonzero((sim.state.status == DONE) & ~before & ~sim.jobs.background)
        outcomes = tuple(outcome_for(sim, int(j), self._placed_by[int(j)], None) for j in finished)
        reward = self._reward(outcomes)
        obs = self._observe(done)
        truncated = not done and self._steps >= self.max_decisions
        return obs, reward, done, truncated, self._info(obs, cost, signals, invalid, outcomes)

    def mirror_request(self, with_production: bool = False) -> MirrorRequest | None:
        """The contract request of the pending decision (None once the episode is over).

        With `with_production`, it carries the production emulator's decision,
        propensity and whole distribution for this state (`production_action`),
        as Runtime mirrors after deciding and as `log_episode` records it.
        """
        if self._request is None or not with_production:
            return self._request
        option, propensity = self._production()
        probs, defer = production_distribution(self.simulator, self._job)
        whole = tuple(float(p) for p in probs)  # production's whole distribution, as logged
        return replace(
            self._request,
            production=ProductionDecision(option, propensity, whole, float(defer)),
        )

    def production_action(self) -> int:
        """The action the production emulator takes here (its keyed draw), as a gym action.

        Stepping with it reproduces the logged production run of the same seed.
        """
        option, _ = self._production()
        return self._k if option == DEFER else option

    def _production(self) -> tuple[int, float]:
        sim = self.simulator
        dist = production_distribution(sim, self._job)
        option = sample(dist, production_uniform(sim, self._job))
        probs, defer = dist
        return option, defer if option == DEFER else float(probs[option])

    @property
    def episode_key(self) -> tuple[int, int]:
        """(seed, episode) of the running episode, as `new_episode` and `log_episode` take them."""
        return (self._episode_seed, 0)

    @property
    def simulator(self) -> Simulator:
        """The running simulator (for forks and inspection)."""
        if self._sim is None:
            raise RuntimeError("call reset() first")
        return self._sim

    # ------------------------------------------------------------- helpers
    def _reward(self, outcomes: tuple[Outcome, ...]) -> float:
        if not outcomes:
            return 0.0
        cols = {
            "queue_delay_s": np.array([o.queue_delay_s for o in outcomes], dtype=np.float64),
            "throughput": np.array([o.throughput for o in outcomes], dtype=np.float64),
            "completion_time_s": np.array(
                [o.completion_time_s for o in outcomes], dtype=np.float64
            ),
            "slo_met": np.array([o.slo_met for o in outcomes], dtype=np.float64),
        }
        return float(self.world.scenario.reward.evaluate(cols).sum())

    def _observe(self, done: bool) -> Obs:
        w, sim, k = self.world, self._sim, self._k
        assert sim is not None
        nodes = np.zeros((w.n_nodes, NODE_FEATURES), np.float32)
        workload = np.zeros(WORKLOAD_FEATURES, np.float32)
        options = np.zeros((k, N_FEATURES), np.float32)
        mask = np.zeros(k + 1, np.int8)
        mask[k] = 1
        self._request = self._feasibility = None
        if not done:
            j = self._job = sim.state.queue[0]
            req = contract_request(sim, j, self._prefix)
            feas = check_feasibility(req.state, req.workload, req.options)
            self._request, self._feasibility = req, feas
            s = req.state
            hw = [s.hardware_of(i) for i in range(s.n_nodes)]
            nodes[:, 0] = s.accelerators_free / np.maximum(s.accelerators_total, 1)
            nodes[:, 1] = s.utilisation
            nodes[:, 2] = s.draining
            # an unknown capability (None, e.g. a partition's interconnect) reads 0 here
            nodes[:, 3] = [np.log1p(h.peak_dense_tflops or 0.0) / np.log1p(1000.0) for h in hw]
            nodes[:, 4] = [(h.accelerator_memory_gb or 0.0) / 80.0 for h in hw]
            nodes[:, 5] = [(h.interconnect_gbps or 0.0) / 900.0 for h in hw]
            nodes[:, 6] = s.healthy
            waiting = int((sim.state.status == 1).sum())
            workload[:] = [
                np.log2(1.0 + req.workload.accelerators)
                if not req.workload.is_share
                else float(req.workload.accelerator_share or 0.0),
                np.log1p(req.workload.slo_seconds or 0.0) / 12.0,
                np.log1p(req.workload.work_units or 0.0) / 12.0,
                np.log1p(waiting),
            ]
            n = req.options.n_options
            options[:n] = DEFAULT_FEATURES(req.state, req.workload, req.options)
            mask[:n] = feas.mask
        return {
            "nodes": np.clip(nodes, 0.0, 10.0),
            "workload": np.clip(workload, 0.0, FEATURE_BOUND),
            "options": np.clip(options, -FEATURE_BOUND, FEATURE_BOUND),
            "action_mask": mask,
        }

    def _info(
        self,
        obs: Obs,
        cost: float,
        signals: NDArray[np.bool_],
        invalid: bool,
        outcomes: tuple[Outcome, ...],
    ) -> dict[str, Any]:
        sim = self._sim
        assert sim is not None
        return {
            "action_mask": obs["action_mask"].copy(),
            "cost": cost,
            "constraint_signals": np.array(signals, dtype=bool),
            "invalid_action": invalid,
            "time_s": float(sim.state.time),
            "outcomes": outcomes,
        }


def register_envs() -> None:
    """Register `ENV_ID` with Gymnasium (idempotent): ``gymnasium.make(ENV_ID, scenario=...)``."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="service.environment.env:ClusterEnv")


register_envs()
