"""Offline replay of a logged decision from the stored raw request.

`understudy replay` loads the journal payload the decision log kept, decodes
it with the same converter ingest used, and scores it with the same code the
scorer runs (`score_requests`), so a logged decision and its replay can be
compared field by field: same feature hash, same scores, same draw.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy import Engine

from service.contract import DEFAULT_FEATURES, FeatureFunction
from service.contract.errors import NotFound
from service.pipeline.scoring import ScoredDecision, score_requests
from service.policies.base import Policy
from service.storage import decisions_for, load_raw_request, logged_request
from service.storage.log.payload import decode_request


@dataclass(frozen=True)
class ReplayComparison:
    """A logged decision next to its replay, and whether they match."""

    request_id: str
    policy: str
    logged_feature_hash: str
    replay_feature_hash: str
    logged_chosen: int
    replay_chosen: int
    max_score_diff: float
    max_probability_diff: float
    replay: ScoredDecision

    @property
    def matches(self) -> bool:
        """Same features, same choice, scores and probabilities equal to float32 precision."""
        return (
            self.logged_feature_hash == self.replay_feature_hash
            and self.logged_chosen == self.replay_chosen
            and self.max_score_diff <= 1e-6
            and self.max_probability_diff <= 1e-9
        )


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    both_nan = np.isnan(a) & np.isnan(b)
    diff = np.where(both_nan, 0.0, np.abs(a.astype(np.float64) - b.astype(np.float64)))
    return float(np.nan_to_num(diff, nan=np.inf).max())


def replay_decision(
    engine: Engine,
    request_id: str,
    policy: Policy,
    features: FeatureFunction = DEFAULT_FEATURES,
) -> ReplayComparison:
    """Recompute `policy`'s decision on a logged request and compare it with the log."""
    payload = load_raw_request(engine, request_id)
    request = decode_request(payload)
    logged = [d for d in decisions_for(engine, request_id) if d.policy_name == policy.name]
    if not logged:
        raise NotFound(f"no decision of policy `{policy.name}` on request `{request_id}`")
    row = logged[-1]
    _, decisions, _ = score_requests([request], [policy], features)
    replay = decisions[0]
    meta = logged_request(engine, request_id)
    return ReplayComparison(
        request_id=request_id,
        policy=str(policy.name),
        logged_feature_hash=meta.feature_hash,
        replay_feature_hash=features.definition_hash,
        logged_chosen=row.chosen_option,
        replay_chosen=replay.chosen,
        max_score_diff=_max_diff(row.scores, replay.scores),
        max_probability_diff=_max_diff(row.probabilities, replay.probabilities),
        replay=replay,
    )
