"""Options and filter checks shared by ``understudy ope | evidence`` and ``understudy export``.

Both command groups read the same rounds of the decision log, so they take the
same filters with the same help and the same errors (a bad filter exits 2
naming the option). Kept apart from either command module so that neither has
to import the other for them: ``cli_evaluation`` uses ``cli_export`` for
``ope --parquet``, and with the options there the two would import each other.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

from service.contract.workload import WorkloadKind as Kinds
from service.ope import Estimator
from service.reports.ope.arrays import Reward
from service.reports.ope.ope_run import Traffic
from service.storage.reads.ope import OpeFilter

Since = Annotated[
    str | None, typer.Option(help="Received at or after: ISO 8601 (UTC if no zone) or Unix s.")
]
Until = Annotated[str | None, typer.Option(help="Received before: ISO 8601 or Unix seconds.")]
Policies = Annotated[
    list[str] | None, typer.Option("--policy", help="Policy name (repeatable); default: all.")
]
WorkloadKind = Annotated[str | None, typer.Option(help="Only this workload kind.")]
Tenant = Annotated[str | None, typer.Option(help="Only this tenant.")]
RewardOpt = Annotated[Reward, typer.Option(help="Joined-outcome field used as reward.")]
PrimaryOpt = Annotated[Estimator, typer.Option(help="Estimator behind the verdict.")]
LevelOpt = Annotated[float, typer.Option(help="Nominal interval coverage.")]
TrafficOpt = Annotated[
    Traffic, typer.Option(help="What produced the log's traffic (tags every number).")
]


def parse_time(text: str | None) -> float | None:
    """Unix seconds from ``text`` (a number, or ISO 8601, UTC when no zone is given)."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise typer.BadParameter(f"expected ISO 8601 or Unix seconds, got {text!r}") from exc
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _time(option: str, text: str | None) -> float | None:
    try:
        return parse_time(text)
    except typer.BadParameter as exc:
        raise typer.BadParameter(exc.message, param_hint=f"'{option}'") from exc


def check_filter(
    since: str | None,
    until: str | None,
    policy: list[str] | None,
    workload_kind: str | None,
    tenant: str | None,
) -> OpeFilter:
    """The filter, or `typer.BadParameter` (exit 2) naming the option that is wrong."""
    start, end = _time("--since", since), _time("--until", until)
    if start is not None and end is not None and end <= start:
        raise typer.BadParameter(
            f"must be after `--since` ({since}), got {until}", param_hint="'--until'"
        )
    kinds = [k.value for k in Kinds]
    if workload_kind is not None and workload_kind not in kinds:
        raise typer.BadParameter(
            f"must be one of {', '.join(kinds)}, got {workload_kind!r}",
            param_hint="'--workload-kind'",
        )
    if tenant is not None and not tenant.strip():
        raise typer.BadParameter("must not be empty", param_hint="'--tenant'")
    return OpeFilter(
        since=start,
        until=end,
        policies=tuple(policy or ()),
        workload_kind=workload_kind,
        tenant=tenant,
    )
