"""Row builders and small SQL helpers shared by the storage tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sqlalchemy import Engine, text

from service.contract import DEFER, MirrorRequest, Outcome, ProductionDecision
from service.pipeline.scoring import ScoredDecision
from service.policies.base import DecisionStatus, PolicyDecisions
from service.server.decision_log import decision_row
from service.storage import DecisionRow, LogBatch, rows_from
from service.wire.convert import mirror_request_to_pb

FEATURES = ("features-v1", "f" * 64)


def payload_of(request: MirrorRequest) -> bytes:
    """The journal payload Runtime's client would have sent."""
    return bytes(mirror_request_to_pb(request).SerializeToString())


def request_batch(requests: Sequence[MirrorRequest], first_seq: int = 1) -> LogBatch:
    """Request and snapshot rows for `requests`, as the scorer builds them."""
    pairs = [
        rows_from(r, payload_of(r), first_seq + i, r.request_time + 0.5, *FEATURES)
        for i, r in enumerate(requests)
    ]
    return LogBatch(
        requests=[p[0] for p in pairs], snapshots=[p[1] for p in pairs if p[1] is not None]
    )


def fake_decisions(requests: Sequence[MirrorRequest], seed: int = 0) -> PolicyDecisions:
    """A real `PolicyDecisions` (softmax over random scores) for `requests`."""
    rng = np.random.default_rng(seed)
    counts = [r.options.n_options for r in requests]
    scores = rng.normal(size=sum(counts)).astype(np.float32)
    probs = np.zeros(sum(counts))
    chosen = np.zeros(len(requests), dtype=np.int64)
    start = 0
    for i, n in enumerate(counts):
        e = np.exp(scores[start : start + n].astype(np.float64))
        probs[start : start + n] = 0.9 * e / e.sum()
        chosen[i] = int(np.argmax(scores[start : start + n])) if i % 5 else DEFER
        start += n
    return PolicyDecisions(
        scores=scores,
        probabilities=probs,
        defer_probability=np.full(len(requests), 0.1),
        chosen=chosen,
        raw_favourite_infeasible=np.array([i % 3 == 0 for i in range(len(requests))]),
        status=tuple(DecisionStatus.OK for _ in requests),
        predictions={"throughput_q50": rng.random(sum(counts)).astype(np.float32)},
    )


def scored_of(
    requests: Sequence[MirrorRequest],
    decisions: PolicyDecisions,
    policy: str,
    version: str,
    latency_us: float,
) -> list[ScoredDecision]:
    """Per-request `ScoredDecision`s of `decisions`, keeping the policy's own choices.

    What the scorer hands `DecisionLogSink` (`service.pipeline.scoring`), except
    that the scorer draws the chosen option from the probabilities; a test that
    checks what was logged needs to know the choice in advance, so it is taken
    from `decisions.chosen`.
    """
    scores = np.asarray(decisions.scores, dtype=np.float32)
    probs = np.asarray(decisions.probabilities, dtype=np.float64)
    out = []
    start = 0
    for r, request in enumerate(requests):
        end = start + request.options.n_options
        chosen = int(decisions.chosen[r])
        defer = float(decisions.defer_probability[r])
        production = request.production
        production_p: float | None = None
        if production is not None:
            production_p = (
                defer if production.option == DEFER else float(probs[start + production.option])
            )
        out.append(
            ScoredDecision(
                request_id=request.request_id,
                request_time=request.request_time,
                policy=policy,
                policy_version=version,
                status=decisions.status[r],
                chosen=chosen,
                chosen_probability=defer if chosen == DEFER else float(probs[start + chosen]),
                production_probability=production_p,
                defer_probability=defer,
                scores=scores[start:end],
                probabilities=probs[start:end],
                raw_favourite_infeasible=bool(decisions.raw_favourite_infeasible[r]),
                agrees_with_production=(
                    chosen == production.option if production is not None else None
                ),
                latency_us=latency_us,
                predictions=(
                    {name: values[start:end] for name, values in decisions.predictions.items()}
                    if decisions.predictions
                    else None
                ),
            )
        )
        start = end
    return out


def decisions_of(
    requests: Sequence[MirrorRequest], policy: str = "p1", version: str = "1", seed: int = 0
) -> list[DecisionRow]:
    """Decision rows of one policy over `requests`, built as `DecisionLogSink` builds them."""
    scored = scored_of(requests, fake_decisions(requests, seed), policy, version, 250.0)
    return [decision_row(d, 1_700_000_100.0) for d in scored]


def outcome_for(
    request_id: str,
    *,
    observed_at: float = 1_700_000_500.0,
    throughput: float | None = 1.5,
    production: ProductionDecision | None = None,
) -> Outcome:
    """An outcome report for `request_id`."""
    return Outcome(
        request_id=request_id,
        observed_at=observed_at,
        queue_delay_s=2.0,
        throughput=throughput,
        completion_time_s=300.0,
        slo_met=True,
        production=production,
    )


def scalar(engine: Engine, sql: str, **params: object) -> object:
    """One value from `sql`."""
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()
