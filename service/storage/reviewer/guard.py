"""The reviewer guard: limits on direct ``understudy_reviewer`` sessions that the role cannot lift.

Why a guard, not settings: every timeout PostgreSQL has (``statement_timeout``,
``idle_in_transaction_session_timeout``, ``transaction_timeout``) is a user
setting, so a reviewer connected with psql can ``SET`` it off in their session,
and a role may always ``ALTER ROLE <itself> [IN DATABASE ...] SET ...`` its own
session defaults (no privilege governs that; tried on the embedded
PostgreSQL 18). The role's defaults (migrations 0004 and 0008) are what a
well-behaved session gets; this guard is what holds for any session:

- **sessions over the limit are ended.** A reviewer backend of this database
  whose transaction has been open longer than `transaction_limit_s`, or that
  has sat idle inside a transaction longer than `idle_limit_s`, is ended with
  ``pg_terminate_backend``: a forgotten ``BEGIN; SELECT ...`` cannot hold its
  locks (which would block partition maintenance and ``VACUUM``) for long.
- **role defaults are put back.** If the role's defaults differ from
  `ROLE_SETTINGS` (the role changed them itself), they are reset to it, and
  per-database defaults of the role in this database are removed.

The guard works as the reviewer role itself (``SET LOCAL ROLE``, the
membership migration 0004 grants the service's role): a role may end its own
backends and set its own defaults, so no superuser or ``pg_signal_backend``
is needed. Sessions the service opens for the reviewer API log in as the
service's role and are never touched; they are bounded by the API's own
``SET LOCAL statement_timeout``, which the reviewer cannot reach.

`ReviewerGuardLoop` runs a sweep every few seconds on a daemon thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text

from service.contract.errors import Unavailable
from service.storage.engine import unavailable_on_failure
from service.storage.periodic import PeriodicThread
from service.storage.reviewer.tables import REVIEWER_ROLE

log = logging.getLogger(__name__)

ROLE_SETTINGS: dict[str, str] = {
    "default_transaction_read_only": "on",
    "statement_timeout": "60s",
    "idle_in_transaction_session_timeout": "60s",
    "transaction_timeout": "5min",
}
"""The reviewer role's session defaults (migrations 0004, 0008). ``transaction_timeout``
exists from PostgreSQL 17; on older servers it is left out."""

TRANSACTION_LIMIT_S = 300.0
IDLE_LIMIT_S = 60.0

_OVER_THE_LIMIT = """
    SELECT pid,
           CASE WHEN state LIKE 'idle in transaction%'
                 AND state_change < clock_timestamp() - make_interval(secs => :idle)
                THEN 'idle' ELSE 'transaction' END AS reason
      FROM pg_stat_activity
     WHERE usename = :role AND datname = current_database() AND pid <> pg_backend_pid()
       AND (xact_start < clock_timestamp() - make_interval(secs => :txn)
            OR (state LIKE 'idle in transaction%'
                AND state_change < clock_timestamp() - make_interval(secs => :idle)))
"""

_ROLE_DEFAULTS = """
    SELECT s.setdatabase <> 0 AS in_database, s.setconfig
      FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole
     WHERE r.rolname = :role
       AND s.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database()))
"""


@dataclass(frozen=True, slots=True)
class Sweep:
    """What one sweep did: backends ended by reason, and whether role defaults were reset."""

    terminated: dict[str, int]
    settings_restored: bool


def role_settings(server_version_num: int) -> dict[str, str]:
    """`ROLE_SETTINGS` as the server supports them (``transaction_timeout``: 17+)."""
    if server_version_num >= 170_000:
        return dict(ROLE_SETTINGS)
    return {k: v for k, v in ROLE_SETTINGS.items() if k != "transaction_timeout"}


def _as_dict(config: list[str] | None) -> dict[str, str]:
    return dict(item.split("=", 1) for item in config or [])


class ReviewerGuard:
    """Ends over-limit reviewer sessions of `engine`'s database and keeps the role's defaults."""

    def __init__(
        self,
        engine: Engine,
        *,
        transaction_limit_s: float = TRANSACTION_LIMIT_S,
        idle_limit_s: float = IDLE_LIMIT_S,
    ) -> None:
        if transaction_limit_s <= 0 or idle_limit_s <= 0:
            raise ValueError(
                "`transaction_limit_s` and `idle_limit_s` must be > 0, got "
                f"{transaction_limit_s} and {idle_limit_s}"
            )
        self.engine = engine
        self.transaction_limit_s = transaction_limit_s
        self.idle_limit_s = idle_limit_s

    def sweep(self) -> Sweep:
        """One pass: end the sessions over the limit, then put the role's defaults back.

        Raises:
            Unavailable: the database cannot be reached.
        """
        with unavailable_on_failure("guarding reviewer sessions"), self.engine.begin() as conn:
            conn.execute(text(f"SET LOCAL ROLE {REVIEWER_ROLE}"))  # a constant
            terminated = self._terminate(conn)
            restored = self._restore_defaults(conn)
        return Sweep(terminated, restored)

    def _terminate(self, conn: Connection) -> dict[str, int]:
        over = conn.execute(
            text(_OVER_THE_LIMIT),
            {"role": REVIEWER_ROLE, "txn": self.transaction_limit_s, "idle": self.idle_limit_s},
        ).all()
        ended: dict[str, int] = {}
        for pid, reason in over:
            if conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar():
                ended[reason] = ended.get(reason, 0) + 1
                log.warning("ended reviewer session %s: %s over the limit", pid, reason)
        return ended

    def _restore_defaults(self, conn: Connection) -> bool:
        version = int(conn.execute(text("SHOW server_version_num")).scalar_one())
        wanted = role_settings(version)
        rows = conn.execute(text(_ROLE_DEFAULTS), {"role": REVIEWER_ROLE}).all()
        everywhere = next((_as_dict(c) for in_db, c in rows if not in_db), {})
        in_database = any(in_db for in_db, _ in rows)
        if everywhere == wanted and not in_database:
            return False
        if in_database:
            database = conn.execute(text("SELECT quote_ident(current_database())")).scalar_one()
            conn.execute(text(f"ALTER ROLE {REVIEWER_ROLE} IN DATABASE {database} RESET ALL"))
        if everywhere != wanted:
            conn.execute(text(f"ALTER ROLE {REVIEWER_ROLE} RESET ALL"))
            for name, value in wanted.items():  # constants of this module
                conn.execute(text(f"ALTER ROLE {REVIEWER_ROLE} SET {name} = '{value}'"))
        log.warning(
            "%s's role defaults were changed (%s; in this database: %s); put back",
            REVIEWER_ROLE,
            everywhere,
            in_database,
        )
        return True


class ReviewerGuardLoop:
    """Calls `guard.sweep()` every `interval_s` on a daemon thread until stopped.

    `on_sweep` gets each sweep's result, `on_failure` is called when a sweep
    fails (the database down); the loop itself never dies of a failed sweep.
    """

    def __init__(
        self,
        guard: ReviewerGuard,
        interval_s: float,
        on_sweep: Callable[[Sweep], None],
        on_failure: Callable[[], None],
    ) -> None:
        self._guard = guard
        self._on_sweep = on_sweep
        self._on_failure = on_failure
        self._thread = PeriodicThread("reviewer-guard", interval_s, self.tick)

    def tick(self) -> None:
        """One sweep, reported; never raises."""
        try:
            result = self._guard.sweep()
        except Unavailable as err:  # the database down: expected now and then, no traceback
            log.warning("reviewer guard: %s", err)
            self._on_failure()
            return
        except Exception:
            log.exception("guarding reviewer sessions failed")
            self._on_failure()
            return
        self._on_sweep(result)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and wait for it (a sweep in progress finishes)."""
        self._thread.stop(timeout_s)
