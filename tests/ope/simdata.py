"""Logged datasets from the simulator for the OPE tests, replicated cheaply.

A `ContextPool` (service.environment) holds production's logged decisions with
every action's forked outcomes. `draw` makes ``R`` datasets of ``N`` rounds at
once: contexts drawn i.i.d. from the pool's decisions, actions from
production's logged distribution, each reward one of the stored rollouts of
that (decision, action) — the same sampling as `ContextPool.sample`, except
that contexts are drawn too. So the rounds are i.i.d., the setting the
intervals and sequences assume, and the estimand is exactly the pool's
per-decision truth ``1/n sum_t sum_a pi(a|x_t) q(t, a)`` (`ContextPool.truth`),
with no truth error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.contract import RewardSpec
from service.environment import ContextPool
from service.ope import BanditData


@dataclass(frozen=True, eq=False)
class Draws:
    """``R`` datasets of ``N`` rounds: arrays of shape ``(R, N)``."""

    context: NDArray[np.int64]
    action: NDArray[np.int64]
    pscore: NDArray[np.float64]
    reward: NDArray[np.float64]

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.action.shape[0]), int(self.action.shape[1]))


def draw(
    pool: ContextPool,
    rng: np.random.Generator,
    replications: int,
    rounds: int,
    spec: RewardSpec | None = None,
) -> Draws:
    """``replications`` i.i.d. datasets of ``rounds`` rounds (see the module docstring)."""
    table = pool.reward_table(spec)
    cum = np.cumsum(pool.logging_probabilities, axis=1)
    last = pool.mask.shape[1] - 1
    ctx = rng.integers(0, pool.n, size=(replications, rounds))
    u = rng.random((replications, rounds)) * cum[ctx, -1]
    action = np.zeros((replications, rounds), dtype=np.int64)
    for a in range(last):  # inverse CDF, column by column to keep memory small
        action += cum[ctx, a] <= u
    action = np.minimum(action, last)
    world = rng.integers(0, table.shape[2], size=ctx.shape)
    reward = table[ctx, action, world]
    assert np.isfinite(reward).all()
    return Draws(ctx, action, pool.logging_probabilities[ctx, action], reward)


def dataset(
    pool: ContextPool,
    draws: Draws,
    i: int,
    target: NDArray[np.float64],
    model: NDArray[np.float64] | None = None,
    *,
    full_logging: bool = True,
) -> BanditData:
    """Replication `i` of `draws` as `BanditData` for `target` (``(n_pool, A)``)."""
    ctx = draws.context[i]
    return BanditData(
        reward=draws.reward[i],
        action=draws.action[i],
        pscore=draws.pscore[i],
        action_dist=target[ctx],
        estimated_rewards=None if model is None else model[ctx],
        feasible=pool.mask[ctx],
        logging_dist=pool.logging_probabilities[ctx] if full_logging else None,
    )


def cluster_utilisation(pool: ContextPool) -> float:
    """Mean over logged decisions of busy accelerators / all accelerators at decision time."""
    u = [
        float(
            (r.state.utilisation * r.state.accelerators_total).sum()
            / r.state.accelerators_total.sum()
        )
        for r in pool.requests
    ]
    return float(np.mean(u))


def linear_model(pool: ContextPool, draws: Draws, i: int) -> NDArray[np.float64]:
    """A deliberately misspecified reward model: least squares, linear in the option features.

    Fitted on replication `i` (keep it out of the evaluation replications);
    DEFER gets its own intercept; predictions are clipped to the range of the
    outcomes it was fitted on. Returns ``q_hat``, shape ``(n_pool, A)``.
    """
    n, k, f = pool.features.shape
    a = k + 1
    x = np.zeros((n, a, f + 2))
    x[:, :k, :f] = pool.features
    x[:, :k, f] = 1.0  # option intercept
    x[:, k, f + 1] = 1.0  # defer intercept
    rows = x[draws.context[i], draws.action[i]]
    y = draws.reward[i]
    beta, *_ = np.linalg.lstsq(rows, y, rcond=None)
    q_hat: NDArray[np.float64] = np.clip(x @ beta, y.min(), y.max())
    return q_hat


def exact_model(pool: ContextPool, spec: RewardSpec | None = None) -> NDArray[np.float64]:
    """The true ``q`` as a reward model (0 where infeasible)."""
    q, _ = pool.q(spec)
    return np.nan_to_num(q)
