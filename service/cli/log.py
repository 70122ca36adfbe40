"""``understudy log ...``: seal, verify and retire the tamper-evident decision log.

    understudy log seal                      seal and anchor everything sealable now
    understudy log verify [--anchor FILE]... recompute the chain, check it against the anchor
    understudy log retire --before DATE      drop whole days before DATE, with a record

Settings come from ``UNDERSTUDY_*`` (database, data dir, key, anchor and
witness files). Exit codes: 0 fine, 1 the chain does not verify (or a seal
refused to sign what does not extend the signed chain, or a day refused to
retire), 2 bad input (a key file with loose permissions, a bad date), 3 the
database is unreachable. docs/tamper_evidence.md explains the design.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import Engine

from service.cli.errors import GuardedGroup, decision_log_url
from service.contract.errors import Conflict
from service.settings import Settings
from service.storage import make_engine
from service.storage.chain.anchor import Anchor, AnchorError, SealRefused, load_key
from service.storage.chain.retire import retire
from service.storage.chain.seal import ChainSealer
from service.storage.chain.verify import verify

log_app = typer.Typer(
    cls=GuardedGroup,
    help="Tamper-evident decision log: seal, verify, retire (docs/tamper_evidence.md).",
    no_args_is_help=True,
)
console = Console(highlight=False)


@contextmanager
def _engine() -> Iterator[tuple[Settings, Engine]]:
    """The checked decision log; `Unavailable` becomes exit 3 at the CLI's boundary."""
    settings = Settings()
    engine = make_engine(decision_log_url(settings))
    try:
        yield settings, engine
    finally:
        engine.dispose()


def _key(path: Path, *, create: bool) -> bytes:
    try:
        return load_key(path, create=create)
    except AnchorError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from exc


def _sealer(settings: Settings, engine: Engine) -> ChainSealer:
    key_file, anchor_file = settings.resolved_chain_files
    key = _key(key_file, create=True)
    anchor = Anchor(anchor_file, key, settings.resolved_chain_witness)
    return ChainSealer(engine, anchor, block_rows=settings.chain_block_rows)


def _refused(exc: SealRefused) -> typer.Exit:
    console.print(f"[red]{exc}[/]")
    console.print("run `understudy log verify` to see what was changed; nothing was signed")
    return typer.Exit(1)


@log_app.command("seal")
def seal() -> None:
    """Seal every decision, outcome and request that is safe to seal now; anchor the heads."""
    with _engine() as (settings, engine):
        try:
            report = _sealer(settings, engine).seal_all()
        except SealRefused as exc:
            raise _refused(exc) from exc
    others = ", ".join(f"{n} {name}" for name, n in report.chained if name != "decisions")
    console.print(
        f"[green]sealed {report.rows} decisions in {report.blocks} blocks[/]"
        + (f" (and {others})" if others else "")
        + f" (watermark xid {report.watermark})"
    )


@log_app.command("verify")
def verify_cmd(
    anchor: Annotated[
        list[Path] | None,
        typer.Option(
            "--anchor",
            help="Anchor file(s) to check against (repeat for several replicas); "
            "default: UNDERSTUDY_CHAIN_ANCHOR_FILE.",
        ),
    ] = None,
    witness: Annotated[
        list[Path] | None,
        typer.Option(
            "--witness",
            help="The witness of each --anchor, in the same order; default (without "
            "--anchor): UNDERSTUDY_CHAIN_WITNESS_FILE.",
        ),
    ] = None,
    show: Annotated[int, typer.Option(help="How many problems to list.")] = 20,
) -> None:
    """Recompute every row hash and block head; check them against the signed anchor."""
    with _engine() as (settings, engine):
        key_file, anchor_file = settings.resolved_chain_files
        key = _key(key_file, create=False)
        files = anchor or [anchor_file]
        witnesses = witness or ([] if anchor else [settings.resolved_chain_witness])
        with Progress(
            TextColumn("[bold]verifying[/] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task("days", total=None)
            report = verify(
                engine,
                files,
                key,
                witnesses=witnesses,
                days_known=lambda n: progress.update(task, total=n),
                on_day=lambda day, _: progress.update(task, advance=1, description=str(day)),
            )
    chains = ", ".join(
        f"{rows} {name} in {blocks} blocks"
        for name, (rows, blocks) in report.chains.items()
        if name != "decisions"
    )
    console.print(
        f"{report.days} live days ({report.rows} decisions in {report.blocks} blocks"
        + (f"; {chains}" if chains else "")
        + f"), {report.retired_days} retired days, {report.pending_rows} decisions not sealed "
        f"yet, {report.anchor_lines} anchor lines"
    )
    if report.ok:
        console.print("[green]the decision log verifies[/]")
        return
    first = report.first
    console.print(f"[red]first broken link: {first}[/]")
    others = [p for p in report.problems if p is not first]
    if others:
        console.print(f"{len(others)} more:")
    for problem in others[:show]:
        console.print(f"  - {problem}")
    if len(others) > show:
        console.print(f"  ... and {len(others) - show} more")
    raise typer.Exit(1)


@log_app.command("retire")
def retire_cmd(
    before: Annotated[
        str, typer.Option("--before", help="Drop days before this date (YYYY-MM-DD).")
    ],
    allow_recent: Annotated[
        bool, typer.Option(help="Allow days the writer may still fill (younger than 8 days).")
    ] = False,
) -> None:
    """Drop whole day partitions before DATE after sealing them, with a signed record."""
    try:
        cutoff = date.fromisoformat(before)
    except ValueError as exc:
        console.print(f"[red]`--before` must be a date YYYY-MM-DD, got {before!r}[/]")
        raise typer.Exit(2) from exc
    with _engine() as (settings, engine):
        sealer = _sealer(settings, engine)
        try:
            records = retire(sealer, engine, cutoff, allow_recent=allow_recent)
        except ValueError as exc:
            console.print(f"[red]{exc}[/]")
            raise typer.Exit(2) from exc
        except Conflict as exc:
            console.print(f"[red]{exc}[/]")
            raise typer.Exit(1) from exc
        except SealRefused as exc:
            raise _refused(exc) from exc
    for r in records:
        console.print(
            f"retired {r.day}: {r.requests_rows} requests, {r.decisions_rows} decisions, "
            f"{r.outcomes_rows} outcomes, {r.blocks} blocks, final head {r.final_head[:16]}"
        )
    console.print(f"[green]{len(records)} days retired[/]")
