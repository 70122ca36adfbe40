"""Log requests through the scorer's own write path, for the feasibility-mask tests.

`score_requests` (the one feasibility pass, its bits kept on the batch), the
per-request bits of `logged_feasibility`, and `DecisionLogSink` over the real
writer: what the running scorer does after reading the journal.
"""

from __future__ import annotations

from collections.abc import Sequence

from service.contract import DEFAULT_FEATURES, MirrorRequest, Outcome
from service.pipeline.feasibility_log import logged_feasibility
from service.pipeline.scorer_types import LoggedOutcome, LoggedRequest, ScoredBatch
from service.pipeline.scoring import score_requests
from service.policies.baselines import FirstFit
from service.server.decision_log import DecisionLogSink
from service.storage import DecisionLogWriter, ensure_partitions, make_engine
from service.storage.log.partitions import day_of
from tests.storage.storage_helpers import payload_of


def log_scored(
    db_url: str,
    requests: Sequence[MirrorRequest],
    *,
    with_bits: bool = True,
    outcomes: Sequence[Outcome] = (),
) -> None:
    """Score `requests` with first-fit and log them (bits as the scorer keeps them, or none,
    as a writer from before migration 0010 stored), then `outcomes`."""
    engine = make_engine(db_url)
    try:
        for r in requests:
            ensure_partitions(engine, day_of(r.request_time), day_of(r.request_time))
        policies = [FirstFit()]
        scored, decisions, _ = score_requests(list(requests), policies, DEFAULT_FEATURES)
        logged = [
            LoggedRequest(i + 1, r, payload_of(r), r.request_time) for i, r in enumerate(requests)
        ]
        feasibility = logged_feasibility([x.seq for x in logged], list(requests), scored)
        sink = DecisionLogSink(DecisionLogWriter(engine))
        sink.write(
            ScoredBatch(
                requests=logged,
                outcomes=[],
                decisions=decisions,
                policies=policies,  # type: ignore[arg-type]
                feature_version=DEFAULT_FEATURES.version,
                feature_hash=DEFAULT_FEATURES.definition_hash,
                last_seq=len(logged),
                feasibility=feasibility if with_bits else None,
            )
        )
        if outcomes:
            first = len(logged) + 1
            sink.write(
                ScoredBatch(
                    requests=[],
                    outcomes=[
                        LoggedOutcome(first + i, o, o.observed_at) for i, o in enumerate(outcomes)
                    ],
                    decisions=[],
                    policies=[],
                    feature_version=DEFAULT_FEATURES.version,
                    feature_hash=DEFAULT_FEATURES.definition_hash,
                    last_seq=first + len(outcomes),
                )
            )
    finally:
        engine.dispose()
