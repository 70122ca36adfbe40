"""Scoring one micro-batch with every active policy: pure, shared with replay.

`score_requests` is what the running scorer calls and what `understudy replay`
calls on a stored request, so a logged decision and its replay are computed by
the same code from the same inputs.

The logged action is drawn here, not by the policy's own generator: a uniform
``u`` derived from ``sha256(request_id, policy, version)`` picks the action by
inverse CDF over (options..., defer). That makes every logged choice
reproducible from the request alone — independent of which other requests
shared its micro-batch — and leaves deterministic policies untouched (all mass
on one action).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.contract import DEFER, FeatureFunction, MirrorRequest
from service.policies.base import DecisionStatus, Policy, ScoringBatch
from service.policies.batching import make_batch
from service.policies.runner import PolicyRun, decide_all


@dataclass(frozen=True, eq=False)
class ScoredDecision:
    """One policy's counterfactual decision on one request.

    Arrays are per option of the request (``n_options``); empty when the policy
    failed on the batch.
    """

    request_id: str
    request_time: float
    policy: str
    policy_version: str
    status: DecisionStatus
    chosen: int
    chosen_probability: float
    production_probability: float | None
    defer_probability: float
    scores: NDArray[np.float32]
    probabilities: NDArray[np.float64]
    raw_favourite_infeasible: bool
    agrees_with_production: bool | None
    latency_us: float
    predictions: dict[str, NDArray[np.float32]] | None
    error: str | None = None


def decision_uniform(request_id: str, policy: str, version: str) -> float:
    """A uniform in [0, 1) fixed by (request, policy, version)."""
    digest = hashlib.sha256(f"{request_id}\x00{policy}\x00{version}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _draw(probabilities: NDArray[np.float64], defer_p: float, u: float) -> int:
    """Inverse-CDF draw over (options..., defer); DEFER when u falls in defer's mass."""
    cdf = np.cumsum(probabilities)
    total = cdf[-1] + defer_p if len(cdf) else defer_p
    index = int(np.searchsorted(cdf, u * total, side="right"))
    return index if index < len(probabilities) else DEFER


def _per_request(
    batch: ScoringBatch, policy: Policy, run: PolicyRun, latency_us: float
) -> list[ScoredDecision]:
    d = run.decisions
    out = []
    for r, request in enumerate(batch.requests):
        start, end = int(batch.offsets[r]), int(batch.offsets[r + 1])
        probs = d.probabilities[start:end]
        defer_p = float(d.defer_probability[r])
        status = d.status[r]
        if status != DecisionStatus.ERROR:
            u = decision_uniform(request.request_id, policy.name, policy.version)
            chosen = _draw(probs, defer_p, u)
        else:
            chosen = DEFER
        chosen_p = defer_p if chosen == DEFER else float(probs[chosen])
        production = request.production
        prod_p: float | None = None
        agrees: bool | None = None
        if production is not None:
            prod_p = defer_p if production.option == DEFER else float(probs[production.option])
            agrees = chosen == production.option
        predictions = (
            {k: v[start:end].astype(np.float32) for k, v in d.predictions.items()}
            if d.predictions
            else None
        )
        out.append(
            ScoredDecision(
                request_id=request.request_id,
                request_time=request.request_time,
                policy=policy.name,
                policy_version=policy.version,
                status=status,
                chosen=chosen,
                chosen_probability=chosen_p,
                production_probability=prod_p,
                defer_probability=defer_p,
                scores=d.scores[start:end].astype(np.float32),
                probabilities=probs.astype(np.float64),
                raw_favourite_infeasible=bool(d.raw_favourite_infeasible[r]),
                agrees_with_production=agrees,
                latency_us=latency_us,
                predictions=predictions,
                error=run.error,
            )
        )
    return out


REFERENCE_BATCH = 16
"""Requests per micro-batch that policy time budgets are declared for."""


def score_batch(
    batch: ScoringBatch,
    policies: Sequence[Policy],
    budgets_s: Mapping[str, float] | None = None,
) -> tuple[list[ScoredDecision], list[PolicyRun]]:
    """Run every policy once on `batch`, isolated (`decide_all`), then split per request.

    A policy that raises or returns malformed/non-finite output gets status
    ERROR for every request of this batch; one that overruns its budget keeps
    its decisions flagged TIMEOUT. Neither affects any other policy.

    A budget is declared for a reference micro-batch of `REFERENCE_BATCH`
    requests and scales with larger batches: batches grow under load by
    design, and a fixed per-batch budget would flag a healthy policy exactly
    when traffic peaks.
    """
    scale = max(1.0, batch.n_requests / REFERENCE_BATCH)
    scaled = {name: budget * scale for name, budget in (budgets_s or {}).items()}
    runs = decide_all(policies, batch, seed=0, time_budgets_s=scaled)
    n = max(batch.n_requests, 1)
    decisions: list[ScoredDecision] = []
    for policy in policies:
        run = runs[str(policy.name)]
        decisions += _per_request(batch, policy, run, run.latency_s * 1e6 / n)
    return decisions, list(runs.values())


def score_requests(
    requests: Sequence[MirrorRequest],
    policies: Sequence[Policy],
    features: FeatureFunction,
    budgets_s: Mapping[str, float] | None = None,
) -> tuple[ScoringBatch, list[ScoredDecision], list[PolicyRun]]:
    """Features and masks once for the batch, then every policy."""
    batch = make_batch(requests, features)
    decisions, runs = score_batch(batch, policies, budgets_s)
    return batch, decisions, runs
