"""Reads of the decision log for offline OPE: joined rounds and every policy's distribution.

A *round* is a logged request with a joined outcome. For each round the
log holds production's decision (``requests.production_option`` /
``production_propensity``, filled from the outcome when Runtime mirrored
before deciding) and, per policy, the decision's status, its
``probabilities_f64`` blob (one value per option) and its defer
probability. `read_ope_log` streams them (server-side cursor, `batch_rows`
decision rows at a time, a progress callback after each) into one columnar
`OpeLog`; turning that into estimator arrays is
``service.reports.ope.arrays``.

The time window is on ``received_at`` (Understudy's clock): Runtime's
``request_time`` may be anything (the simulator's starts at zero), so, as in
``service.storage.reads.evaluation``, day partitions are not pruned.
`Unavailable` when the database cannot be reached.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import Engine, Float, and_, cast, extract, func, or_, select

from service.storage.engine import unavailable_on_failure
from service.storage.log import tables as t
from service.storage.log.convert import unpack_probabilities

Progress = Callable[[int, int], None]
"""``(decision rows read, decision rows in the window)``."""


@dataclass(frozen=True, slots=True)
class OpeFilter:
    """Which rounds and policies to read.

    Attributes:
        since, until: Unix seconds on ``received_at``; None = unbounded.
        policies: policy names (any version); empty = every policy.
        workload_kind, tenant, model_family: keep only rounds with these values.
    """

    since: float | None = None
    until: float | None = None
    policies: tuple[str, ...] = ()
    workload_kind: str | None = None
    tenant: str | None = None
    model_family: str | None = None


@dataclass(frozen=True, eq=False)
class PolicyLog:
    """One policy version's logged decisions, aligned with the rounds of an `OpeLog`.

    Attributes:
        status: per round, the decision status, or ``""`` when not scored.
        probabilities: per round, float64 ``(n_options,)`` over the options, or None.
        defer_probability: float64 ``(n,)``; NaN when not logged.
        raw_favourite_infeasible: bool ``(n,)``.
    """

    status: list[str]
    probabilities: list[NDArray[np.float64] | None]
    defer_probability: NDArray[np.float64]
    raw_favourite_infeasible: NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class OpeLog:
    """Joined rounds (one per request with an outcome), oldest request first.

    Attributes:
        request_id: ``(n,)`` ids.
        received_at: float64 ``(n,)`` Unix seconds.
        n_options: int64 ``(n,)``.
        workload_kind, tenant, model_family: str ``(n,)`` slice labels.
        production_option: int64 ``(n,)``, option index, ``-1`` = DEFER, ``-2`` = unknown.
        production_propensity: float64 ``(n,)``, NaN = missing.
        queue_delay_s, throughput, completion_time_s: float64 ``(n,)``, NaN = not observed.
        slo_met: float64 ``(n,)`` in {0, 1}, NaN = not observed.
        failure: str ``(n,)``.
        policies: ``(name, version)`` -> `PolicyLog`.
        production_distribution: per round, production's whole distribution as
            it sent it (float64 ``(n_options + 1,)``, DEFER last) or None; empty
            (no round has one) for logs built without it.
    """

    request_id: NDArray[np.str_]
    received_at: NDArray[np.float64]
    n_options: NDArray[np.int64]
    workload_kind: NDArray[np.str_]
    tenant: NDArray[np.str_]
    model_family: NDArray[np.str_]
    production_option: NDArray[np.int64]
    production_propensity: NDArray[np.float64]
    queue_delay_s: NDArray[np.float64]
    throughput: NDArray[np.float64]
    completion_time_s: NDArray[np.float64]
    slo_met: NDArray[np.float64]
    failure: NDArray[np.str_]
    policies: dict[tuple[str, str], PolicyLog] = field(default_factory=dict)
    production_distribution: list[NDArray[np.float64] | None] = field(default_factory=list)

    @property
    def n(self) -> int:
        """Rounds."""
        return len(self.request_id)

    def production_distribution_at(self, i: int) -> NDArray[np.float64] | None:
        """Round `i`'s production distribution (options, then DEFER), or None."""
        return self.production_distribution[i] if self.production_distribution else None


UNKNOWN_OPTION = -2
"""`OpeLog.production_option` when production's decision is not known."""


def _epoch(column: Any) -> Any:
    return cast(extract("epoch", column), Float)


def filter_conditions(f: OpeFilter) -> list[Any]:
    """SQL conditions for `f` on `requests` joined with `decisions` (shared by every log read)."""
    r, d = t.requests, t.decisions
    out: list[Any] = []
    if f.since is not None:
        out.append(r.c.received_at >= func.to_timestamp(f.since))
    if f.until is not None:
        out.append(r.c.received_at < func.to_timestamp(f.until))
    if f.policies:
        out.append(or_(*(d.c.policy_name == p for p in f.policies)))
    for column, value in (
        (r.c.workload_kind, f.workload_kind),
        (r.c.tenant, f.tenant),
        (r.c.model_family, f.model_family),
    ):
        if value is not None:
            out.append(column == value)
    return out


def _source() -> Any:
    r, o, d = t.requests, t.outcomes, t.decisions
    return o.join(
        r, and_(r.c.request_id == o.c.request_id, r.c.request_time == o.c.request_time)
    ).join(d, and_(d.c.request_id == r.c.request_id, d.c.request_time == r.c.request_time))


def read_ope_log(
    engine: Engine,
    where: OpeFilter | None = None,
    *,
    batch_rows: int = 5000,
    progress: Progress | None = None,
) -> OpeLog:
    """Every joined round in `where` with each logged policy's decision on it.

    Only requests with a joined outcome and at least one logged decision are
    rounds; policies are ``(name, version)`` pairs as logged.
    """
    f = where or OpeFilter()
    r, o, d = t.requests, t.outcomes, t.decisions
    conditions = filter_conditions(f)
    count = select(func.count()).select_from(_source()).where(*conditions)
    query = (
        select(
            r.c.request_id,
            _epoch(r.c.received_at),
            r.c.n_options,
            r.c.workload_kind,
            r.c.tenant,
            r.c.model_family,
            r.c.production_option,
            r.c.production_propensity,
            o.c.queue_delay_s,
            o.c.throughput,
            o.c.completion_time_s,
            o.c.slo_met,
            o.c.failure,
            d.c.policy_name,
            d.c.policy_version,
            d.c.status,
            d.c.probabilities_f64,
            d.c.defer_probability,
            d.c.raw_favourite_infeasible,
            r.c.production_probabilities_f64,
        )
        .select_from(_source())
        .where(*conditions)
        .order_by(r.c.received_at, r.c.request_id)
    )
    rounds: dict[str, tuple[Any, ...]] = {}
    decisions: dict[tuple[str, str], dict[str, tuple[Any, ...]]] = {}
    with unavailable_on_failure("reading the decision log for OPE"), engine.connect() as conn:
        total = int(conn.execute(count).scalar_one())
        read = 0
        result = conn.execution_options(stream_results=True, yield_per=batch_rows).execute(query)
        for chunk in result.partitions():
            for row in chunk:
                rounds.setdefault(row[0], (*row[:13], row[19]))
                decisions.setdefault((row[13], row[14]), {})[row[0]] = tuple(row[15:19])
            read += len(chunk)
            if progress is not None:
                progress(read, total)
    return _columns(list(rounds.values()), decisions)


def _num(value: float | bool | None) -> float:
    return np.nan if value is None else float(value)


def _columns(
    rows: Sequence[tuple[Any, ...]], decisions: dict[tuple[str, str], dict[str, tuple[Any, ...]]]
) -> OpeLog:
    ids = [row[0] for row in rows]
    policies: dict[tuple[str, str], PolicyLog] = {}
    for key in sorted(decisions):
        by_id = decisions[key]
        logged = [by_id.get(i) for i in ids]
        policies[key] = PolicyLog(
            status=["" if x is None else str(x[0]) for x in logged],
            probabilities=[None if x is None else unpack_probabilities(x[1]) for x in logged],
            defer_probability=np.array([np.nan if x is None else _num(x[2]) for x in logged]),
            raw_favourite_infeasible=np.array([bool(x is not None and x[3]) for x in logged]),
        )

    def strings(i: int) -> NDArray[np.str_]:
        return np.array([str(row[i]) for row in rows], dtype=np.str_)

    def floats(i: int) -> NDArray[np.float64]:
        return np.array([_num(row[i]) for row in rows], dtype=np.float64)

    return OpeLog(
        request_id=np.array(ids, dtype=np.str_),
        received_at=floats(1),
        n_options=np.array([int(row[2]) for row in rows], dtype=np.int64),
        workload_kind=strings(3),
        tenant=strings(4),
        model_family=strings(5),
        production_option=np.array(
            [UNKNOWN_OPTION if row[6] is None else int(row[6]) for row in rows], dtype=np.int64
        ),
        production_propensity=floats(7),
        queue_delay_s=floats(8),
        throughput=floats(9),
        completion_time_s=floats(10),
        slo_met=floats(11),
        failure=strings(12),
        policies=policies,
        production_distribution=[
            None if row[13] is None else unpack_probabilities(row[13]) for row in rows
        ],
    )
