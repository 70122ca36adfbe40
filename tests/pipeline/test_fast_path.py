"""The scorer's vectorised per-request split gives exactly what request-by-request code gave.

A logged decision must replay exactly, so the batch-wide draw (`_draws`) and the
split into `ScoredDecision`s are compared, field by field and bit by bit, with
the straightforward per-request version they replaced (kept here as the oracle),
on the real policies of `policies/` and on hand-made probability vectors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.contract import DEFER, MirrorRequest
from service.pipeline.scoring import (
    ScoredDecision,
    _draw,
    _draws,
    _per_request,
    decision_uniform,
    score_batch,
)
from service.policies.base import DecisionStatus, Policy, ScoringBatch
from service.policies.batching import make_batch
from service.policies.registry import Registry, load_registry
from service.policies.runner import PolicyRun, decide_all
from service.policies.synthetic import random_requests

POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"


def reference_split(
    batch: ScoringBatch, policy: Policy, run: PolicyRun, latency_us: float
) -> list[ScoredDecision]:
    """The request-by-request split the scorer used before it was vectorised."""
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


def assert_same_decision(got: ScoredDecision, want: ScoredDecision) -> None:
    for name in (
        "request_id",
        "request_time",
        "policy",
        "policy_version",
        "status",
        "chosen",
        "chosen_probability",
        "production_probability",
        "defer_probability",
        "raw_favourite_infeasible",
        "agrees_with_production",
        "latency_us",
        "error",
    ):
        assert getattr(got, name) == getattr(want, name), (want.request_id, want.policy, name)
        assert type(getattr(got, name)) is type(getattr(want, name)), name
    for name in ("scores", "probabilities"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (want.policy, name)
    assert (got.predictions is None) == (want.predictions is None)
    if got.predictions is not None and want.predictions is not None:
        assert got.predictions.keys() == want.predictions.keys()
        for key, value in want.predictions.items():
            assert got.predictions[key].tobytes() == value.tobytes(), key


@pytest.fixture(scope="module")
def registry() -> Registry:
    return load_registry(POLICIES_DIR)


@pytest.mark.parametrize("size", [1, 5, 16, 64])
def test_split_matches_request_by_request_on_real_policies(
    registry: Registry, requests_sample: list[MirrorRequest], size: int
) -> None:
    requests = [*requests_sample, *random_requests(3, 64)]
    policies = list(registry.policies.values())
    assert len(policies) >= 6
    for start in range(0, len(requests), size):
        batch = make_batch(requests[start : start + size])
        runs = decide_all(policies, batch, seed=0)
        for policy in policies:
            run = runs[str(policy.name)]
            got = _per_request(batch, policy, run, 12.5)
            want = reference_split(batch, policy, run, 12.5)
            assert len(got) == len(want) == batch.n_requests
            for g, w in zip(got, want, strict=True):
                assert_same_decision(g, w)


def test_score_batch_gives_n_times_p_decisions(
    registry: Registry, requests_sample: list[MirrorRequest]
) -> None:
    policies = list(registry.policies.values())
    batch = make_batch(requests_sample)
    decisions, runs = score_batch(batch, policies)
    assert len(decisions) == batch.n_requests * len(policies)
    assert {(d.request_id, d.policy) for d in decisions} == {
        (r.request_id, str(p.name)) for r in requests_sample for p in policies
    }
    assert len(runs) == len(policies)


def _random_case(
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    n_req = int(rng.integers(1, 40))
    counts = rng.integers(0, 12, n_req)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    probs = rng.random(int(offsets[-1]))
    probs[rng.random(len(probs)) < 0.3] = 0.0
    defer = np.where(rng.random(n_req) < 0.5, 0.0, rng.random(n_req))
    style = rng.integers(0, 3)
    if style == 1:  # one-hot rows, as argmax policies give
        probs[:] = 0.0
        for r in range(n_req):
            if counts[r]:
                probs[offsets[r] + rng.integers(0, counts[r])] = 1.0
        defer[:] = np.where(counts == 0, 1.0, 0.0)
    elif style == 2:  # normalised, as softmax gives
        for r in range(n_req):
            seg = slice(offsets[r], offsets[r + 1])
            total = probs[seg].sum() + defer[r]
            if total > 0:
                probs[seg] /= total
                defer[r] /= total
    uniforms = rng.random(n_req)
    uniforms[rng.random(n_req) < 0.1] = np.nextafter(1.0, 0.0)
    uniforms[rng.random(n_req) < 0.1] = 0.0
    return offsets, probs, defer, uniforms


def _reference_draws(
    offsets: np.ndarray, probs: np.ndarray, defer: np.ndarray, uniforms: np.ndarray
) -> list[int]:
    return [
        _draw(probs[offsets[r] : offsets[r + 1]], float(defer[r]), float(uniforms[r]))
        for r in range(len(offsets) - 1)
    ]


def test_batch_draws_equal_single_draws() -> None:
    rng = np.random.default_rng(11)
    for _ in range(500):
        offsets, probs, defer, uniforms = _random_case(rng)
        got = _draws(offsets, probs, defer, uniforms)
        assert got.tolist() == _reference_draws(offsets, probs, defer, uniforms)


def test_draws_on_the_boundaries_of_the_cdf() -> None:
    """u * total landing exactly on a cumulative sum picks the next option, as searchsorted does."""
    offsets = np.array([0, 4, 4, 6], dtype=np.int64)
    probs = np.array([0.25, 0.25, 0.0, 0.5, 0.5, 0.5])
    defer = np.array([0.0, 1.0, 0.0])
    for u in (0.0, 0.25, 0.5, 0.75, np.nextafter(1.0, 0.0)):
        uniforms = np.full(3, u)
        got = _draws(offsets, probs, defer, uniforms).tolist()
        assert got == _reference_draws(offsets, probs, defer, uniforms), u
    assert _draws(offsets, probs, defer, np.full(3, 0.5)).tolist() == [3, DEFER, 1]


def test_unusual_probabilities_fall_back_to_single_draws() -> None:
    offsets = np.array([0, 3, 5], dtype=np.int64)
    uniforms = np.array([0.3, 0.9])
    for probs, defer in (
        (np.array([0.5, -0.2, 0.7, 0.1, 0.2]), np.array([0.0, 0.1])),
        (np.array([1e308, 1e308, 1.0, 0.1, 0.2]), np.array([0.0, 0.1])),
    ):
        with np.errstate(over="ignore"):  # the single draw's own cumsum overflows
            got = _draws(offsets, probs, defer, uniforms).tolist()
            want = _reference_draws(offsets, probs, defer, uniforms)
        assert got == want
