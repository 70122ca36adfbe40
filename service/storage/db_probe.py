"""The database health probe behind the `database` readiness check and `understudy_db_up`.

It has its own engine (one pooled connection), so a probe never waits for a
connection that the log writer holds, and the writer's pool never holds a
probe. A probe is bounded twice: libpq's ``connect_timeout`` and the
server's ``statement_timeout`` end it when the server is slow, and the
readiness round (`service.readiness`) counts it failed when it has not
answered within its bound — the only bound that holds when the server does
not run at all (every process SIGSTOPped), because then nothing on the
server side enforces a timeout.

`understudy_db_up` is set from these rounds: 1 when the probe answered,
0 when it failed or did not answer in time. Whether writes succeed is a
different question, answered by the ``decision_log`` readiness check.

`database_status` lives here rather than beside the engines because it
compares the schema with the migration head (`service.storage.migrate`),
and the migrations runner itself uses the engine's failure boundary: with
the check in ``engine.py`` the two modules would import each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, create_engine, exc, text

from service.contract.errors import Unavailable
from service.storage.engine import CONNECT_TIMEOUT_S, unavailable_on_failure
from service.storage.migrate import head_revision

CHECK_NAME = "database"


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


class DatabaseProbe:
    """A bounded health query on a dedicated one-connection engine.

    Args:
        database_url: the decision log's URL.
        timeout_s: the statement timeout of the probe, normally the readiness bound.
        override: a status that replaces the probe while set (e.g. the embedded
            server's "restarting (attempt 2)"), or None.
    """

    def __init__(
        self,
        database_url: str,
        timeout_s: float = 1.0,
        override: Callable[[], str | None] | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.engine: Engine = create_engine(
            database_url,
            pool_size=1,
            max_overflow=0,
            pool_timeout=timeout_s,
            pool_pre_ping=True,  # a connection left from before a restart is replaced
            connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
        )
        self._override = override
        self.reachable = False
        """Whether the last probe that returned reached the server."""

    def check(self) -> tuple[bool, str]:
        """The readiness check: (healthy, detail); may wait, so run it under a bound."""
        if self._override is not None:
            status = self._override()
            if status is not None:
                self.reachable = False
                return False, status
        found = database_status(self.engine, self.timeout_s)
        self.reachable = found.reachable
        return found.healthy, found.detail

    def up(self, answered: bool) -> float:
        """`understudy_db_up` after a round: 1 if the probe `answered` in time and reached
        the server, else 0."""
        return 1.0 if answered and self.reachable else 0.0

    def close(self) -> None:
        """Close the probe's connection."""
        self.engine.dispose()
