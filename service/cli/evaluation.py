"""``understudy ope | evidence``: off-policy evaluation over the live decision log, and its package.

    understudy ope                                  # every logged policy, table + verdicts
    understudy ope --policy gavel-scorer --json out/ope.json
    understudy ope --since 2026-11-29T00:00 --workload-kind train --reward neg-completion-hours
    understudy evidence --out out/evidence --traffic simulated   # the log `make demo` leaves

The database comes from ``UNDERSTUDY_DATABASE_URL`` / ``UNDERSTUDY_DATA_DIR``
(embedded PostgreSQL by default), as for ``understudy replay``. Registered on
the main app with ``app.add_typer(evaluation_app)``. docs/evidence.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import Engine

from service.cli.errors import decision_log_url, quiet_startup
from service.cli.ope_table import print_results, write_csv
from service.cli.options import (
    LevelOpt,
    Policies,
    PrimaryOpt,
    RewardOpt,
    Since,
    Tenant,
    TrafficOpt,
    Until,
    WorkloadKind,
    check_filter,
)
from service.ope import Estimator
from service.reports.ope.arrays import Reward
from service.reports.ope.ope_run import OpeReport, Traffic, run_ope
from service.reports.ope.summary import report_json
from service.settings import Settings
from service.storage.reads.ope import OpeFilter, OpeLog

evaluation_app = typer.Typer(help="Off-policy evaluation and evidence packages.")
console = Console(highlight=False)


def read_log(where: OpeFilter) -> OpeLog:
    """Read the filtered log from the configured database with a progress bar on stderr."""
    from service.storage import make_engine
    from service.storage.reads.ope import read_ope_log

    with Console(stderr=True).status("opening the decision log"):
        url = decision_log_url(Settings())
    engine = make_engine(url)
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        ) as progress:
            task = progress.add_task("reading decisions", total=None)
            return read_ope_log(
                engine,
                where,
                progress=lambda done, total: progress.update(task, completed=done, total=total),
            )
    finally:
        engine.dispose()


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise typer.BadParameter(f"`--level` must be in (0, 1), got {level}")


def print_report(report: OpeReport) -> None:
    """The results table (fitted to the terminal, `cli_ope_table`), with verdicts."""
    print_results(console, report)


@evaluation_app.command()
def ope(
    since: Since = None,
    until: Until = None,
    policy: Policies = None,
    workload_kind: WorkloadKind = None,
    tenant: Tenant = None,
    reward: RewardOpt = Reward.SLO_MET,
    primary: PrimaryOpt = Estimator.DR,
    level: LevelOpt = 0.95,
    traffic: TrafficOpt = Traffic.PRODUCTION,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the results as JSON here.")
    ] = None,
    csv_out: Annotated[
        Path | None, typer.Option("--csv", help="Also write the full table as CSV here.")
    ] = None,
    parquet: Annotated[
        Path | None, typer.Option(help="Read this `understudy export` slice, streamed.")
    ] = None,
) -> None:
    """Estimate every logged policy on the live decision log (or an exported slice with
    --parquet): value, interval, ESS, verdict."""
    _check_level(level)
    if parquet is not None:  # docs/export.md
        from service.cli.export import parquet_report

        where = check_filter(since, until, policy, workload_kind, tenant)
        report = parquet_report(
            parquet, where, reward=reward, primary=primary, level=level, traffic=traffic
        )
    else:
        log = read_log(check_filter(since, until, policy, workload_kind, tenant))
        report = run_ope(log, reward=reward, primary=primary, level=level, traffic=traffic)
    print_report(report)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report_json(report), indent=2))
        console.print(f"results written to {json_out}")
    if csv_out is not None:
        write_csv(csv_out, report)
        console.print(f"table written to {csv_out}")
    if report.rounds == 0:
        console.print("[yellow]no joined rounds in the selected window[/]")


@evaluation_app.command()
def evidence(
    out: Annotated[Path, typer.Option(help="Package folder to write.")] = Path("out/evidence"),
    since: Since = None,
    until: Until = None,
    policy: Policies = None,
    workload_kind: WorkloadKind = None,
    tenant: Tenant = None,
    reward: RewardOpt = Reward.SLO_MET,
    primary: PrimaryOpt = Estimator.DR,
    level: LevelOpt = 0.95,
    traffic: TrafficOpt = Traffic.PRODUCTION,
) -> None:
    """Write an evidence package: index.html, report.md, results.json, figures/*.png.

    Sections after the OPE tables: failure modes, calibration, drift, and the
    online-bounded numbers the evaluator stored (when any protocol ran online).
    """
    from service.reports.ope.calibration_section import build_calibration_section
    from service.reports.ope.decision import time_range
    from service.reports.ope.decoded import decode_log, load_predictor, slice_labels
    from service.reports.ope.drift_section import build_drift_section
    from service.reports.ope.failure_section import build_failure_section
    from service.reports.ope.online_section import build_online_section, read_online_bounds
    from service.reports.ope.outcome_drift_section import build_outcome_drift_section
    from service.reports.ope.package import build_ope_package
    from service.reports.ope.sections import ReportSection

    _check_level(level)
    where = check_filter(since, until, policy, workload_kind, tenant)
    log = read_log(where)
    policies_dir = Settings().policies_dir
    status = Console(stderr=True).status("decoding stored requests")
    with status, _engine() as engine:
        with quiet_startup():
            predictor = load_predictor(policies_dir)
        decoded = decode_log(engine, log, predictor)
        report = run_ope(
            log,
            reward=reward,
            primary=primary,
            level=level,
            traffic=traffic,
            slices=slice_labels(decoded),
        )
        status.update("building sections")
        built: list[ReportSection | None] = [
            build_failure_section(log, report, decoded),
            build_calibration_section(engine, where, policies_dir),
            build_drift_section(engine, where, policies_dir),
            build_outcome_drift_section(engine, where, policies_dir),
            build_online_section(read_online_bounds(engine)),
        ]
        sections = [s for s in built if s is not None]
        status.update("drawing figures")
        package = build_ope_package(
            report,
            source=describe(where),
            sections=sections,
            span=time_range(log.received_at),
        )
    index = package.write(out)
    print_report(report)
    console.print(f"evidence package written to {index} (every table and results.json there)")


@contextmanager
def _engine() -> Iterator[Engine]:
    """An engine on the configured database (as `read_log` opens it), disposed afterwards."""
    from service.storage import make_engine

    engine = make_engine(decision_log_url(Settings()))
    try:
        yield engine
    finally:
        engine.dispose()


def describe(where: OpeFilter) -> str:
    """The filter in words, for the package's header."""

    def when(ts: float | None) -> str:
        if ts is None or math.isinf(ts):
            return "…"
        return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")

    parts = [f"decision log, received {when(where.since)} to {when(where.until)}"]
    if where.policies:
        parts.append("policies " + ", ".join(where.policies))
    if where.workload_kind:
        parts.append(f"workload kind {where.workload_kind}")
    if where.tenant:
        parts.append(f"tenant {where.tenant}")
    return "; ".join(parts)
