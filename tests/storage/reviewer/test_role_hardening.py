"""The reviewer role has no power beyond reading: no advisory locks, no large objects, no
lasting role defaults of its own.

Each test connects as ``understudy_reviewer`` to the running service's real
database (trust socket) and tries what a reviewer once could: take the
sealer's advisory lock (sealing stopped, ``log verify`` hung), create large
objects after ``SET default_transaction_read_only = off``, and change its own
role defaults (``ALTER ROLE ... SET``). PostgreSQL lets any role change its
own defaults — no privilege governs that — so what must hold there is that
the service puts them back (its reviewer guard), counted in a metric.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors, sql
from sqlalchemy import text

from service.storage.chain.seal import SEAL_LOCK
from tests.live_traffic import wait_for
from tests.storage.reviewer.conftest import World

ADVISORY = [
    "SELECT pg_advisory_lock(hashtext(%(k)s))",
    "SELECT pg_try_advisory_lock(hashtext(%(k)s))",
    "SELECT pg_advisory_lock_shared(hashtext(%(k)s))",
    "SELECT pg_try_advisory_lock_shared(hashtext(%(k)s))",
    "SELECT pg_advisory_xact_lock(hashtext(%(k)s))",
    "SELECT pg_try_advisory_xact_lock(hashtext(%(k)s))",
    "SELECT pg_try_advisory_lock(1, 2)",
]

LARGE_OBJECTS = [
    "SELECT lo_create(0)",
    "SELECT lo_creat(-1)",
    "SELECT lo_from_bytea(0, 'x'::bytea)",
    "SELECT lo_import('/etc/hostname')",
]

DEFAULTS = {
    "default_transaction_read_only": "on",
    "statement_timeout": "60s",
    "idle_in_transaction_session_timeout": "60s",
    "transaction_timeout": "5min",
}
"""The role's defaults (migrations 0004 and 0008; docs/reviewer.md)."""


def _refused(conn: psycopg.Connection, statements: list[str]) -> dict[str, str]:
    """SQLSTATE per statement ("ALLOWED" if it ran), each in its own transaction."""
    got = {}
    for statement in statements:
        try:
            with conn.transaction():
                conn.execute(statement, {"k": SEAL_LOCK})
        except psycopg.Error as exc:
            got[statement] = exc.sqlstate or type(exc).__name__
        else:
            got[statement] = "ALLOWED"
    return got


def test_the_reviewer_cannot_take_the_sealers_or_any_advisory_lock(world: World) -> None:
    with psycopg.connect(world.reviewer_conninfo(), autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = off")
        got = _refused(conn, ADVISORY)
    assert got == dict.fromkeys(ADVISORY, "42501")  # insufficient_privilege
    # The service's role still takes advisory locks (the sealer, `log verify`, partition
    # creation); another key than the sealer's, which the running sealer may hold right now.
    key = "understudy_reviewer_test"
    with world.engine.connect() as conn:
        taken = conn.execute(text("SELECT pg_try_advisory_lock(hashtext(:k))"), {"k": key})
        assert taken.scalar() is True
        conn.execute(text("SELECT pg_advisory_unlock(hashtext(:k))"), {"k": key})


def test_the_reviewer_cannot_create_large_objects_even_read_write(world: World) -> None:
    with psycopg.connect(world.reviewer_conninfo(), autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = off")
        got = _refused(conn, LARGE_OBJECTS)
    assert got == dict.fromkeys(LARGE_OBJECTS, "42501")
    with world.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM pg_largeobject_metadata")).scalar() == 0


def _role_defaults(world: World) -> tuple[dict[str, str], bool]:
    """The role's defaults everywhere, and whether it has any in this database."""
    with world.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT s.setdatabase <> 0, s.setconfig FROM pg_db_role_setting s"
                " JOIN pg_roles r ON r.oid = s.setrole WHERE r.rolname = 'understudy_reviewer'"
                " AND s.setdatabase IN (0, (SELECT oid FROM pg_database"
                " WHERE datname = current_database()))"
            )
        ).all()
    everywhere = next((dict(c.split("=", 1) for c in cfg) for in_db, cfg in rows if not in_db), {})
    return everywhere, any(in_db for in_db, _ in rows)


def test_role_defaults_the_reviewer_changes_are_put_back(world: World) -> None:
    value = world.service.metrics.registry.get_sample_value
    restored_before = value("understudy_reviewer_role_settings_restored_total") or 0.0
    assert _role_defaults(world) == (DEFAULTS, False)
    try:
        with psycopg.connect(world.reviewer_conninfo(), autocommit=True) as conn:
            conn.execute("SET default_transaction_read_only = off")
            # PostgreSQL lets a role change its own defaults; what holds is below.
            conn.execute("ALTER ROLE understudy_reviewer RESET statement_timeout")
            conn.execute("ALTER ROLE understudy_reviewer SET work_mem = '1GB'")
            conn.execute(
                sql.SQL(
                    "ALTER ROLE understudy_reviewer IN DATABASE {} SET"
                    " default_transaction_read_only = off"
                ).format(sql.Identifier(world.database))
            )
        # (No check that they took: the guard may already have put them back.)
        wait_for(lambda: _role_defaults(world) == (DEFAULTS, False), "the defaults put back")
        with psycopg.connect(world.reviewer_conninfo(), autocommit=True) as conn:
            shown = {
                name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                for name in DEFAULTS
            }
        assert shown == {
            "default_transaction_read_only": "on",
            "statement_timeout": "1min",
            "idle_in_transaction_session_timeout": "1min",
            "transaction_timeout": "5min",
        }
        assert (value("understudy_reviewer_role_settings_restored_total") or 0) > restored_before
    finally:  # whatever happened, leave the cluster-wide role as the migrations made it
        with world.engine.begin() as conn:
            conn.execute(
                text(f'ALTER ROLE understudy_reviewer IN DATABASE "{world.database}" RESET ALL')
            )
            conn.execute(text("ALTER ROLE understudy_reviewer RESET ALL"))
            for name, setting in DEFAULTS.items():
                conn.execute(text(f"ALTER ROLE understudy_reviewer SET {name} = '{setting}'"))


def test_a_reviewer_session_that_lifts_its_timeouts_still_reads_only(world: World) -> None:
    with psycopg.connect(world.reviewer_conninfo(), autocommit=True) as conn:
        for name in ("statement_timeout", "idle_in_transaction_session_timeout"):
            conn.execute(f"SET {name} = 0")  # a user setting: any session may
        conn.execute("SET transaction_timeout = 0")
        assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)
        conn.execute("SET default_transaction_read_only = off")
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("DELETE FROM decisions")
