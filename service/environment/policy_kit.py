"""Small pieces shared by the simulator's own policies: distributions, sampling, assembly.

Every distribution is over one request's options plus `DEFER`: ``probs`` of
shape ``(n_options,)`` (zero on masked options) and a scalar defer
probability; they sum to 1. A request with no feasible option defers with
probability 1.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from service.contract import DEFER, MirrorRequest
from service.policies.base import DecisionStatus, PolicyDecisions, ScoringBatch

Distribution = tuple[NDArray[np.float64], float]
"""(option probabilities ``(n_options,)``, defer probability)."""

TIE_TOLERANCE = 1e-9


def greedy(
    scores: NDArray[np.float64], mask: NDArray[np.bool_], epsilon: float = 0.0
) -> Distribution:
    """(1 - epsilon) split evenly over the best feasible scores, epsilon uniform over feasible."""
    n = len(scores)
    if not mask.any():
        return np.zeros(n), 1.0
    best = np.max(scores[mask])
    top = mask & (scores >= best - TIE_TOLERANCE)
    probs = (1.0 - epsilon) * top / top.sum() + epsilon * mask / mask.sum()
    return probs.astype(np.float64), 0.0


def first_best(scores: NDArray[np.float64], mask: NDArray[np.bool_]) -> Distribution:
    """All mass on the lowest-index best feasible option (a deterministic policy)."""
    probs = np.zeros(len(scores))
    if not mask.any():
        return probs, 1.0
    best = np.max(scores[mask])
    probs[int(np.flatnonzero(mask & (scores >= best - TIE_TOLERANCE))[0])] = 1.0
    return probs, 0.0


def softmax(
    scores: NDArray[np.float64], mask: NDArray[np.bool_], temperature: float
) -> Distribution:
    """``p_i ∝ exp(score_i / temperature)`` over feasible options."""
    probs = np.zeros(len(scores))
    if not mask.any():
        return probs, 1.0
    z = scores[mask] / temperature
    e = np.exp(z - z.max())
    probs[mask] = e / e.sum()
    return probs, 0.0


def sample(dist: Distribution, u: float) -> int:
    """Inverse-CDF draw with uniform `u` over ``[options..., DEFER]``: option index or `DEFER`."""
    probs, defer = dist
    cum = np.cumsum(np.append(probs, defer))
    i = int(np.searchsorted(cum, u * cum[-1], side="right"))  # skips zero-mass entries
    if i < len(probs):
        return i
    if defer > 0.0:
        return DEFER
    return int(np.flatnonzero(probs > 0.0)[-1])  # rounding at the top end, no defer mass


def assemble(
    batch: ScoringBatch,
    rng: np.random.Generator,
    score_fn: Callable[
        [MirrorRequest, NDArray[np.float32], NDArray[np.bool_]], NDArray[np.float64]
    ],
    dist_fn: Callable[[NDArray[np.float64], NDArray[np.bool_], MirrorRequest], Distribution],
) -> PolicyDecisions:
    """Run `score_fn` and `dist_fn` per request of `batch` and pack `PolicyDecisions`.

    One uniform per request is drawn from `rng`, in request order, so the same
    batch and seed give the same decisions.
    """
    n_rows = len(batch.mask)
    scores = np.full(n_rows, np.nan, dtype=np.float32)
    probs = np.zeros(n_rows)
    defer = np.zeros(batch.n_requests)
    chosen = np.full(batch.n_requests, DEFER, dtype=np.int64)
    raw_bad = np.zeros(batch.n_requests, dtype=bool)
    status: list[DecisionStatus] = []
    u = rng.random(batch.n_requests)
    for r in range(batch.n_requests):
        lo, hi = int(batch.offsets[r]), int(batch.offsets[r + 1])
        mask = np.asarray(batch.mask[lo:hi], dtype=bool)
        s = score_fn(batch.requests[r], batch.features[lo:hi], mask)
        dist = dist_fn(s, mask, batch.requests[r])
        scores[lo:hi] = s
        probs[lo:hi], defer[r] = dist
        chosen[r] = sample(dist, float(u[r]))
        raw_bad[r] = hi > lo and not bool(mask[int(np.argmax(s))])
        status.append(DecisionStatus.OK if mask.any() else DecisionStatus.ALL_INFEASIBLE)
    return PolicyDecisions(
        scores=scores,
        probabilities=probs,
        defer_probability=defer,
        chosen=chosen,
        raw_favourite_infeasible=raw_bad,
        status=tuple(status),
    )
