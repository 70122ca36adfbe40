"""Delayed outcomes Runtime reports after a placement ran (or failed)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from service.contract.request import ProductionDecision


class FailureKind(StrEnum):
    """How a placed job ended, when it did not end well."""

    NONE = "none"
    OOM = "oom"
    PREEMPTED = "preempted"
    CRASHED = "crashed"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to the job of `request_id` under production's placement.

    Fields Runtime did not observe are None; an outcome may arrive late and
    out of order, and is joined on `request_id`.

    Attributes:
        request_id: the mirrored request this outcome belongs to.
        observed_at: when Runtime observed it, Unix seconds.
        queue_delay_s: seconds from request to start.
        throughput: work units per second while running.
        completion_time_s: seconds from request to completion.
        slo_met: whether the workload's SLO was met.
        failure: how the job failed, `FailureKind.NONE` if it did not.
        production: Runtime's decision, when it mirrored before deciding.
    """

    request_id: str
    observed_at: float
    queue_delay_s: float | None = None
    throughput: float | None = None
    completion_time_s: float | None = None
    slo_met: bool | None = None
    failure: FailureKind = FailureKind.NONE
    production: ProductionDecision | None = None
