"""Embedded PostgreSQL fixtures: one server per session, a fresh database per test.

Each test gets its own database cloned from a migrated template, so tests
never see each other's rows and never pay for a migration.

The data directories live in their own ``mkdtemp`` directories, not under
pytest's ``tmp_path``: as root, pgserver runs the server as the ``pgserver``
user, which needs o+x on every parent, and every pytest session that starts
(other engineers', CI shards) resets ``/tmp/pytest-of-root`` to 0700 — which
would cut a running server off from its own files.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, pool, text

from service.storage import (
    EmbeddedPostgres,
    create_database,
    drop_database,
    start_embedded,
    stop_embedded,
    upgrade,
    url_with_database,
)

TEMPLATE = "understudy_template"
_names = itertools.count()


@contextmanager
def pg_home() -> Iterator[Path]:
    """A private temp directory for one server's data directory; removed afterwards."""
    home = Path(tempfile.mkdtemp(prefix="understudy-pg-"))
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture()
def pg_dir() -> Iterator[Path]:
    """Where a test may start its own embedded server (``<home>/data``)."""
    with pg_home() as home:
        yield home / "data"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[EmbeddedPostgres]:
    """The session's embedded server; stopped at the end of the session."""
    with pg_home() as home:
        yield from _session_server(home / "data")


def _session_server(data_dir: Path) -> Iterator[EmbeddedPostgres]:
    server = start_embedded(data_dir)
    # Test-only: durability is not under test here, speed is welcome on 2 cores.
    engine = create_engine(server.url(), poolclass=pool.NullPool, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("ALTER SYSTEM SET fsync = off"))
        conn.execute(text("ALTER SYSTEM SET synchronous_commit = off"))
        conn.execute(text("SELECT pg_reload_conf()"))
    engine.dispose()
    create_database(server.url(), TEMPLATE)
    upgrade(url_with_database(server.url(), TEMPLATE))
    try:
        yield server
    finally:
        stop_embedded(data_dir)


@pytest.fixture()
def fresh_db(pg_server: EmbeddedPostgres) -> Iterator[Callable[[bool], str]]:
    """Factory: a new database (migrated, or empty) for this test; dropped afterwards."""
    made: list[str] = []

    def make(migrated: bool = True) -> str:
        name = f"t_{next(_names)}"
        made.append(name)
        return create_database(pg_server.url(), name, template=TEMPLATE if migrated else None)

    yield make
    for name in made:
        drop_database(pg_server.url(), name)


@pytest.fixture()
def db_url(fresh_db: Callable[[bool], str]) -> str:
    """URL of a migrated, empty database for this test."""
    return fresh_db(True)
