"""Alembic environment for the decision log.

There is no ``alembic.ini``: `service.storage.migrate` builds the Config in
code and passes the database URL in ``config.attributes["database_url"]``
(or an open connection in ``config.attributes["connection"]``), so
``understudy db upgrade`` works from any working directory.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from service.storage.log.tables import metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit the SQL instead of running it (``alembic upgrade --sql``)."""
    context.configure(
        url=config.attributes["database_url"],
        target_metadata=metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run against the given connection, or a fresh engine on the given URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.attributes["database_url"], poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
