"""Facts about each round that only the stored request knows: option hardware, predictions.

The OPE read (``service.storage.reads.ope``) keeps what the estimators need;
slicing by the hardware class of the chosen option and the failure-mode
tables need more: the request itself (decoded with the same converter ingest
used, as ``understudy replay`` does), each policy's logged ``chosen_option``,
and a throughput predictor's quantiles for every option. `decode_log` reads
them in batches of request ids and aligns them with the rounds of an `OpeLog`.

The predictor is the learned outcome predictor (``policies/learned-outcome``)
when it loads, else none: the tables that need predictions then say so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import Engine, select

from service.contract import MirrorRequest
from service.policies.onnx_policy import OnnxPredictor
from service.policies.outcome_features import OUTCOME_FEATURES
from service.policies.predictor_features import PREDICTOR_FEATURES
from service.reports.ope.ope_run import HARDWARE_CLASS, SliceLabels
from service.storage.engine import unavailable_on_failure
from service.storage.log import tables as t
from service.storage.log.payload import decode_request, stored_payload
from service.storage.reads.ope import OpeLog

PREDICTOR = "learned-outcome"
"""The predictor whose quantiles the failure modes use (trained on simulated logs)."""
BATCH = 500
DEFER_LABEL = "DEFER"
UNKNOWN_LABEL = "unknown"
NOT_LOGGED = -2
"""`DecodedLog.chosen` where the policy logged no decision on the round."""


@dataclass(frozen=True, eq=False)
class DecodedLog:
    """Per round of an `OpeLog` (same order), what the stored requests and decisions say.

    Attributes:
        option_hardware: per round, the hardware class of each option (nodes of
            mixed classes joined with ``+``); empty when the request is missing.
        chosen: ``(name, version)`` -> int64 ``(n,)``, the logged ``chosen_option``
            (``-1`` DEFER, `NOT_LOGGED` when the policy has no decision there).
        quantiles: per round, float64 ``(n_options, 3)`` throughput q10/q50/q90 of
            every option from the predictor, or None.
        predictor: ``name@version`` of the predictor, or None when none loaded.
    """

    option_hardware: list[tuple[str, ...]]
    chosen: dict[tuple[str, str], NDArray[np.int64]]
    quantiles: list[NDArray[np.float64] | None]
    predictor: str | None

    def hardware(self, option: NDArray[np.int64]) -> NDArray[np.str_]:
        """The hardware class of `option` (one index per round); ``DEFER``, or ``unknown``."""
        out = []
        for classes, o in zip(self.option_hardware, option, strict=True):
            if o == -1:
                out.append(DEFER_LABEL)
            elif 0 <= o < len(classes):
                out.append(classes[int(o)])
            else:
                out.append(UNKNOWN_LABEL)
        return np.array(out, dtype=np.str_)

    def quantiles_of(self, option: NDArray[np.int64]) -> NDArray[np.float64]:
        """Predicted throughput quantiles ``(n, 3)`` of `option` per round; NaN where none."""
        out = np.full((len(option), 3), np.nan)
        for i, (q, o) in enumerate(zip(self.quantiles, option, strict=True)):
            if q is not None and 0 <= o < len(q):
                out[i] = q[int(o)]
        return out


def _chunks(ids: Sequence[str]) -> Iterable[list[str]]:
    for start in range(0, len(ids), BATCH):
        yield list(ids[start : start + BATCH])


def read_requests(engine: Engine, request_ids: Sequence[str]) -> dict[str, MirrorRequest]:
    """The stored requests, decoded; a reused id keeps its latest request time."""
    r, s = t.requests, t.cluster_snapshots
    out: dict[str, MirrorRequest] = {}
    with unavailable_on_failure("reading stored requests"), engine.connect() as conn:
        for ids in _chunks(request_ids):
            query = (
                select(r.c.request_id, r.c.payload_zstd, r.c.state_offset, s.c.state_zstd)
                .select_from(r.outerjoin(s, s.c.snapshot_hash == r.c.snapshot_hash))
                .where(r.c.request_id.in_(ids))
                .order_by(r.c.request_time)
            )
            for rid, payload, offset, state in conn.execute(query):
                out[str(rid)] = decode_request(stored_payload(payload, offset, state))
    return out


def read_chosen(
    engine: Engine, request_ids: Sequence[str], policies: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], NDArray[np.int64]]:
    """Each policy's logged ``chosen_option`` per request (order of `request_ids`)."""
    d = t.decisions
    where = {rid: i for i, rid in enumerate(request_ids)}
    out = {p: np.full(len(request_ids), NOT_LOGGED, dtype=np.int64) for p in policies}
    with unavailable_on_failure("reading chosen options"), engine.connect() as conn:
        for ids in _chunks(request_ids):
            query = select(
                d.c.request_id, d.c.policy_name, d.c.policy_version, d.c.chosen_option
            ).where(d.c.request_id.in_(ids))
            for rid, name, version, chosen in conn.execute(query):
                key = (str(name), str(version))
                if key in out:
                    out[key][where[str(rid)]] = int(chosen)
    return out


def option_classes(request: MirrorRequest) -> tuple[str, ...]:
    """The hardware class of each option of `request` (``a+b`` for mixed nodes)."""
    state, options = request.state, request.options
    out = []
    for o in range(options.n_options):
        names = sorted({state.hardware_of(int(n)).name for n in options.nodes_of(o)})
        out.append("+".join(names) if names else UNKNOWN_LABEL)
    return tuple(out)


def load_predictor(policies_dir: Path, name: str = PREDICTOR) -> OnnxPredictor | None:
    """The named predictor from `policies_dir`, or None when it is absent or refused."""
    from service.policies.registry import load_registry

    registry = load_registry(policies_dir, include_baselines=False)
    found = registry.predictors.get(name)
    return found if isinstance(found, OnnxPredictor) else None


def predict_options(
    predictor: OnnxPredictor, requests: Sequence[MirrorRequest]
) -> list[NDArray[np.float64]]:
    """The predictor's throughput quantiles ``(n_options, 3)`` for every option of each request."""
    if not requests:
        return []
    outcome = predictor.model.manifest.feature_version == OUTCOME_FEATURES.version
    x = OUTCOME_FEATURES(requests) if outcome else PREDICTOR_FEATURES(requests)
    q = predictor.predict_rows(x).astype(np.float64)
    bounds = np.cumsum([0, *(r.options.n_options for r in requests)])
    return [q[bounds[i] : bounds[i + 1]] for i in range(len(requests))]


def decode_log(engine: Engine, log: OpeLog, predictor: OnnxPredictor | None) -> DecodedLog:
    """Everything above for the rounds of `log`, aligned with them."""
    ids = [str(i) for i in log.request_id]
    requests = read_requests(engine, ids)
    found = [requests.get(i) for i in ids]
    present = [r for r in found if r is not None]
    predicted = iter(predict_options(predictor, present) if predictor is not None else [])
    quantiles = [None if r is None else next(predicted, None) for r in found]
    return DecodedLog(
        option_hardware=[() if r is None else option_classes(r) for r in found],
        chosen=read_chosen(engine, ids, log.policies),
        quantiles=quantiles,
        predictor=None if predictor is None else f"{predictor.name}@{predictor.version}",
    )


def slice_labels(decoded: DecodedLog) -> SliceLabels:
    """The hardware class of the option each policy chose, as a slice for `run_ope`."""
    return SliceLabels(
        per_policy={
            key: {HARDWARE_CLASS: decoded.hardware(chosen)}
            for key, chosen in decoded.chosen.items()
        }
    )
