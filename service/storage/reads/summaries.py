"""Per-policy summaries of the decision log, for the demo and reviewers' first look."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import ColumnElement, Engine, Integer, cast, func, select

from service.storage.engine import unavailable_on_failure
from service.storage.log import tables as t


@dataclass(frozen=True, slots=True)
class PolicySummary:
    """What one policy (name, version) decided over the whole log.

    Attributes:
        decisions: rows logged.
        ok, errors, timeouts, all_infeasible, infeasible_choices: rows by status
            (docs/policies.md, "Statuses"; they add up to `decisions`).
        compared: decisions whose production choice was known at scoring time.
        agreed: of those, how many chose what production chose.
        infeasible_favourites: decisions whose top raw score was masked.
        mean_latency_us: mean scoring latency attributed per decision.
    """

    policy: str
    version: str
    decisions: int
    ok: int
    errors: int
    timeouts: int
    all_infeasible: int
    compared: int
    agreed: int
    infeasible_favourites: int
    mean_latency_us: float
    infeasible_choices: int = 0

    @property
    def agreement(self) -> float | None:
        """Share of compared decisions that agree with production (None if none compared)."""
        return self.agreed / self.compared if self.compared else None


def policy_summaries(engine: Engine) -> list[PolicySummary]:
    """One summary per logged (policy, version), ordered by name."""
    d = t.decisions

    def count_if(condition: ColumnElement[bool]) -> ColumnElement[int]:
        return func.coalesce(func.sum(cast(condition, Integer)), 0)

    query = (
        select(
            d.c.policy_name,
            d.c.policy_version,
            func.count(),
            count_if(d.c.status == "ok"),
            count_if(d.c.status == "error"),
            count_if(d.c.status == "timeout"),
            count_if(d.c.status == "all_infeasible"),
            count_if(d.c.agrees_with_production.is_not(None)),
            count_if(d.c.agrees_with_production.is_(True)),
            count_if(d.c.raw_favourite_infeasible.is_(True)),
            func.avg(d.c.latency_us),
            count_if(d.c.status == "infeasible_choice"),
        )
        .group_by(d.c.policy_name, d.c.policy_version)
        .order_by(d.c.policy_name, d.c.policy_version)
    )
    with unavailable_on_failure("summarising decisions"), engine.connect() as conn:
        rows = conn.execute(query).all()
    return [
        PolicySummary(
            policy=r[0],
            version=r[1],
            decisions=int(r[2]),
            ok=int(r[3]),
            errors=int(r[4]),
            timeouts=int(r[5]),
            all_infeasible=int(r[6]),
            compared=int(r[7]),
            agreed=int(r[8]),
            infeasible_favourites=int(r[9]),
            mean_latency_us=float(r[10] or 0.0),
            infeasible_choices=int(r[11]),
        )
        for r in rows
    ]
