"""The mirrored placement request, and production's decision on it."""

from __future__ import annotations

from dataclasses import dataclass

from service.contract.actions import PlacementOptions
from service.contract.state import ClusterState
from service.contract.workload import Workload

SCHEMA_VERSION: int = 2
"""The request schema this build speaks (contract v2: devices, open vocabularies,
unknown capabilities, production's distribution)."""

SUPPORTED_SCHEMA_VERSIONS: frozenset[int] = frozenset({1, SCHEMA_VERSION})
"""Version 1 is still accepted and mapped onto version 2 by the rule in docs/contract.md
("Versioning"). Requests declaring another version are refused."""


@dataclass(frozen=True, slots=True)
class ProductionDecision:
    """What Runtime did: the option it chose (or `DEFER`) and with what probability.

    The propensity is the probability production's policy gave the chosen
    action. It may be unknown (None): off-policy estimators that need it then
    report the request as unusable instead of guessing.

    ``probabilities`` is production's whole distribution, as Decision Service
    logs carry it: one probability per option, and ``defer_probability`` for
    `DEFER`; None when Runtime does not send it. When present it sums to 1 with
    the defer probability, is zero on masked options and agrees with
    ``propensity`` (validated), and the overlap and tail diagnostics use it.
    """

    option: int
    propensity: float | None
    probabilities: tuple[float, ...] | None = None
    defer_probability: float | None = None


@dataclass(frozen=True, eq=False)
class MirrorRequest:
    """One placement request as Runtime mirrored it.

    Attributes:
        schema_version: the contract version the sender speaks.
        request_id: Runtime's unique id; the idempotency key of everything downstream.
        request_time: when Runtime asked, Unix seconds on Runtime's clock.
        state: the cluster snapshot Runtime decided on.
        workload: the job to place.
        options: the placements Runtime enumerated.
        production: Runtime's decision when it mirrors after deciding; None
            when it mirrors before (the decision then comes with the outcome).
        quota_remaining: accelerators the tenant may still take; None = unlimited.
    """

    schema_version: int
    request_id: str
    request_time: float
    state: ClusterState
    workload: Workload
    options: PlacementOptions
    production: ProductionDecision | None = None
    quota_remaining: float | None = None
