"""Run the Alembic migrations from code: ``understudy db upgrade`` calls `upgrade`.

The Alembic ``Config`` is built here, pointing at the repository's
``migrations/`` directory, so no ``alembic.ini`` is needed in the working
directory. The database URL travels in ``config.attributes`` rather than
``sqlalchemy.url`` because configparser would interpret any ``%`` in it.
"""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text

from service.storage.engine import unavailable_on_failure

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
"""``<repo>/migrations``: env.py and versions/."""


def alembic_config(database_url: str) -> Config:
    """An Alembic config for `database_url` with the repository's migrations."""
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise FileNotFoundError(
            f"migrations not found at {MIGRATIONS_DIR}; run from a source checkout "
            "(pip install -e .)"
        )
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.attributes["database_url"] = database_url
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Migrate the database at `database_url` up to `revision` (idempotent).

    Raises:
        Unavailable: the database cannot be reached.
    """
    with unavailable_on_failure("migrating"):
        command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    """Migrate down to `revision`; ``"base"`` drops every table of the decision log.

    Raises:
        Unavailable: the database cannot be reached.
    """
    with unavailable_on_failure("migrating"):
        command.downgrade(alembic_config(database_url), revision)


@functools.cache
def head_revision() -> str:
    """The newest migration revision in this checkout."""
    head = ScriptDirectory.from_config(alembic_config("")).get_current_head()
    if head is None:
        raise RuntimeError(f"no migrations in {MIGRATIONS_DIR}")
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None when it was never migrated."""
    with unavailable_on_failure("reading the schema revision"), engine.connect() as conn:
        exists = conn.execute(text("SELECT to_regclass('alembic_version') IS NOT NULL")).scalar()
        if not exists:
            return None
        value = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        return str(value) if value is not None else None
