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

import psycopg
from sqlalchemy import Engine, create_engine, exc

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
