"""Logged datasets as arrays, fast enough for thousands of replications.

Shapes: ``n`` logged decisions, ``K`` = the scenario's most options per
request (padding beyond a request's own ``n_options``), ``A = K + 1`` action
columns with **column K = DEFER**, ``M`` Monte Carlo worlds, ``F`` =
``N_FEATURES``, ``S`` = ``len(SIGNALS)``, ``R`` replications.

`ContextPool` holds production's logged contexts and, for every action, the
outcomes of forked rollouts (`service.environment.truth`). From it:

- `ContextPool.logged` — the dataset production actually logged (rewards as
  they happened in world 0; ``q`` is the Monte Carlo truth, with error);
- `ContextPool.sample` — ``R`` replications at once: contexts fixed, actions
  redrawn from production's propensities and each reward drawn from the ``M``
  stored rollouts of that (decision, action). For these the per-decision
  truth ``q`` is *exact* (it is the mean of the distribution sampled from),
  so estimator tests see no truth error; it differs from the simulator's own
  truth only by the Monte Carlo error reported as ``q_se``. Rounds are
  conditionally independent given the contexts (a bandit view of the logs).
- `ContextPool.truth` — the per-decision value of any target, given as a
  `Policy` or as an ``(n, A)`` action-probability array.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.contract import DEFER, SIGNALS, CostSpec, MirrorRequest, RewardSpec
from service.contract.features import N_FEATURES
from service.environment.episode import OUTCOME_FIELDS
from service.environment.recording import EpisodeLog, log_episode
from service.environment.truth import Estimate, counterfactual_outcomes, mc_worlds
from service.environment.world import World
from service.policies.base import Policy, ScoringBatch


@dataclass(frozen=True, eq=False)
class Truth:
    """A target's per-decision truth on a dataset's contexts.

    Attributes:
        per_decision: ``(n,)``, ``sum_a pi(a|x_t) q(t, a)``.
        per_decision_se: ``(n,)``, Monte Carlo standard error of each.
        value: their mean; ``se`` is the Monte Carlo error of the mean.
    """

    per_decision: NDArray[np.float64]
    per_decision_se: NDArray[np.float64]
    value: Estimate


@dataclass(frozen=True, eq=False)
class LoggedDataset:
    """One logged dataset; see the module docstring for shapes.

    Attributes:
        features: float32 ``(n, K, F)``, zero padding beyond ``n_options``.
        n_options: int64 ``(n,)``.
        mask: bool ``(n, A)``, feasible actions (DEFER always).
        action: int64 ``(n,)``, production's action column.
        propensity: float64 ``(n,)``, production's probability of `action`.
        logging_probabilities: float64 ``(n, A)``, production's full distribution.
        reward: float64 ``(n,)``.
        cost: float64 ``(n,)``, `CostSpec` over the signals of the action taken.
        q: float64 ``(n, A)``, expected reward of each action (NaN: infeasible).
        q_se: float64 ``(n, A)``, Monte Carlo error of `q`.
        episode: int64 ``(n,)``, the episode each decision came from.
        requests: the mirrored requests, for policies that read raw state.
    """

    features: NDArray[np.float32]
    n_options: NDArray[np.int64]
    mask: NDArray[np.bool_]
    action: NDArray[np.int64]
    propensity: NDArray[np.float64]
    logging_probabilities: NDArray[np.float64]
    reward: NDArray[np.float64]
    cost: NDArray[np.float64]
    q: NDArray[np.float64]
    q_se: NDArray[np.float64]
    episode: NDArray[np.int64]
    requests: tuple[MirrorRequest, ...]

    @property
    def n(self) -> int:
        """Logged decisions."""
        return len(self.action)

    def truth(self, target: Policy | NDArray[np.float64]) -> Truth:
        """Per-decision value of `target` on these contexts."""
        probs = target_probabilities(
            self.features, self.n_options, self.mask, self.requests, target
        )
        return _truth(probs, self.q, self.q_se)


@dataclass(frozen=True, eq=False)
class Replicates:
    """``R`` replications over one pool's contexts: arrays of shape ``(R, n)``."""

    action: NDArray[np.int64]
    propensity: NDArray[np.float64]
    reward: NDArray[np.float64]
    cost: NDArray[np.float64]


def _pad_rows(rows: Sequence[NDArray[np.float64]], width: int, fill: float) -> NDArray[np.float64]:
    out = np.full((len(rows), width), fill)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def target_probabilities(
    features: NDArray[np.float32],
    n_options: NDArray[np.int64],
    mask: NDArray[np.bool_],
    requests: Sequence[MirrorRequest],
    target: Policy | NDArray[np.float64],
) -> NDArray[np.float64]:
    """`target`'s action distribution, shape ``(n, A)``, checked against `mask`."""
    n, a = mask.shape
    if isinstance(target, np.ndarray):
        probs = np.asarray(target, dtype=np.float64)
        if probs.shape != (n, a):
            raise ValueError(f"`action_dist` must have shape ({n}, {a}), got {probs.shape}")
    else:
        rows = [features[t, : n_options[t]] for t in range(n)]
        batch = ScoringBatch(
            features=np.concatenate(rows) if rows else np.zeros((0, N_FEATURES), np.float32),
            offsets=np.concatenate([[0], np.cumsum(n_options)]).astype(np.int64),
            mask=np.concatenate([mask[t, : n_options[t]] for t in range(n)])
            if n
            else np.zeros(0, bool),
            requests=tuple(requests),
        )
        d = target.decide(batch, np.random.default_rng(0))
        split = np.split(d.probabilities, batch.offsets[1:-1])
        probs = _pad_rows(split, a, 0.0)
        probs[:, a - 1] = d.defer_probability
    if np.any(probs < 0) or not np.allclose(probs.sum(axis=1), 1.0, atol=1e-6):
        raise ValueError("`action_dist` rows must be non-negative and sum to 1")
    if np.any(probs[~mask] > 0):
        t = int(np.flatnonzero((probs * ~mask).sum(axis=1) > 0)[0])
        raise ValueError(f"`action_dist` puts probability on an infeasible action in decision {t}")
    return probs


def _truth(probs: NDArray[np.float64], q: NDArray[np.float64], q_se: NDArray[np.float64]) -> Truth:
    on = probs > 0
    per = np.where(on, probs * np.nan_to_num(q), 0.0).sum(axis=1)
    se = np.sqrt(np.where(on, (probs * np.nan_to_num(q_se)) ** 2, 0.0).sum(axis=1))
    mc = float(np.sqrt(np.sum(se**2)) / len(per)) if len(per) else math.inf
    return Truth(per, se, Estimate(float(per.mean()) if len(per) else math.nan, mc, len(per)))


@dataclass(frozen=True, eq=False)
class ContextPool:
    """Production's logged contexts with every action's counterfactual outcomes.

    Attributes (shapes in the module docstring):
        requests: ``(n,)`` mirrored requests (production's decision on them).
        episode, job: int64 ``(n,)``.
        features: float32 ``(n, K, F)``; n_options: int64 ``(n,)``.
        mask: bool ``(n, A)``; violations: bool ``(n, A, S)`` (DEFER: none).
        logging_probabilities: float64 ``(n, A)``; logged_action: int64 ``(n,)``.
        logged_outcomes: float64 ``(n, len(OUTCOME_FIELDS))``, world 0.
        outcomes: float64 ``(n, A, M, len(OUTCOME_FIELDS))``, NaN where infeasible.
    """

    scenario: str
    reward_spec: RewardSpec
    cost_spec: CostSpec
    requests: tuple[MirrorRequest, ...]
    episode: NDArray[np.int64]
    job: NDArray[np.int64]
    features: NDArray[np.float32]
    n_options: NDArray[np.int64]
    mask: NDArray[np.bool_]
    violations: NDArray[np.bool_]
    logging_probabilities: NDArray[np.float64]
    logged_action: NDArray[np.int64]
    logged_outcomes: NDArray[np.float64]
    outcomes: NDArray[np.float64]

    @property
    def n(self) -> int:
        """Logged decisions."""
        return len(self.episode)

    @property
    def defer_column(self) -> int:
        """The action column of `DEFER` (``K``)."""
        return int(self.mask.shape[1]) - 1

    def _columns(self, values: NDArray[np.float64]) -> dict[str, NDArray[np.float64]]:
        return {f: values[..., i].reshape(-1) for i, f in enumerate(OUTCOME_FIELDS)}

    def reward_table(self, spec: RewardSpec | None = None) -> NDArray[np.float64]:
        """Reward of every rollout, shape ``(n, A, M)``, NaN where infeasible."""
        s = spec or self.reward_spec
        return s.evaluate(self._columns(self.outcomes)).reshape(self.outcomes.shape[:3])

    def cost_table(self, spec: CostSpec | None = None) -> NDArray[np.float64]:
        """Cost of every action, shape ``(n, A)`` (signals only: no failures are modelled)."""
        s = spec or self.cost_spec
        v = self.violations.reshape(-1, len(SIGNALS))
        return s.evaluate(v, ["none"] * len(v)).reshape(self.mask.shape)

    def q(self, spec: RewardSpec | None = None) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Expected reward per action and its Monte Carlo error, each ``(n, A)``."""
        r = self.reward_table(spec)
        m = r.shape[2]
        with np.errstate(invalid="ignore"):
            se = r.std(axis=2, ddof=1) / math.sqrt(m) if m > 1 else np.full(r.shape[:2], np.inf)
        return r.mean(axis=2), np.where(self.mask, se, np.nan)

    def truth(self, target: Policy | NDArray[np.float64], spec: RewardSpec | None = None) -> Truth:
        """Per-decision counterfactual value of `target` on the logged contexts."""
        probs = target_probabilities(
            self.features, self.n_options, self.mask, self.requests, target
        )
        q, q_se = self.q(spec)
        return _truth(probs, q, q_se)

    def logged(self, spec: RewardSpec | None = None) -> LoggedDataset:
        """The dataset production actually logged (world-0 rewards)."""
        s = spec or self.reward_spec
        reward = s.evaluate(self._columns(self.logged_outcomes))
        return self._dataset(self.logged_action, reward, spec)

    def replicate(self, rng: np.random.Generator, spec: RewardSpec | None = None) -> LoggedDataset:
        """One fresh replication as a `LoggedDataset` (contexts shared, not copied)."""
        rep = self.sample(rng, 1, spec)
        return self._dataset(rep.action[0], rep.reward[0], spec)

    def _dataset(
        self, action: NDArray[np.int64], reward: NDArray[np.float64], spec: RewardSpec | None
    ) -> LoggedDataset:
        rows = np.arange(self.n)
        q, q_se = self.q(spec)
        return LoggedDataset(
            features=self.features,
            n_options=self.n_options,
            mask=self.mask,
            action=action,
            propensity=self.logging_probabilities[rows, action],
            logging_probabilities=self.logging_probabilities,
            reward=reward,
            cost=self.cost_table()[rows, action],
            q=q,
            q_se=q_se,
            episode=self.episode,
            requests=self.requests,
        )

    def sample(
        self, rng: np.random.Generator, n_replications: int, spec: RewardSpec | None = None
    ) -> Replicates:
        """`n_replications` datasets at once, vectorised; arrays of shape ``(R, n)``."""
        cum = np.cumsum(self.logging_probabilities, axis=1)
        u = rng.random((n_replications, self.n)) * cum[:, -1]
        action = (cum[None, :, :] <= u[:, :, None]).sum(axis=2).astype(np.int64)
        table = self.reward_table(spec)
        m = rng.integers(0, table.shape[2], size=action.shape)
        rows = np.broadcast_to(np.arange(self.n), action.shape)
        return Replicates(
            action=action,
            propensity=self.logging_probabilities[rows, action],
            reward=table[rows, action, m],
            cost=self.cost_table()[rows, action],
        )


def build_pool(
    world: World,
    seed: int,
    n_episodes: int,
    n_worlds: int = 4,
    logs: Sequence[EpisodeLog] | None = None,
) -> ContextPool:
    """Log `n_episodes` production episodes and fork every decision into every action x world."""
    if n_worlds < 2:
        raise ValueError(f"`n_worlds` must be >= 2 for a Monte Carlo error, got {n_worlds}")
    logs = (
        list(logs) if logs is not None else [log_episode(world, seed, e) for e in range(n_episodes)]
    )
    k = world.max_options
    a = k + 1
    reqs: list[MirrorRequest] = []
    episode, job, n_opt, actions = [], [], [], []
    feats, masks, viols, probs, logged, outs = [], [], [], [], [], []
    for log in logs:
        worlds = mc_worlds(world, log.final.jobs.n, log.seed, log.episode, n_worlds)
        done = log.job_outcomes()
        where = {int(j): i for i, j in enumerate(done.job)}
        for d in log.decisions:
            n = len(d.mask)
            reqs.append(d.request)
            episode.append(log.episode)
            job.append(d.job)
            n_opt.append(n)
            actions.append(k if d.chosen == DEFER else d.chosen)
            f = np.zeros((k, d.features.shape[1]), np.float32)
            f[:n] = d.features
            feats.append(f)
            mk = np.zeros(a, bool)
            mk[:n], mk[k] = d.mask, True
            masks.append(mk)
            v = np.zeros((a, len(SIGNALS)), bool)
            v[:n] = d.violations
            viols.append(v)
            p = np.zeros(a)
            p[:n], p[k] = d.probabilities, d.defer_probability
            probs.append(p)
            i = where[d.job]
            logged.append([float(getattr(done, fld)[i]) for fld in OUTCOME_FIELDS])
            outs.append(counterfactual_outcomes(d, worlds, a))
    return ContextPool(
        scenario=world.scenario.name,
        reward_spec=world.scenario.reward,
        cost_spec=world.scenario.cost,
        requests=tuple(reqs),
        episode=np.asarray(episode, dtype=np.int64),
        job=np.asarray(job, dtype=np.int64),
        features=np.stack(feats) if feats else np.zeros((0, k, N_FEATURES), np.float32),
        n_options=np.asarray(n_opt, dtype=np.int64),
        mask=np.stack(masks) if masks else np.zeros((0, a), bool),
        violations=np.stack(viols) if viols else np.zeros((0, a, len(SIGNALS)), bool),
        logging_probabilities=np.stack(probs) if probs else np.zeros((0, a)),
        logged_action=np.asarray(actions, dtype=np.int64),
        logged_outcomes=np.asarray(logged).reshape(-1, len(OUTCOME_FIELDS)),
        outcomes=np.stack(outs) if outs else np.zeros((0, a, n_worlds, len(OUTCOME_FIELDS))),
    )
