"""The decision log a short `make demo` leaves, for the tests that read it with the CLI."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from service.cli.demo import run_demo
from service.storage import stop_embedded
from service.storage.admin import EMBEDDED_SUBDIR
from tests.pg_fixtures import pg_home


@contextmanager
def short_demo_log(episodes: int = 2, duration_s: float = 2.0) -> Iterator[Path]:
    """A real demo run (service, embedded PostgreSQL, simulated Runtime) into a private
    data directory; yields it with the server stopped, as the demo leaves it, and stops
    whatever server a command started there afterwards."""
    with pg_home() as home:
        root = home / "demo"
        quiet = Console(file=io.StringIO())
        run_demo(episodes=episodes, duration_s=duration_s, data_dir=str(root), console=quiet)
        try:
            yield root
        finally:
            stop_embedded(root / EMBEDDED_SUBDIR)
