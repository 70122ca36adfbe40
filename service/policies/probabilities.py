"""From raw scores to action probabilities, vectorised over a CSR batch.

Every policy, ONNX or baseline, ends here, so the invariants that
`check_policy` verifies hold by construction: probability zero on infeasible
options, options plus defer summing to one per request, one sampled action
per request from the caller's generator.

Rules (the manifest's ``probabilities.rule``), over the *candidates* of a
request — its feasible options, plus `DEFER` when ``defer_score`` is set:

- ``softmax``: ``p_i ∝ exp(s_i / T)``; the defer candidate scores ``defer_score``.
- ``argmax``: all mass on the best candidate; ties go to the earliest option
  (Runtime's order), and an option beats defer on a tie.
- ``epsilon_greedy``: ``1 - ε`` on the argmax candidate, ``ε`` spread evenly
  over all candidates (so every candidate keeps support for off-policy use).
- ``uniform``: evenly over candidates; scores are ignored.

A request without candidates defers with probability 1 and gets status
``ALL_INFEASIBLE``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray

from service.contract import DEFER
from service.policies.base import DecisionStatus, PolicyDecisions, ScoringBatch
from service.policies.errors import PolicyScoringError


class RuleKind(StrEnum):
    """How scores become probabilities."""

    SOFTMAX = "softmax"
    ARGMAX = "argmax"
    EPSILON_GREEDY = "epsilon_greedy"
    UNIFORM = "uniform"


@dataclass(frozen=True, slots=True)
class ProbabilityRule:
    """A rule and its parameters; see the module docstring for the formulas.

    Raises `ValueError` naming the field when a parameter is out of range.
    """

    kind: RuleKind = RuleKind.ARGMAX
    temperature: float = 1.0
    epsilon: float = 0.0
    defer_score: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"`temperature` must be finite and > 0, got {self.temperature}")
        if not (math.isfinite(self.epsilon) and 0.0 <= self.epsilon <= 1.0):
            raise ValueError(f"`epsilon` must be in [0, 1], got {self.epsilon}")
        if self.defer_score is not None and not math.isfinite(self.defer_score):
            raise ValueError(f"`defer_score` must be finite or null, got {self.defer_score}")


def segment_reduce(
    ufunc: np.ufunc, values: NDArray[np.float64], offsets: NDArray[np.int64], empty: float
) -> NDArray[np.float64]:
    """``ufunc.reduce`` over every CSR segment; `empty` for segments with no rows."""
    counts = np.diff(offsets)
    out = np.full(len(counts), empty, dtype=np.float64)
    nonempty = counts > 0
    if nonempty.any():
        out[nonempty] = ufunc.reduceat(values, offsets[:-1][nonempty])
    return out


def first_argmax(
    values: NDArray[np.float64], offsets: NDArray[np.int64], eligible: NDArray[np.bool_]
) -> NDArray[np.int64]:
    """Batch row of the first maximum among `eligible` rows per segment; -1 if none.

    Non-finite values never win.
    """
    ok = eligible & np.isfinite(values)
    masked = np.where(ok, values, -np.inf)
    best = segment_reduce(np.maximum, masked, offsets, -np.inf)
    request = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    hit = ok & (masked == best[request])
    rows = np.where(hit, np.arange(len(values), dtype=np.float64), np.inf)
    first = segment_reduce(np.minimum, rows, offsets, np.inf)
    return np.where(np.isfinite(first), first, -1).astype(np.int64)


def _sample(
    probs: NDArray[np.float64],
    defer_p: NDArray[np.float64],
    offsets: NDArray[np.int64],
    rng: np.random.Generator,
) -> NDArray[np.int64]:
    """One draw per request: an option's batch row, or -1 for defer.

    One uniform per request in batch order, so a seed fixes every choice.
    Inverse CDF over the request's options, defer last.
    """
    n_req = len(offsets) - 1
    u = rng.random(n_req)
    cum = np.cumsum(probs)
    base = np.concatenate([[0.0], cum])[offsets[:-1]]
    option_mass = 1.0 - defer_p
    target = base + u
    rows = np.searchsorted(cum, target, side="right").astype(np.int64)
    chosen = np.full(n_req, -1, dtype=np.int64)
    for r in range(n_req):
        start, end = int(offsets[r]), int(offsets[r + 1])
        if u[r] >= option_mass[r] or end == start:
            continue
        row = int(rows[r])
        if not start <= row < end or probs[row] <= 0.0:
            # Rounding at the segment edge: fall back to the last supported option.
            support = np.flatnonzero(probs[start:end] > 0.0)
            row = start + int(support[-1]) if len(support) else -1
        chosen[r] = row
    return chosen


def decide_from_scores(
    policy: str,
    scores: NDArray[np.float32],
    batch: ScoringBatch,
    rule: ProbabilityRule,
    rng: np.random.Generator,
    predictions: dict[str, NDArray[np.float32]] | None = None,
) -> PolicyDecisions:
    """Turn per-row `scores` into `PolicyDecisions` under `rule`.

    Args:
        policy: name used in errors.
        scores: float32, shape ``(n_options_total,)``; NaN means "no score"
            (allowed only with the ``uniform`` rule).
        batch: the batch the scores belong to.
        rule: how scores become probabilities.
        rng: consumed once per request by stochastic rules, not at all by ``argmax``.
        predictions: passed through to the decisions.

    Raises:
        PolicyScoringError: a feasible option has a non-finite score under a
            rule that reads scores, or `scores` has the wrong shape.
    """
    offsets, mask = batch.offsets, batch.mask
    n_rows, n_req = len(mask), batch.n_requests
    if scores.shape != (n_rows,):
        raise PolicyScoringError(
            policy, f"`scores` must have shape ({n_rows},), got {scores.shape}"
        )
    s = scores.astype(np.float64)
    reads_scores = rule.kind is not RuleKind.UNIFORM
    if reads_scores and not np.isfinite(s[mask]).all():
        row = int(np.flatnonzero(mask & ~np.isfinite(s))[0])
        raise PolicyScoringError(policy, f"`scores[{row}]` is {s[row]} on a feasible option")
    request = batch.request_of_row
    favourite = first_argmax(s, offsets, np.ones(n_rows, dtype=bool))
    padded_mask = np.append(mask, True)  # index -1 (no favourite) reads True
    n_feasible = segment_reduce(np.add, mask.astype(np.float64), offsets, 0.0)
    # Only a choice that mattered counts: with no feasible option every favourite is
    # masked, and counting those would drown the reliability signal in forced defers.
    raw_fav_infeasible = ~padded_mask[favourite] & (n_feasible > 0)
    has_defer = rule.defer_score is not None
    n_cand = n_feasible + (1.0 if has_defer else 0.0)
    defer_s = rule.defer_score if rule.defer_score is not None else -np.inf
    best_row = first_argmax(s, offsets, mask) if reads_scores else np.full(n_req, -1, np.int64)
    best_s = np.append(s, -np.inf)[best_row]  # -inf where no feasible option
    greedy_defer = (best_row < 0) | (has_defer & (defer_s > best_s))

    probs = np.zeros(n_rows, dtype=np.float64)
    defer_p = np.zeros(n_req, dtype=np.float64)
    if rule.kind is RuleKind.SOFTMAX:
        top = np.maximum(best_s, defer_s) / rule.temperature
        top = np.where(np.isfinite(top), top, 0.0)
        e = np.exp(np.where(mask, s / rule.temperature - top[request], -np.inf))
        e_defer = np.exp(defer_s / rule.temperature - top) if has_defer else np.zeros(n_req)
        denom = segment_reduce(np.add, e, offsets, 0.0) + e_defer
        safe = np.where(denom > 0, denom, 1.0)
        probs = e / safe[request]
        defer_p = e_defer / safe
    else:
        eps = rule.epsilon if rule.kind is RuleKind.EPSILON_GREEDY else 0.0
        if rule.kind is RuleKind.UNIFORM:
            eps = 1.0
        share = np.where(n_cand > 0, eps / np.maximum(n_cand, 1.0), 0.0)
        probs = np.where(mask, share[request], 0.0)
        defer_p = share if has_defer else np.zeros(n_req)
        greedy = (1.0 - eps) * (n_cand > 0)
        opt_greedy = ~greedy_defer & (best_row >= 0)
        probs[best_row[opt_greedy]] += greedy[opt_greedy]
        defer_p = defer_p + np.where(greedy_defer & has_defer, greedy, 0.0)
    no_candidates = n_cand == 0
    defer_p[no_candidates] = 1.0

    if rule.kind is RuleKind.ARGMAX:
        chosen_row = np.where(greedy_defer, -1, best_row)
    else:
        chosen_row = _sample(probs, defer_p, offsets, rng)
    chosen = np.where(chosen_row >= 0, chosen_row - offsets[:-1], DEFER).astype(np.int64)
    status = tuple(
        DecisionStatus.ALL_INFEASIBLE if n_feasible[r] == 0 else DecisionStatus.OK
        for r in range(n_req)
    )
    return PolicyDecisions(
        scores=scores.astype(np.float32, copy=False),
        probabilities=probs,
        defer_probability=defer_p,
        chosen=chosen,
        raw_favourite_infeasible=np.asarray(raw_fav_infeasible, dtype=bool),
        status=status,
        predictions=predictions,
    )


def error_decisions(batch: ScoringBatch, status: DecisionStatus) -> PolicyDecisions:
    """Decisions that carry no decision: every request `status`, no mass anywhere.

    Consumers must filter on status; probabilities are all zero (they do not
    sum to one) precisely so that no estimator can mistake them for a defer.
    """
    n_rows, n_req = len(batch.mask), batch.n_requests
    return PolicyDecisions(
        scores=np.full(n_rows, np.nan, dtype=np.float32),
        probabilities=np.zeros(n_rows, dtype=np.float64),
        defer_probability=np.zeros(n_req, dtype=np.float64),
        chosen=np.full(n_req, DEFER, dtype=np.int64),
        raw_favourite_infeasible=np.zeros(n_req, dtype=bool),
        status=tuple(status for _ in range(n_req)),
    )
