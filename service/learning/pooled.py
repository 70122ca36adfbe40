"""A policy's decisions on a `ContextPool`'s logged contexts, as an ``(n, A)`` action distribution.

`ContextPool.truth` accepts a `Policy` directly, but it requires every row to
be a proper distribution; a candidate that fails on a batch (status
``error``) puts no mass anywhere. The service treats such a decision as "no
action" — the request is not placed by that candidate — so here an errored
row becomes `DEFER` with probability 1 and is counted, instead of aborting
the whole evaluation. Policies run through `decide_isolated`, the same fence
the scorer uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.environment import ContextPool
from service.policies.base import DecisionStatus, Policy, PolicyDecisions, ScoringBatch
from service.policies.runner import decide_isolated


def pool_batch(pool: ContextPool) -> ScoringBatch:
    """Every logged decision of `pool` as one scoring batch (padding dropped)."""
    n_opt = pool.n_options
    return ScoringBatch(
        features=np.concatenate([pool.features[t, : n_opt[t]] for t in range(pool.n)]),
        offsets=np.concatenate([[0], np.cumsum(n_opt)]).astype(np.int64),
        mask=np.concatenate([pool.mask[t, : n_opt[t]] for t in range(pool.n)]),
        requests=pool.requests,
    )


@dataclass(frozen=True, eq=False)
class PooledDecisions:
    """A policy on a pool: its distribution and what went wrong.

    Attributes:
        action_dist: float64 ``(n, A)``; column ``A - 1`` is `DEFER`.
        errors: requests whose status was ``error`` or ``timeout`` (counted as defers).
        raw_favourite_infeasible: requests whose top raw score sat on a masked option.
        chosen: ``(n,)`` action column each request's sampled choice maps to.
    """

    action_dist: NDArray[np.float64]
    errors: int
    raw_favourite_infeasible: int
    chosen: NDArray[np.int64]


def action_distribution(
    d: PolicyDecisions, batch: ScoringBatch, n_columns: int
) -> tuple[NDArray[np.float64], NDArray[np.int64], int]:
    """(``(n, n_columns)`` distribution, chosen column ``(n,)``, errored requests)."""
    n = batch.n_requests
    out = np.zeros((n, n_columns))
    chosen = np.full(n, n_columns - 1, dtype=np.int64)
    errors = 0
    for r in range(n):
        lo, hi = int(batch.offsets[r]), int(batch.offsets[r + 1])
        if d.status[r] in (DecisionStatus.ERROR, DecisionStatus.TIMEOUT):
            errors += 1
            out[r, -1] = 1.0
            continue
        out[r, : hi - lo] = d.probabilities[lo:hi]
        out[r, -1] = d.defer_probability[r]
        if d.chosen[r] >= 0:
            chosen[r] = int(d.chosen[r])
    return out, chosen, errors


def decide_on_pool(policy: Policy, pool: ContextPool, seed: int = 0) -> PooledDecisions:
    """`policy` on every logged context of `pool`, isolated, with a seeded generator."""
    batch = pool_batch(pool)
    run = decide_isolated(policy, batch, np.random.default_rng(seed))
    dist, chosen, errors = action_distribution(run.decisions, batch, pool.mask.shape[1])
    return PooledDecisions(
        action_dist=dist,
        errors=errors,
        raw_favourite_infeasible=int(run.decisions.raw_favourite_infeasible.sum()),
        chosen=chosen,
    )
