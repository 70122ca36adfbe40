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
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Engine, create_engine

from service.storage.engine import CONNECT_TIMEOUT_S, database_status

CHECK_NAME = "database"


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
