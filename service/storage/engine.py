"""Engines, and the boundary where database failures become `Unavailable`.

Everything in ``service.storage`` that talks to PostgreSQL runs inside
`unavailable_on_failure`, so callers (the scorer's log writer, ``/readyz``,
the CLI) see one domain error for "the database is down or unreachable" —
`service.contract.errors.Unavailable`, with the driver's exception as its
``__cause__`` — and never import psycopg or SQLAlchemy to handle it. Errors
that are not about reachability (a constraint violation, a bad statement)
are bugs and propagate unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from sqlalchemy import Engine, create_engine, exc, text

from service.contract.errors import Unavailable

CONNECT_TIMEOUT_S = 2
"""libpq connect timeout (its minimum); a down server on a Unix socket fails at once."""

_UNREACHABLE: tuple[type[BaseException], ...] = (
    exc.OperationalError,
    exc.InterfaceError,
    exc.DisconnectionError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)


def make_engine(database_url: str, *, pool_size: int = 4) -> Engine:
    """An engine for `database_url` (``postgresql+psycopg://...``).

    ``pool_pre_ping`` makes the first use after a database restart reconnect
    instead of failing on a dead pooled connection, so the writer recovers by
    itself once the server is back.
    """
    return create_engine(
        database_url,
        pool_size=pool_size,
        max_overflow=2,
        pool_pre_ping=True,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
    )


@contextmanager
def unavailable_on_failure(action: str) -> Iterator[None]:
    """Re-raise connection-level failures inside the block as `Unavailable`.

    `action` completes the message: "database unavailable while `action`: ...".
    """
    try:
        yield
    except _UNREACHABLE as err:
        cause = getattr(err, "orig", None) or err
        detail = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        raise Unavailable(f"database unavailable while {action}: {detail}") from err


@dataclass(frozen=True, slots=True)
class DatabaseStatus:
    """What one health query found.

    Attributes:
        reachable: the server answered (a connection opened and a statement ran).
        healthy: reachable and the schema is at the migration head.
        detail: "ok", or why not.
    """

    reachable: bool
    healthy: bool
    detail: str


def database_status(engine: Engine, timeout_s: float = 1.0) -> DatabaseStatus:
    """Whether the server answers, and whether the decision log can be written now.

    Checks that a connection opens, a statement runs within `timeout_s`, and
    the schema is at the migration head (a service on an old schema would
    fail every write). Never raises. The statement timeout is enforced by the
    server: a server that is stopped (SIGSTOP) does not answer at all, so
    callers that must not wait run this under their own bound
    (`service.storage.db_probe`, `service.readiness`).
    """
    from service.storage.migrate import head_revision  # alembic import only when asked

    try:
        with unavailable_on_failure("checking health"), engine.connect() as conn:
            # SET LOCAL ends with the transaction, so the pooled connection keeps no trace.
            conn.execute(text(f"SET LOCAL statement_timeout = {max(1, int(timeout_s * 1000))}"))
            try:
                revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
            except exc.ProgrammingError:  # no alembic_version table: never migrated
                revision = None
            conn.rollback()
    except Unavailable as err:
        return DatabaseStatus(False, False, str(err))
    except exc.SQLAlchemyError as err:  # anything else: report, /readyz must not crash
        return DatabaseStatus(False, False, f"database check failed: {err}")
    head = head_revision()
    if revision != head:
        return DatabaseStatus(
            True,
            False,
            f"database schema is at revision {revision or 'none'}, expected {head}; "
            "run `understudy db upgrade`",
        )
    return DatabaseStatus(True, True, "ok")


def database_healthy(engine: Engine, timeout_s: float = 1.0) -> tuple[bool, str]:
    """Whether the decision log can be written now, and why not (`database_status`)."""
    status = database_status(engine, timeout_s)
    return status.healthy, status.detail
