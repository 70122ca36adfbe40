"""Offline replay of a logged decision from the stored raw request.

`understudy replay` loads the journal payload the decision log kept, decodes
it with the same converter ingest used, and scores it with the same code the
scorer runs (`score_requests`), so a logged decision and its replay can be
compared field by field: same feature hash, same scores, same draw — and the
per-option feasibility bits the scorer logged (read with their own version's
signal names) against the bits the same pass recomputes now. A request logged
before migration 0010 has no bits: "not logged", and the mask is still
recomputed and shown.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich.table import Table
from sqlalchemy import Engine

from service.contract import DEFAULT_FEATURES, FeatureFunction, MirrorRequest
from service.contract.errors import NotFound
from service.pipeline.scoring import ScoredDecision, score_requests
from service.policies.base import Policy
from service.storage import decisions_for, load_raw_request, logged_request
from service.storage.log.masks import NOT_LOGGED, LoggedMask, logged_mask, mask_of
from service.storage.log.payload import decode_request

TABLE_WIDTH = 80
"""Columns of the printed mask table (a terminal's classic width)."""


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
    request: MirrorRequest
    logged_mask: LoggedMask
    """The bits the scorer logged (``not logged`` before migration 0010)."""
    replay_mask: LoggedMask
    """The bits the same feasibility pass gives now."""

    @property
    def masks_match(self) -> bool | None:
        """Logged bits equal the recomputed ones; None when not logged or logged by another
        feasibility version (nothing to compare bit for bit)."""
        logged, now = self.logged_mask, self.replay_mask
        if logged.bits is None or now.bits is None or logged.version != now.version:
            return None
        return bool(np.array_equal(logged.bits, now.bits))

    @property
    def matches(self) -> bool:
        """Same features, same choice, scores and probabilities equal to float32 precision,
        and no logged mask bit that the recomputation contradicts."""
        return (
            self.logged_feature_hash == self.replay_feature_hash
            and self.logged_chosen == self.replay_chosen
            and self.max_score_diff <= 1e-6
            and self.max_probability_diff <= 1e-9
            and self.masks_match is not False
        )

    @property
    def mask_verdict(self) -> str:
        """One line on the logged mask against its recomputation."""
        logged, now = self.logged_mask, self.replay_mask
        if not logged.logged:
            return f"mask {NOT_LOGGED} (before migration 0010); recomputed with {now.version}"
        if self.masks_match is None:
            return f"mask logged by {logged.version}, recomputed by {now.version}: not compared"
        return f"logged mask {'equals' if self.masks_match else 'DIFFERS from'} the recomputation"


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
    batch, decisions, _ = score_requests([request], [policy], features)
    replay = decisions[0]
    meta = logged_request(engine, request_id)
    assert batch.feasibility_bits is not None  # make_batch keeps its pass's bits
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
        request=request,
        logged_mask=logged_mask(meta.feasibility_version, meta.feasibility_bits),
        replay_mask=mask_of(batch.feasibility_version, batch.feasibility_bits),
    )


def _names(mask: LoggedMask, option: int) -> str:
    if not mask.logged:
        return NOT_LOGGED
    signals = mask.signals(option)
    if signals is None:
        return f"bits {int(mask.bits[option]):#06x}" if mask.bits is not None else ""
    return ", ".join(signals) if signals else "feasible"


def mask_table(result: ReplayComparison) -> Table:
    """Per option: its nodes, the signals the log says masked it, and the recomputation's.

    At most `TABLE_WIDTH` columns wide; long cells wrap. "same" where the
    recomputation names exactly what the log does.
    """
    request, logged, now = result.request, result.logged_mask, result.replay_mask
    table = Table(
        "opt",
        "nodes",
        "masked by (logged)",
        "recomputed",
        title=f"feasibility of {result.request_id} ({logged.version or now.version})",
        width=TABLE_WIDTH,
    )
    options, node_ids = request.options, request.state.node_ids
    for i in range(options.n_options):
        nodes = " ".join(node_ids[int(n)] for n in options.nodes_of(i))
        label = options.option_ids[i] if options.option_ids else str(i)
        said, found = _names(logged, i), _names(now, i)
        table.add_row(label, nodes, said, "same" if said == found else found)
    return table
