"""``understudy export``: an evaluation slice of the decision log as Parquet or DSJSON.

    understudy export --out out/slice                        # Hive-partitioned Parquet
    understudy export --out out/slice --policy lcb-planner --workload-kind train \\
        --since 2026-11-29T00:00 --until 2026-11-30
    understudy export --out out/vw --format dsjson --reward slo-met
    understudy ope --parquet out/slice                       # OPE on the slice, streamed

Filters are those of ``understudy ope`` (same rounds). A bad filter exits 2
with a message naming the option. Registered on the main app with
``app.add_typer(export_app)``. docs/export.md.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy import Engine, select

from service.cli.errors import decision_log_url
from service.cli.options import (
    Policies,
    Since,
    Tenant,
    TrafficOpt,
    Until,
    WorkloadKind,
    check_filter,
)
from service.contract import InvalidInput
from service.contract.errors import Unavailable
from service.ope import Estimator
from service.reports.ope.arrays import Reward
from service.reports.ope.ope_run import OpeReport, Traffic
from service.settings import Settings
from service.storage.reads.ope import OpeFilter

export_app = typer.Typer(help="Evaluation slices of the decision log.")
console = Console(highlight=False)


class ExportFormat(StrEnum):
    """What `understudy export` writes."""

    PARQUET = "parquet"
    DSJSON = "dsjson"


def _check_policies(engine: Engine, where: OpeFilter) -> None:
    from service.storage.engine import unavailable_on_failure
    from service.storage.log import tables as t

    with unavailable_on_failure("reading the policy list"), engine.connect() as conn:
        logged = sorted({str(n) for (n,) in conn.execute(select(t.policies.c.name))})
    unknown = [p for p in where.policies if p not in logged]
    if unknown:
        raise typer.BadParameter(
            f"{', '.join(map(repr, unknown))} not in the decision log; logged: {', '.join(logged)}",
            param_hint="'--policy'",
        )


@contextmanager
def unavailable_exits() -> Iterator[None]:
    """The database being unreachable is a message and exit 1, not a traceback."""
    try:
        yield
    except Unavailable as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from exc


def _progress(description: str) -> Progress:
    return Progress(
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


def reward_of(reward: Reward) -> Callable[[Mapping[str, Any]], float | None]:
    """A row's reward as ``Reward.of`` reads it (None when the field was not observed)."""

    def of(row: Mapping[str, Any]) -> float | None:
        if reward is Reward.SLO_MET:
            return None if row["slo_met"] is None else float(row["slo_met"])
        field = "completion_time_s" if reward is Reward.NEG_COMPLETION_HOURS else "queue_delay_s"
        value = row[field]
        return None if value is None or math.isnan(value) else -value / 3600.0

    return of


@export_app.command()
def export(
    out: Annotated[Path, typer.Option(help="Folder to write (must not exist or be empty).")],
    since: Since = None,
    until: Until = None,
    policy: Policies = None,
    workload_kind: WorkloadKind = None,
    tenant: Tenant = None,
    format: Annotated[
        ExportFormat, typer.Option("--format", help="Hive-partitioned Parquet or VW's DSJSON.")
    ] = ExportFormat.PARQUET,
    traffic: TrafficOpt = Traffic.PRODUCTION,
    scenario: Annotated[
        str | None, typer.Option(help="Scenario tag stamped on every row (e.g. `train`).")
    ] = None,
    reward: Annotated[
        Reward, typer.Option(help="DSJSON only: the reward whose negative is `_label_cost`.")
    ] = Reward.SLO_MET,
    batch_rows: Annotated[int, typer.Option(help="Decision rows read per chunk.")] = 20_000,
) -> None:
    """Write the rounds `understudy ope` would read for these filters as an evaluation slice."""
    from service.storage import make_engine
    from service.storage.export.parquet import SliceTags, export_parquet, iter_slice

    where = check_filter(since, until, policy, workload_kind, tenant)
    if batch_rows < 1:
        raise typer.BadParameter(f"must be >= 1, got {batch_rows}", param_hint="'--batch-rows'")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise typer.BadParameter(f"{out} exists and is not an empty folder", param_hint="'--out'")
    with Console(stderr=True).status("opening the decision log"):
        url = decision_log_url(Settings())
    engine = make_engine(url)
    tags = SliceTags(traffic=traffic.value, scenario=scenario)
    try:
        with unavailable_exits():
            _check_policies(engine, where)
        with unavailable_exits(), _progress("exporting decisions") as bar:
            task = bar.add_task("export", total=None)

            def step(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            if format is ExportFormat.PARQUET:
                summary = export_parquet(
                    engine, where, out, tags=tags, batch_rows=batch_rows, progress=step
                )
                rows = [
                    ("decision rows", f"{summary.rows:,}"),
                    ("rounds (requests)", f"{summary.rounds:,}"),
                    ("dates", ", ".join(summary.dates) or "—"),
                    ("policies", ", ".join(summary.policies) or "—"),
                    ("files", f"{summary.files} ({summary.bytes / 1e6:.2f} MB)"),
                    ("seconds", f"{summary.seconds:.2f}"),
                    ("rows/s", f"{summary.rows_per_second:,.0f}"),
                ]
            else:
                batches = iter_slice(engine, where, tags=tags, batch_rows=batch_rows, progress=step)
                rows = _write_dsjson(batches, out, where, tags, reward)
    finally:
        engine.dispose()
    table = Table(show_header=False, title=f"{format.value} slice written to {out}")
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)


def _write_dsjson(
    batches: Any, out: Path, where: OpeFilter, tags: Any, reward: Reward
) -> list[tuple[str, str]]:
    from service.storage.export.dsjson import DSJSON_SCHEMA, write_dsjson

    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with (out / "slice.dsjson").open("wb") as f:
        summary = write_dsjson(batches, f, reward_of(reward))
    seconds = time.perf_counter() - start
    manifest = {
        "schema": DSJSON_SCHEMA,
        "filter": asdict(where),
        "traffic": tags.traffic,
        "scenario": tags.scenario,
        "reward": reward.value,
        "summary": asdict(summary),
    }
    (out / "_slice.json").write_text(json.dumps(manifest, indent=2))
    return [
        ("lines (labelled rounds)", f"{summary.lines:,}"),
        ("skipped: no reward", str(summary.no_reward)),
        ("skipped: no production decision", str(summary.no_production)),
        ("file", str(out / "slice.dsjson")),
        ("seconds", f"{seconds:.2f}"),
    ]


def parquet_report(
    root: Path,
    where: OpeFilter,
    *,
    reward: Reward,
    primary: Estimator,
    level: float,
    traffic: Traffic,
) -> OpeReport:
    """``understudy ope --parquet``: the streamed report on a slice, with a progress bar."""
    from service.reports.ope.parquet_ope import stream_ope

    if not root.is_dir():  # before the progress bar, so the refusal stands alone
        raise typer.BadParameter(
            f"must be a slice folder written by `understudy export`, got {root}",
            param_hint="'--parquet'",
        )
    try:
        with _progress("reading the slice (3 passes)") as bar:
            task = bar.add_task("ope", total=None)
            return stream_ope(
                root,
                where,
                reward=reward,
                primary=primary,
                level=level,
                traffic=traffic,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            )
    except InvalidInput as exc:
        raise typer.BadParameter(str(exc), param_hint="'--parquet'") from exc
