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
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.contract import DEFER, FeatureFunction, MirrorRequest
from service.policies.base import DecisionStatus, Policy, PolicyDecisions, ScoringBatch
from service.policies.batching import make_batch


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
    probabilities: NDArray[np.float32]
    raw_favourite_infeasible: bool
    agrees_with_production: bool | None
    latency_us: float
    predictions: dict[str, NDArray[np.float32]] | None
    error: str | None = None


@dataclass(frozen=True)
class PolicyRun:
    """How one policy fared on one batch: its latency and failure, if any."""

    policy: str
    latency_s: float
    error: str | None


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


def _check(decisions: PolicyDecisions, batch: ScoringBatch) -> None:
    n_rows, n_req = len(batch.mask), batch.n_requests
    if decisions.probabilities.shape != (n_rows,) or decisions.defer_probability.shape != (n_req,):
        raise ValueError("decision arrays do not match the batch's shape")
    if not (
        np.isfinite(decisions.probabilities).all()
        and np.isfinite(decisions.defer_probability).all()
    ):
        raise ValueError("non-finite probabilities")
    if len(decisions.status) != n_req:
        raise ValueError("one status per request is required")


def _failed(
    batch: ScoringBatch, policy: Policy, status: DecisionStatus, error: str, latency_us: float
) -> list[ScoredDecision]:
    empty = np.zeros(0, dtype=np.float32)
    return [
        ScoredDecision(
            request_id=r.request_id,
            request_time=r.request_time,
            policy=policy.name,
            policy_version=policy.version,
            status=status,
            chosen=DEFER,
            chosen_probability=0.0,
            production_probability=None,
            defer_probability=0.0,
            scores=empty,
            probabilities=empty,
            raw_favourite_infeasible=False,
            agrees_with_production=None,
            latency_us=latency_us,
            predictions=None,
            error=error,
        )
        for r in batch.requests
    ]


def _per_request(
    batch: ScoringBatch, policy: Policy, d: PolicyDecisions, latency_us: float
) -> list[ScoredDecision]:
    out = []
    for r, request in enumerate(batch.requests):
        start, end = int(batch.offsets[r]), int(batch.offsets[r + 1])
        probs = d.probabilities[start:end]
        defer_p = float(d.defer_probability[r])
        status = d.status[r]
        if status in (DecisionStatus.OK, DecisionStatus.ALL_INFEASIBLE):
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
                probabilities=probs.astype(np.float32),
                raw_favourite_infeasible=bool(d.raw_favourite_infeasible[r]),
                agrees_with_production=agrees,
                latency_us=latency_us,
                predictions=predictions,
            )
        )
    return out


def score_batch(
    batch: ScoringBatch,
    policies: Sequence[Policy],
    budgets_s: dict[str, float] | None = None,
) -> tuple[list[ScoredDecision], list[PolicyRun]]:
    """Run every policy once on `batch`; a failing policy never stops the others.

    A policy that raises or returns malformed/non-finite output gets status
    ERROR for every request of this batch; one that overruns its budget gets
    TIMEOUT (Python cannot pre-empt a call, so the budget is checked after it
    returns and the late answer is not used).
    """
    budgets_s = budgets_s or {}
    decisions: list[ScoredDecision] = []
    runs: list[PolicyRun] = []
    n = max(batch.n_requests, 1)
    for policy in policies:
        started = time.perf_counter()
        try:
            result = policy.decide(batch, np.random.default_rng(0))
            _check(result, batch)
            error = None
        except Exception as exc:  # any policy failure is contained to this policy and batch
            result, error = None, f"{type(exc).__name__}: {exc}"
        elapsed = time.perf_counter() - started
        latency_us = elapsed * 1e6 / n
        budget = budgets_s.get(policy.name)
        if result is not None and budget is not None and elapsed > budget:
            error = f"took {elapsed * 1e3:.1f} ms, budget {budget * 1e3:.1f} ms"
            decisions += _failed(batch, policy, DecisionStatus.TIMEOUT, error, latency_us)
        elif result is None:
            decisions += _failed(batch, policy, DecisionStatus.ERROR, error or "", latency_us)
        else:
            decisions += _per_request(batch, policy, result, latency_us)
        runs.append(PolicyRun(policy.name, elapsed, error))
    return decisions, runs


def score_requests(
    requests: Sequence[MirrorRequest],
    policies: Sequence[Policy],
    features: FeatureFunction,
    budgets_s: dict[str, float] | None = None,
) -> tuple[ScoringBatch, list[ScoredDecision], list[PolicyRun]]:
    """Features and masks once for the batch, then every policy."""
    batch = make_batch(requests, features)
    decisions, runs = score_batch(batch, policies, budgets_s)
    return batch, decisions, runs
