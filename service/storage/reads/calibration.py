"""Reads of the decision log for calibration: each policy's logged prediction and the outcome.

A decision's ``predicted`` JSONB holds the predictor's quantiles for the
option *that policy chose* (``service.policies.predictor.PREDICTION_NAMES``);
the outcome Runtime reports is for the option *production* chose. So a
prediction meets its outcome only where the two coincide
(``decisions.chosen_option = requests.production_option``): those are the
*matched* rows calibration is measured on. Predictions on options production
did not take are never checked — a selection the report states — and how
many joined predictions were unmatched is counted per policy.

Targets (`TARGETS`): ``throughput`` (``throughput_q*`` against the outcome's
throughput) and ``run_time`` (``completion_time_q*``, which excludes
queueing, against ``completion_time_s - queue_delay_s``).

The filter is `service.storage.reads.ope.OpeFilter` (time range on
``received_at``, policies, workload kind, tenant, model family).
`Unavailable` when the database cannot be reached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import Engine, Float, and_, cast, extract, func, select

from service.storage.engine import unavailable_on_failure
from service.storage.log import tables as t
from service.storage.log.payload import stored_payload
from service.storage.reads.ope import OpeFilter, filter_conditions

TARGETS: dict[str, tuple[str, str, str]] = {
    "throughput": ("throughput_q10", "throughput_q50", "throughput_q90"),
    "run_time": ("completion_time_q10", "completion_time_q50", "completion_time_q90"),
}
"""Outcome target -> the predicted quantile names at levels 0.1 / 0.5 / 0.9."""
TARGET_TAUS: tuple[float, float, float] = (0.1, 0.5, 0.9)


@dataclass(frozen=True, eq=False)
class CalibrationRows:
    """One policy version's matched rows for one target, oldest first; shapes ``(n,)``.

    Attributes:
        policy, version: the policy as logged.
        target: a key of `TARGETS`.
        taus: the quantile levels of `quantiles`' columns.
        quantiles: float64 ``(n, 3)``.
        outcome: float64 ``(n,)``, positive.
        received_at: Unix seconds the request was received.
        workload_kind, tenant, model_family: slice labels.
        request_id: ids.
        chosen_option: the option predicted for (= production's).
        payload: raw request bytes per row when read with `with_payload`, else None.
        unmatched: joined decisions with a prediction for an option production did not take.
    """

    policy: str
    version: str
    target: str
    taus: tuple[float, ...]
    quantiles: NDArray[np.float64]
    outcome: NDArray[np.float64]
    received_at: NDArray[np.float64]
    workload_kind: NDArray[np.str_]
    tenant: NDArray[np.str_]
    model_family: NDArray[np.str_]
    request_id: NDArray[np.str_]
    chosen_option: NDArray[np.int64]
    payload: list[bytes] | None
    unmatched: int

    @property
    def n(self) -> int:
        """Matched rows."""
        return len(self.outcome)


def _conditions(f: OpeFilter) -> list[Any]:
    """The OPE filter, restricted to decisions that logged a prediction."""
    return [t.decisions.c.predicted.is_not(None), *filter_conditions(f)]


def _arrived(since: float | None) -> list[Any]:
    return [] if since is None else [t.outcomes.c.received_at >= func.to_timestamp(since)]


def _outcome(target: str, row: Any) -> float | None:
    if target == "throughput":
        return None if row.throughput is None else float(row.throughput)
    if row.completion_time_s is None:
        return None
    return float(row.completion_time_s) - float(row.queue_delay_s or 0.0)


def read_calibration(
    engine: Engine,
    where: OpeFilter | None = None,
    *,
    target: str = "throughput",
    with_payload: bool = False,
    outcomes_since: float | None = None,
    limit: int | None = None,
) -> list[CalibrationRows]:
    """Matched rows per policy version that logged predictions in `where` (module docstring).

    `outcomes_since` (Unix seconds) keeps only outcomes *received* since then —
    the live monitor's window: jobs report long after their request.
    `limit` keeps only the newest `limit` joined predictions (by outcome receipt),
    matched or not, over all policies read; rows are still returned oldest first.

    A row is kept only when its three quantiles are logged and positive,
    ordered, and its outcome is positive (a failed job reports no throughput).
    """
    if target not in TARGETS:
        raise ValueError(f"`target` must be one of {sorted(TARGETS)}, got {target!r}")
    names = TARGETS[target]
    f = where or OpeFilter()
    r, o, d, s = t.requests, t.outcomes, t.decisions, t.cluster_snapshots
    source = o.join(
        r, and_(r.c.request_id == o.c.request_id, r.c.request_time == o.c.request_time)
    ).join(d, and_(d.c.request_id == r.c.request_id, d.c.request_time == r.c.request_time))
    payload_cols: tuple[Any, ...] = ()
    if with_payload:
        source = source.outerjoin(s, s.c.snapshot_hash == r.c.snapshot_hash)
        payload_cols = (r.c.payload_zstd, r.c.state_offset, s.c.state_zstd)
    query = (
        select(
            d.c.policy_name,
            d.c.policy_version,
            r.c.request_id,
            cast(extract("epoch", r.c.received_at), Float).label("received_at"),
            r.c.workload_kind,
            r.c.tenant,
            r.c.model_family,
            r.c.production_option,
            d.c.chosen_option,
            d.c.predicted,
            o.c.throughput,
            o.c.completion_time_s,
            o.c.queue_delay_s,
            *payload_cols,
        )
        .select_from(source)
        .where(*_conditions(f), *_arrived(outcomes_since))
        .order_by(d.c.policy_name, d.c.policy_version, r.c.received_at, r.c.request_id)
    )
    if limit is not None:
        newest = query.order_by(None).order_by(o.c.received_at.desc()).limit(limit).subquery()
        query = select(newest).order_by(
            newest.c.policy_name, newest.c.policy_version, newest.c.received_at, newest.c.request_id
        )
    groups: dict[tuple[str, str], list[Any]] = {}
    unmatched: dict[tuple[str, str], int] = {}
    with unavailable_on_failure("reading predictions for calibration"), engine.connect() as conn:
        for row in conn.execute(query):
            key = (str(row.policy_name), str(row.policy_version))
            groups.setdefault(key, [])
            if row.production_option is None or row.production_option != row.chosen_option:
                unmatched[key] = unmatched.get(key, 0) + 1
                continue
            groups[key].append(row)
    return [
        _rows(key, rows, target, names, with_payload, unmatched.get(key, 0))
        for key, rows in sorted(groups.items())
    ]


def _usable(predicted: Any, names: Sequence[str], outcome: float | None) -> list[float] | None:
    if not isinstance(predicted, dict) or outcome is None or not outcome > 0:
        return None
    values = [predicted.get(n) for n in names]
    if any(not isinstance(v, int | float) or not v > 0 for v in values):
        return None
    q = [float(v) for v in values]  # type: ignore[arg-type]
    return q if q[0] <= q[1] <= q[2] and all(np.isfinite(q)) else None


def _rows(
    key: tuple[str, str],
    rows: Sequence[Any],
    target: str,
    names: Sequence[str],
    with_payload: bool,
    unmatched: int,
) -> CalibrationRows:
    kept: list[tuple[Any, list[float], float]] = []
    for row in rows:
        y = _outcome(target, row)
        q = _usable(row.predicted, names, y)
        if q is not None and y is not None:
            kept.append((row, q, y))

    def strings(name: str) -> NDArray[np.str_]:
        return np.array([str(getattr(k[0], name)) for k in kept], dtype=np.str_)

    return CalibrationRows(
        policy=key[0],
        version=key[1],
        target=target,
        taus=TARGET_TAUS,
        quantiles=np.array([k[1] for k in kept], dtype=np.float64).reshape(-1, 3),
        outcome=np.array([k[2] for k in kept], dtype=np.float64),
        received_at=np.array([float(k[0].received_at) for k in kept], dtype=np.float64),
        workload_kind=strings("workload_kind"),
        tenant=strings("tenant"),
        model_family=strings("model_family"),
        request_id=strings("request_id"),
        chosen_option=np.array([int(k[0].chosen_option) for k in kept], dtype=np.int64),
        payload=[
            stored_payload(k[0].payload_zstd, k[0].state_offset, k[0].state_zstd) for k in kept
        ]
        if with_payload
        else None,
        unmatched=unmatched,
    )
