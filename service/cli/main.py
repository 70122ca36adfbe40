"""The `understudy` command line."""

from __future__ import annotations

import json
import logging

import typer
from pydantic.fields import FieldInfo
from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from service.auth import token_digest
from service.cli.capacity import capacity_app
from service.cli.errors import GuardedGroup, decision_log_url, parse_database_url, quiet_startup
from service.cli.evaluation import evaluation_app
from service.cli.export import export_app
from service.cli.learning import learning_app
from service.cli.log import log_app
from service.cli.protocols import protocol_app
from service.settings import Settings

app = typer.Typer(
    cls=GuardedGroup,  # user errors print as two lines, never a traceback (cli_errors)
    help="Understudy: shadow evaluation of compute placement policies.",
    no_args_is_help=True,
)
console = Console()
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
SCORER_MODES = ("auto", "thread", "process")


@app.callback()
def main(
    debug: bool = typer.Option(
        False,
        "--debug",
        envvar="UNDERSTUDY_DEBUG",
        help="Show the full traceback of an error instead of its short form.",
    ),
) -> None:
    """Understudy: shadow evaluation of compute placement policies."""


@app.command()
def serve(
    log_level: str = typer.Option("INFO", help="Python logging level."),
    scorer_mode: str | None = typer.Option(
        None,
        "--scorer-mode",
        help="Where to score: auto (a child process when this process may use more than "
        "one core, else a thread), thread or process. Default: UNDERSTUDY_SCORER_MODE, "
        "else auto.",
        show_default=False,
    ),
    scorer_process: bool = typer.Option(
        False, "--scorer-process", help="Alias of --scorer-mode process (kept for scripts)."
    ),
) -> None:
    """Run the service (gRPC + HTTP) with settings from UNDERSTUDY_* variables."""
    from service.server.app import serve as run

    if log_level.upper() not in LOG_LEVELS:
        raise typer.BadParameter(
            f"must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}", param_hint="'--log-level'"
        )
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run(serve_settings(scorer_mode, scorer_process))


def serve_settings(scorer_mode: str | None, scorer_process: bool) -> Settings:
    """`serve`'s settings: the environment's, with the scorer mode its flags ask for.

    `--scorer-process` is the older spelling of `--scorer-mode process`; given
    with a different `--scorer-mode` it is refused rather than one silently winning.
    """
    if scorer_mode is not None and scorer_mode not in SCORER_MODES:
        raise typer.BadParameter(
            f"must be one of {', '.join(SCORER_MODES)}, got {scorer_mode!r}",
            param_hint="'--scorer-mode'",
        )
    if scorer_process:
        if scorer_mode not in (None, "process"):
            raise typer.BadParameter(
                f"--scorer-process means --scorer-mode process, not {scorer_mode}",
                param_hint="'--scorer-process'",
            )
        scorer_mode = "process"
    return Settings() if scorer_mode is None else Settings(scorer_mode=scorer_mode)


@app.command("token-hash")
def token_hash(token: str = typer.Argument(..., help="The bearer token to store.")) -> None:
    """Print the sha256 digest to put in UNDERSTUDY_AUTH_TOKENS for `token`."""
    console.print(token_digest(token))


@app.command()
def settings(
    json_out: bool = typer.Option(False, "--json", help="Print the list as JSON instead."),
) -> None:
    """List every setting with its environment variable, default and meaning."""
    rows = [(f"UNDERSTUDY_{name.upper()}", _default(info), info.description or "")
            for name, info in Settings.model_fields.items()]  # fmt: skip
    if json_out:
        doc = [{"variable": v, "default": d, "meaning": m} for v, d, m in rows]
        typer.echo(json.dumps(doc, indent=2))
        return
    # A vertical list: the variable names alone are up to 40 columns wide.
    for variable, default, meaning in rows:
        console.print(f"[bold]{variable}[/] = {escape(default)}", soft_wrap=True)
        console.print(Padding(Text(" ".join(meaning.split())), (0, 0, 0, 4)))


def _default(info: FieldInfo) -> str:
    """A field's default as a user would write it in the environment."""
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "(unset)"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


app.add_typer(protocol_app, name="protocol")
app.add_typer(learning_app)  # train, compare, sweep as top-level commands
app.add_typer(evaluation_app)  # ope, evidence as top-level commands
app.add_typer(capacity_app)  # capacity: docs/capacity.md
app.add_typer(export_app)  # export: docs/export.md
app.add_typer(log_app, name="log")  # seal, verify, retire: docs/tamper_evidence.md

db_app = typer.Typer(cls=GuardedGroup, help="Decision-log database.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the decision-log schema (embedded PostgreSQL unless a URL is set)."""
    from service.storage import open_database, upgrade

    settings = Settings()
    if settings.database_url:
        parse_database_url(settings.database_url)
    with quiet_startup():
        url, _ = open_database(settings.database_url, settings.data_dir)
    upgrade(url)
    console.print("[green]decision log at the latest schema[/]")


@app.command()
def replay(
    request_id: str = typer.Option(..., "--request-id", help="Logged request to replay."),
    policy: str = typer.Option(..., "--policy", help="Policy whose decision to recompute."),
) -> None:
    """Recompute a logged decision from the stored raw request and compare."""
    from service.cli.replay import mask_table, replay_decision
    from service.contract.errors import NotFound
    from service.policies.registry import load_registry
    from service.storage import make_engine

    settings = Settings()
    url = decision_log_url(settings)
    with quiet_startup():
        registry = load_registry(settings.policies_dir)
    if policy not in registry.policies:
        console.print(
            f"[red]unknown policy `{policy}`; loaded: {', '.join(sorted(registry.policies))}"
        )
        raise typer.Exit(2)
    engine = make_engine(url)
    try:
        result = replay_decision(engine, request_id, registry.policies[policy])
    except NotFound as exc:
        console.print(f"[red]{exc}")
        raise typer.Exit(1) from exc
    finally:
        engine.dispose()
    table = Table("", "logged", "replayed", title=f"{policy} on {request_id}")
    table.add_row("feature hash", result.logged_feature_hash[:16], result.replay_feature_hash[:16])
    table.add_row("chosen option", str(result.logged_chosen), str(result.replay_chosen))
    table.add_row("max |score diff|", f"{result.max_score_diff:.2e}", "")
    table.add_row("max |probability diff|", f"{result.max_probability_diff:.2e}", "")
    console.print(table)
    console.print(mask_table(result))
    console.print(result.mask_verdict)
    console.print("[green]identical[/]" if result.matches else "[red]differs[/]")
    if not result.matches:
        raise typer.Exit(1)


@app.command()
def demo(
    episodes: int = typer.Option(16, min=1, help="Simulated episodes (about 160 requests each)."),
    duration: float = typer.Option(
        120.0, min=0.0, help="Seconds over which to spread the traffic."
    ),
    data_dir: str = typer.Option("out/demo", help="Where the demo keeps its journal and log."),
    seed: int = typer.Option(0, help="Simulation seed."),
) -> None:
    """Start the service; a simulated Runtime mirrors through the client; report."""
    from service.cli.demo import run_demo

    run_demo(episodes=episodes, duration_s=duration, data_dir=data_dir, console=console, seed=seed)


if __name__ == "__main__":
    app()
