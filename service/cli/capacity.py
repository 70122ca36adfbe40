"""`understudy capacity`: cores and database writes for a mirrored rate, from benchmark results.

Reads the latest ``benchmarks/results/capacity.json`` (cost per request at
several option/policy counts) and ``e2e.json`` (one replica's sustained
stream rate), fits `service.capacity` on every point but the held-out one,
prints the check on that point, then the plan. Missing or unusable results
are a clear error (exit 2) naming the file, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from service.capacity import CostPoint, check, fit, plan

capacity_app = typer.Typer(help="Capacity planning from benchmark results.")
console = Console()
DEFAULT_RESULTS = "benchmarks/results"


def _read(path: Path) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        console.print(f"[red]cannot read `{path}`: {exc}; run `make bench` first")
        raise typer.Exit(2) from exc
    return doc


def _points(doc: dict[str, Any]) -> list[CostPoint]:
    return [
        CostPoint(
            options=int(p["options"]),
            policies=int(p["policies"]),
            server_cpu_s=float(p["server_cpu_s_per_request"]),
            postgres_cpu_s=float(p["postgres_cpu_s_per_request"]),
        )
        for p in doc["details"]["points"]
    ]


def _replica_rate(results: Path) -> float | None:
    path = results / "e2e.json"
    if not path.exists():
        return None
    doc = _read(path)
    for t in doc["details"]["transports"]:
        if t["transport"] == "stream" and t.get("sustained"):
            if doc.get("quick"):
                console.print(f"[yellow]`{path}` comes from a quick (smoke) run: do not quote it")
            return float(t["sustained"])
    return None


@capacity_app.command()
def capacity(
    rate: float = typer.Option(..., "--rate", help="Mirrored requests per second to plan for."),
    options: int = typer.Option(50, "--options", help="Placement options per request."),
    policies: int = typer.Option(6, "--policies", help="Policies scored per request."),
    results_dir: str = typer.Option(
        DEFAULT_RESULTS, "--results", help="Directory of benchmark results."
    ),
) -> None:
    """Cores, replicas and database write rate needed to mirror `--rate` req/s."""
    results = Path(results_dir)
    if rate < 0 or options < 1 or policies < 0:
        name, value = (
            ("--rate", rate)
            if rate < 0
            else ("--options", options)
            if options < 1
            else ("--policies", policies)
        )
        console.print(
            f"[red]`{name}` must be {'>= 1' if name == '--options' else '>= 0'}, got {value}"
        )
        raise typer.Exit(2)
    doc = _read(results / "capacity.json")
    points = _points(doc)
    if len(points) < 4:
        console.print(
            f"[red]`{results / 'capacity.json'}` holds {len(points)} points; the model needs 3 "
            "to fit and 1 to check (a quick run has 2): run `make bench`"
        )
        raise typer.Exit(2)
    idle = max(float(p.get("idle_server_cores", 0.0)) for p in doc["details"]["points"])
    fitted, held_out = points[:-1], points[-1]
    try:
        model = fit(fitted, idle_cores=idle, replica_rate=_replica_rate(results))
    except ValueError as exc:
        console.print(f"[red]cannot fit the model on `{results / 'capacity.json'}`: {exc}")
        raise typer.Exit(2) from exc
    verdict = check(model, held_out)
    if doc.get("quick"):
        console.print("[yellow]these results come from a quick (smoke) run: do not quote them")
    console.print(
        f"fitted on {len(fitted)} points; held-out point K={held_out.options}, "
        f"P={held_out.policies}: service CPU/request predicted "
        f"{verdict.predicted_server_cpu_s * 1e6:.0f} us vs measured "
        f"{held_out.server_cpu_s * 1e6:.0f} us ({verdict.server_error:+.0%}); PostgreSQL "
        f"{verdict.predicted_postgres_cpu_s * 1e6:.0f} vs {held_out.postgres_cpu_s * 1e6:.0f} us "
        f"({verdict.postgres_error:+.0%})"
    )
    p = plan(model, rate, options, policies)
    table = Table("", "value", title=f"{rate:,.0f} req/s, {options} options, {policies} policies")
    table.add_row("service replicas (one process each)", str(p.replicas))
    table.add_row(
        "one replica sustains",
        f"{p.replica_rate:,.0f} req/s" if p.replica_rate else "unknown (no e2e.json)",
    )
    table.add_row("service cores", f"{p.server_cores:.2f}")
    table.add_row("PostgreSQL cores", f"{p.postgres_cores:.2f}")
    table.add_row("total cores", f"{p.total_cores:.2f}")
    table.add_row(
        "database rows/s (requests + decisions + snapshots, at most)", f"{p.db_rows_per_s:,.0f}"
    )
    table.add_row("of which decision rows/s", f"{p.decision_rows_per_s:,.0f}")
    console.print(table)
