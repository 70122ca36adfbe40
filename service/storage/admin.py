"""Database administration: choose the database, create and drop databases.

`open_database` is what the composition root and ``understudy db upgrade``
call: the configured URL if there is one, else the embedded server under the
data directory. `create_database`/`drop_database` let tests (and operators)
give each run its own database on one server; cloning a migrated template
database is much faster than migrating each time.
"""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy import create_engine, make_url, pool, text

from service.storage.embedded import EmbeddedPostgres, start_embedded
from service.storage.engine import unavailable_on_failure

EMBEDDED_SUBDIR = "postgres"
"""The embedded server's data directory inside the service's data directory."""

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def open_database(database_url: str | None, data_dir: Path) -> tuple[str, EmbeddedPostgres | None]:
    """The URL to use, and the embedded server when one was started for it.

    Args:
        database_url: ``UNDERSTUDY_DATABASE_URL``; None or empty means embedded.
        data_dir: ``UNDERSTUDY_DATA_DIR``; the embedded server lives in
            ``<data_dir>/postgres`` (created on first use).
    """
    if database_url:
        return database_url, None
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    server = start_embedded(data_dir / EMBEDDED_SUBDIR)
    return server.url(), server


def url_with_database(url: str, database: str) -> str:
    """`url` pointing at another database on the same server."""
    return make_url(url).set(database=database).render_as_string(hide_password=False)


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"`name` must match {_NAME.pattern}, got {name!r}")
    return name


def create_database(url: str, name: str, *, template: str | None = None) -> str:
    """Create database `name` on `url`'s server (from `template` if given); return its URL.

    The template must have no open connections (dispose its engines first).
    """
    statement = f'CREATE DATABASE "{_check_name(name)}"'
    if template is not None:
        statement += f' TEMPLATE "{_check_name(template)}" STRATEGY FILE_COPY'
    _autocommit(url, statement)
    return url_with_database(url, name)


def drop_database(url: str, name: str) -> None:
    """Drop database `name` if it exists, disconnecting its sessions."""
    _autocommit(url, f'DROP DATABASE IF EXISTS "{_check_name(name)}" WITH (FORCE)')


def _autocommit(url: str, statement: str) -> None:
    engine = create_engine(url, poolclass=pool.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with unavailable_on_failure("administering databases"), engine.connect() as conn:
            conn.execute(text(statement))
    finally:
        engine.dispose()
