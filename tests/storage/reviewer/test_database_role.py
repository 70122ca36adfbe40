"""The ``understudy_reviewer`` role reads everything and writes nothing, partitions made later too.

Connects to the embedded server as the role itself (trust socket). Relations
are enumerated from the catalog, after a new day partition was created at
runtime, so a table or partition added later is covered without editing this
test. Writes are tried in READ WRITE transactions: the privileges, not the
read-only default, must refuse them.
"""

from __future__ import annotations

from datetime import date

import psycopg
import pytest
from psycopg import errors, sql
from sqlalchemy import text

from service.storage import ensure_partitions
from service.storage.reviewer.tables import REVIEWER_ROLE, REVIEWER_VIEWS
from tests.storage.reviewer.conftest import World

NEW_DAY = date(2031, 3, 7)
NEW_PARTITIONS = {f"{t}_p20310307" for t in ("requests", "decisions", "outcomes")}


def _relations(conn: psycopg.Connection) -> dict[str, str]:
    """Every table, partitioned table and view of the schema -> its relkind."""
    rows = conn.execute(
        "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v') ORDER BY c.relname"
    ).fetchall()
    return {str(name): str(kind) for name, kind in rows}


def _first_column(conn: psycopg.Connection, relation: str) -> str:
    """A column an UPDATE may name (identity columns are refused before privileges)."""
    row = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0"
        " AND NOT attisdropped AND attidentity = '' AND attgenerated = ''"
        " ORDER BY attnum LIMIT 1",
        (relation,),
    ).fetchone()
    assert row is not None, relation
    return str(row[0])


@pytest.fixture(scope="module")
def relations(world: World) -> dict[str, str]:
    ensure_partitions(world.engine, NEW_DAY, NEW_DAY)  # created at runtime, after 0004
    with psycopg.connect(world.reviewer_conninfo(), autocommit=True) as conn:
        found = _relations(conn)
    assert set(found) >= NEW_PARTITIONS
    assert set(REVIEWER_VIEWS) <= set(found)
    return found


def test_the_session_is_the_reviewer_role_and_starts_read_only(world: World) -> None:
    with psycopg.connect(world.reviewer_conninfo(), autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (REVIEWER_ROLE,)
        assert conn.execute("SHOW default_transaction_read_only").fetchone() == ("on",)
        with pytest.raises(errors.ReadOnlySqlTransaction):
            conn.execute("DELETE FROM decisions")


def test_every_relation_is_readable(world: World, relations: dict[str, str]) -> None:
    with psycopg.connect(world.reviewer_conninfo(), autocommit=True) as conn:
        counts = {
            name: conn.execute(
                sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(name))
            ).fetchone()
            for name in relations
        }
    with world.engine.connect() as conn:  # as the service's role
        decisions = conn.execute(text("SELECT count(*) FROM decisions")).scalar()
    assert decisions is not None and decisions >= len(world.sent) * world.n_policies
    assert counts["decisions"] == counts["reviewer_decisions"] == (decisions,)


@pytest.mark.parametrize("operation", ["INSERT", "UPDATE", "DELETE", "TRUNCATE"])
def test_no_write_succeeds_on_any_table_partition_or_view(
    world: World, relations: dict[str, str], operation: str
) -> None:
    refused: dict[str, str] = {}
    with psycopg.connect(world.reviewer_conninfo(), autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = off")  # the reviewer may; no matter
        for name in relations:
            target = sql.Identifier(name)
            column = sql.Identifier(_first_column(conn, name))
            statement = {
                "INSERT": sql.SQL("INSERT INTO {} DEFAULT VALUES").format(target),
                "UPDATE": sql.SQL("UPDATE {} SET {} = {}").format(target, column, column),
                "DELETE": sql.SQL("DELETE FROM {}").format(target),
                "TRUNCATE": sql.SQL("TRUNCATE {}").format(target),
            }[operation]
            try:
                conn.execute(statement)
            except psycopg.Error as exc:
                refused[name] = exc.sqlstate or ""
            else:
                refused[name] = "ALLOWED"
    tables = {n for n, k in relations.items() if k in ("r", "p")}
    assert set(refused) == set(relations)
    # Tables and partitions: refused for lack of privilege, nothing else.
    assert {n: s for n, s in refused.items() if n in tables and s != "42501"} == {}
    # Views: refused too (privilege, or a view that cannot take the operation at all).
    assert "ALLOWED" not in refused.values()


def test_the_reviewer_cannot_create_or_run_maintenance(world: World) -> None:
    with psycopg.connect(world.reviewer_conninfo(), autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = off")
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE reviewer_scratch (x int)")
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("SELECT understudy_ensure_partitions('2031-04-01', '2031-04-01')")
        conn.execute("GRANT INSERT ON decisions TO understudy_reviewer")  # only a warning
        row = conn.execute("SELECT has_table_privilege('decisions', 'INSERT')").fetchone()
        assert row == (False,)


def test_the_access_log_is_append_only_even_for_the_service_role(world: World) -> None:
    with world.client() as http:
        assert http.get("/v1/reviewer/experiments").status_code == 200
    url = world.server.url(world.database).replace("postgresql+psycopg", "postgresql")
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM reviewer_access_log").fetchone() != (0,)
        for statement in (
            "UPDATE reviewer_access_log SET principal = 'someone else'",
            "DELETE FROM reviewer_access_log",
            "TRUNCATE reviewer_access_log",
        ):
            with pytest.raises(errors.RaiseException, match="append-only"):
                conn.execute(statement)
