"""The `understudy` command line."""

from __future__ import annotations

import logging

import typer
from rich.console import Console
from rich.table import Table

from service.auth import token_digest
from service.settings import Settings

app = typer.Typer(
    help="Understudy: shadow evaluation of compute placement policies.", no_args_is_help=True
)
console = Console()


@app.command()
def serve(log_level: str = typer.Option("INFO", help="Python logging level.")) -> None:
    """Run the service (gRPC + HTTP) with settings from UNDERSTUDY_* variables."""
    from service.app import serve as run

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run(Settings())


@app.command("token-hash")
def token_hash(token: str = typer.Argument(..., help="The bearer token to store.")) -> None:
    """Print the sha256 digest to put in UNDERSTUDY_AUTH_TOKENS for `token`."""
    console.print(token_digest(token))


@app.command()
def settings() -> None:
    """List every setting with its environment variable, default and meaning."""
    table = Table("variable", "default", "meaning")
    for name, info in Settings.model_fields.items():
        table.add_row(f"UNDERSTUDY_{name.upper()}", repr(info.default), info.description or "")
    console.print(table)


@app.command()
def demo(
    requests: int = typer.Option(60, help="Sample requests to mirror."),
    data_dir: str = typer.Option("out/demo", help="Where the demo keeps its journal."),
) -> None:
    """Start the service, mirror sample requests built from ../shared/data, report."""
    from service.demo import run_demo

    run_demo(requests=requests, data_dir=data_dir, console=console)


if __name__ == "__main__":
    app()
