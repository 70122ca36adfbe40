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

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


_PADDED_LIMIT = 1 << 20
"""Largest (requests x widest request) matrix `_draws` pads to; beyond it, one request at a time."""


def _draws(
    offsets: NDArray[np.int64],
    probabilities: NDArray[np.float64],
    defer: NDArray[np.float64],
    uniforms: NDArray[np.float64],
) -> NDArray[np.int64]:
    """`_draw` for every request of a batch at once, with the same result bit for bit.

    Each request's probabilities are laid out in one row of a zero-padded
    matrix; ``cumsum`` along a row adds the same numbers in the same order as
    ``cumsum`` of the request's own slice (trailing zeros come after its last
    entry), and ``searchsorted(cdf, x, "right")`` on a non-decreasing cdf is
    the count of entries ``<= x``. Where that reasoning could fail — a
    negative probability (unsorted cdf), a non-finite total — or the padding
    would be large, the per-request `_draw` is used instead.
    """
    n_req = len(offsets) - 1
    counts = np.diff(offsets)
    width = int(counts.max()) if n_req else 0

    def one_by_one() -> NDArray[np.int64]:
        return np.array(
            [
                _draw(
                    probabilities[offsets[r] : offsets[r + 1]], float(defer[r]), float(uniforms[r])
                )
                for r in range(n_req)
            ],
            dtype=np.int64,
        )

    if n_req == 0 or n_req * width > _PADDED_LIMIT or (probabilities < 0).any():
        return one_by_one()
    inside = np.arange(width)[None, :] < counts[:, None]
    padded = np.zeros((n_req, width), dtype=np.float64)
    padded[inside] = probabilities
    with np.errstate(over="ignore"):  # an overflowing total falls back below
        cdf = np.cumsum(padded, axis=1)
    last = cdf[np.arange(n_req), np.maximum(counts - 1, 0)] if width else np.zeros(n_req)
    with np.errstate(over="ignore"):
        total = np.where(counts > 0, last + defer, defer)
    if not np.isfinite(total).all():
        return one_by_one()
    x = uniforms * total
    index = ((cdf <= x[:, None]) & inside).sum(axis=1)
    return np.where(index < counts, index, DEFER).astype(np.int64)


def _per_request(
    batch: ScoringBatch, policy: Policy, run: PolicyRun, latency_us: float
) -> list[ScoredDecision]:
    """One `ScoredDecision` per request: draws for the whole batch, then cheap slices.

    The per-request arrays are read-only views of the batch's arrays (no copies).
    """
    d = run.decisions
    name, version, error = str(policy.name), str(policy.version), run.error
    offsets = np.asarray(batch.offsets, dtype=np.int64)
    probs_all = np.asarray(d.probabilities, dtype=np.float64)
    scores_all = np.asarray(d.scores, dtype=np.float32)
    defer_all = np.asarray(d.defer_probability, dtype=np.float64)
    predictions_all = (
        {k: np.asarray(v, dtype=np.float32) for k, v in d.predictions.items()}
        if d.predictions
        else None
    )
    shared: list[NDArray[Any]] = [probs_all, scores_all, *(predictions_all or {}).values()]
    for array in shared:
        array.flags.writeable = False
    requests = batch.requests
    drawn = [status != DecisionStatus.ERROR for status in d.status]
    # `decision_uniform` per request, with the (policy, version) half encoded once:
    # UTF-8 of a concatenation is the concatenation of the UTF-8s.
    suffix = f"\x00{name}\x00{version}".encode()
    sha256 = hashlib.sha256
    uniforms = np.array(
        [
            int.from_bytes(sha256(request.request_id.encode() + suffix).digest()[:8], "big")
            / 2.0**64
            if draw
            else 0.0
            for request, draw in zip(requests, drawn, strict=True)
        ],
        dtype=np.float64,
    )
    chosen_all = np.where(drawn, _draws(offsets, probs_all, defer_all, uniforms), DEFER)
    starts = offsets[:-1]
    padded_probs = np.append(probs_all, 0.0)
    chosen_p_all = np.where(
        chosen_all == DEFER,
        defer_all,
        padded_probs[np.where(chosen_all == DEFER, len(probs_all), starts + chosen_all)],
    )
    bounds = offsets.tolist()
    chosen_list = chosen_all.tolist()
    chosen_p_list = chosen_p_all.tolist()
    defer_list = defer_all.tolist()
    favourite_list = np.asarray(d.raw_favourite_infeasible, dtype=bool).tolist()
    status = d.status
    out = []
    for r, request in enumerate(requests):
        start, end = bounds[r], bounds[r + 1]
        probs = probs_all[start:end]
        defer_p = defer_list[r]
        chosen = chosen_list[r]
        production = request.production
        prod_p: float | None = None
        agrees: bool | None = None
        if production is not None:
            prod_p = defer_p if production.option == DEFER else float(probs[production.option])
            agrees = chosen == production.option
        out.append(
            _decision(
                {
                    "request_id": request.request_id,
                    "request_time": request.request_time,
                    "policy": name,
                    "policy_version": version,
                    "status": status[r],
                    "chosen": chosen,
                    "chosen_probability": chosen_p_list[r],
                    "production_probability": prod_p,
                    "defer_probability": defer_p,
                    "scores": scores_all[start:end],
                    "probabilities": probs,
                    "raw_favourite_infeasible": favourite_list[r],
                    "agrees_with_production": agrees,
                    "latency_us": latency_us,
                    "predictions": (
                        {k: v[start:end] for k, v in predictions_all.items()}
                        if predictions_all is not None
                        else None
                    ),
                    "error": error,
                }
            )
        )
    return out


_DECISION_FIELDS = frozenset(f.name for f in dataclasses.fields(ScoredDecision))


def _decision(values: dict[str, Any]) -> ScoredDecision:
    """A `ScoredDecision` from every field's value, without the frozen ``__init__``.

    The generated ``__init__`` of a frozen dataclass sets each of the 16 fields
    through ``object.__setattr__`` (~4.5 us a decision; ~0.7 us this way), and
    the scorer makes one decision per request per policy. The result is the
    same object: a plain instance dict holding every field (checked against
    the field list, so a new field cannot be forgotten), still frozen to
    attribute assignment.
    """
    if values.keys() != _DECISION_FIELDS:
        raise TypeError(f"ScoredDecision fields {sorted(_DECISION_FIELDS ^ values.keys())}")
    decision = object.__new__(ScoredDecision)
    decision.__dict__.update(values)
    return decision


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
