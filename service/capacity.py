"""The capacity model: cores and database writes for a mirrored rate, option and policy count.

Pure arithmetic over benchmark points (`benchmarks/capacity_points.py`,
``make bench``); no I/O. Each point is the CPU the service process and
PostgreSQL spend per mirrored request (idle cost subtracted) at `K` options
per request and `P` policies. The per-request cost is modelled as

    c(K, P) = a + P * (e + f * K)

``a``: ingest, journal, decode and the request's own log row (independent of
policies; the request size is fixed by the cluster snapshot, not by K);
``e``: each policy's per-request work (run bookkeeping, its decision row);
``f``: each policy's per-option work (features, model rows, score blobs).
It is fitted by least squares on every point but the held-out one, which is
then predicted and compared: the relative error is the model's stated accuracy.

A replica is one service process: Python runs on one core at a time, so a
replica's ceiling is the sustained stream rate measured end to end, scaled by
c(K0, P0) / c(K, P) from the measured shape. Database rows per second are
exact: one request row and one decision row per policy per request, plus at
most one snapshot row per request (snapshots are stored once per content hash).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CostPoint:
    """One measured point: CPU seconds per request of the service and of PostgreSQL."""

    options: int
    policies: int
    server_cpu_s: float
    postgres_cpu_s: float


@dataclass(frozen=True)
class Coefficients:
    """``c(K, P) = a + P * (e + f * K)`` in CPU seconds per request."""

    a: float
    e: float
    f: float

    def cost(self, options: int, policies: int) -> float:
        """CPU seconds per request at `options` and `policies` (never below zero)."""
        return max(self.a + policies * (self.e + self.f * options), 0.0)


@dataclass(frozen=True)
class CostModel:
    """Fitted coefficients for the service process and for PostgreSQL, and the replica ceiling.

    Attributes:
        server: the service process's cost per request.
        postgres: PostgreSQL's cost per request.
        idle_cores: what one replica burns with no traffic (background loops).
        replica_rate: sustained req/s of one replica at (`reference_options`,
            `reference_policies`), from the end-to-end benchmark; None when unknown.
    """

    server: Coefficients
    postgres: Coefficients
    idle_cores: float = 0.0
    replica_rate: float | None = None
    reference_options: int = 50
    reference_policies: int = 6


@dataclass(frozen=True)
class Check:
    """How well the model predicts a measured point it was not fitted on."""

    point: CostPoint
    predicted_server_cpu_s: float
    predicted_postgres_cpu_s: float

    @property
    def server_error(self) -> float:
        """Relative error of the service-process prediction (predicted / measured - 1)."""
        return self.predicted_server_cpu_s / self.point.server_cpu_s - 1.0

    @property
    def postgres_error(self) -> float:
        """Relative error of the PostgreSQL prediction."""
        if self.point.postgres_cpu_s <= 0:
            return math.nan
        return self.predicted_postgres_cpu_s / self.point.postgres_cpu_s - 1.0


@dataclass(frozen=True)
class Plan:
    """What a mirrored rate needs."""

    rate: float
    options: int
    policies: int
    server_cores: float
    postgres_cores: float
    replicas: int
    replica_rate: float | None
    db_rows_per_s: float
    decision_rows_per_s: float

    @property
    def total_cores(self) -> float:
        """Service replicas plus PostgreSQL."""
        return self.server_cores + self.postgres_cores


def _design(points: Sequence[CostPoint]) -> np.ndarray:
    return np.array([[1.0, p.policies, p.policies * p.options] for p in points])


def fit_coefficients(points: Sequence[CostPoint], which: str) -> Coefficients:
    """Least-squares fit of ``a, e, f`` to `which` ("server" or "postgres") over `points`.

    Raises:
        ValueError: fewer than 3 points, or points that do not pin the three terms
            (they must vary both the policy count and the option count).
    """
    if len(points) < 3:
        raise ValueError(f"`points` must hold at least 3 measurements, got {len(points)}")
    x = _design(points)
    if np.linalg.matrix_rank(x) < 3:
        raise ValueError("`points` must vary both the option count and the policy count")
    y = np.array([getattr(p, f"{which}_cpu_s") for p in points])
    (a, e, f), *_ = np.linalg.lstsq(x, y, rcond=None)
    return Coefficients(float(a), float(e), float(f))


def fit(
    points: Sequence[CostPoint],
    idle_cores: float = 0.0,
    replica_rate: float | None = None,
    reference: tuple[int, int] = (50, 6),
) -> CostModel:
    """The model fitted on `points` (see `fit_coefficients` for what they must cover)."""
    return CostModel(
        fit_coefficients(points, "server"),
        fit_coefficients(points, "postgres"),
        idle_cores,
        replica_rate,
        *reference,
    )


def check(model: CostModel, held_out: CostPoint) -> Check:
    """Predict `held_out` (not used in the fit) and keep both for the error."""
    return Check(
        held_out,
        model.server.cost(held_out.options, held_out.policies),
        model.postgres.cost(held_out.options, held_out.policies),
    )


def replica_rate(model: CostModel, options: int, policies: int) -> float | None:
    """Sustained req/s of one replica at this shape, scaled from the measured reference."""
    if model.replica_rate is None:
        return None
    ref = model.server.cost(model.reference_options, model.reference_policies)
    here = model.server.cost(options, policies)
    if here <= 0 or ref <= 0:
        return model.replica_rate
    return model.replica_rate * ref / here


def plan(model: CostModel, rate: float, options: int, policies: int) -> Plan:
    """Cores, replicas and database write rate for mirroring `rate` req/s.

    Raises:
        ValueError: a negative rate, or fewer than 1 option or 0 policies.
    """
    if not rate >= 0:
        raise ValueError(f"`rate` must be >= 0, got {rate}")
    if options < 1:
        raise ValueError(f"`options` must be >= 1, got {options}")
    if policies < 0:
        raise ValueError(f"`policies` must be >= 0, got {policies}")
    per_replica = replica_rate(model, options, policies)
    server_cost = model.server.cost(options, policies)
    by_cpu = max(1, math.ceil(rate * server_cost)) if server_cost > 0 else 1
    replicas = max(by_cpu, math.ceil(rate / per_replica) if per_replica else 1)
    return Plan(
        rate=rate,
        options=options,
        policies=policies,
        server_cores=rate * server_cost + replicas * model.idle_cores,
        postgres_cores=rate * model.postgres.cost(options, policies),
        replicas=replicas,
        replica_rate=per_replica,
        db_rows_per_s=rate * (2 + policies),
        decision_rows_per_s=rate * policies,
    )
