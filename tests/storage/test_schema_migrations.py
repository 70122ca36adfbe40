"""The first migration, up from empty and back down; the Core tables match it."""

from __future__ import annotations

import warnings
from collections.abc import Callable

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Column, Engine, Integer, MetaData, create_engine, inspect, pool

from service.storage import (
    current_revision,
    database_healthy,
    downgrade,
    head_revision,
    make_engine,
    upgrade,
)
from service.storage.chain.tables import chain_blocks, chain_retirements, chain_state
from service.storage.log.tables import PARTITIONED_TABLES, metadata
from service.storage.reviewer.tables import REVIEWER_VIEWS, reviewer_access_log

TABLES = {
    "policies",
    "cluster_snapshots",
    "requests",
    "decisions",
    "outcomes",
    "pending_outcomes",
    "conflicts",
    "request_identities",
    reviewer_access_log.name,  # importing it puts it on `metadata` for the comparison
    chain_state.name,  # likewise the decision chain's tables (and decisions' chain columns)
    chain_blocks.name,
    chain_retirements.name,
}


def _tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names()) - {"alembic_version"}


def test_upgrade_from_empty_then_downgrade_to_nothing(fresh_db: Callable[[bool], str]) -> None:
    url = fresh_db(False)
    engine = make_engine(url)
    try:
        assert current_revision(engine) is None
        healthy, why = database_healthy(engine)
        assert not healthy and "understudy db upgrade" in why

        upgrade(url)
        assert current_revision(engine) == head_revision()
        assert database_healthy(engine) == (True, "ok")
        tables = _tables(engine)
        assert tables >= TABLES
        assert {f"{t}_default" for t in PARTITIONED_TABLES} <= tables

        upgrade(url)  # idempotent
        downgrade(url, "base")
        assert current_revision(engine) is None
        assert _tables(engine) == set()
        assert "outcome_log" not in inspect(engine).get_view_names()
        assert not set(REVIEWER_VIEWS) & set(inspect(engine).get_view_names())

        upgrade(url)  # and up again from base
        assert _tables(engine) >= TABLES
    finally:
        engine.dispose()


def _is_partition(obj: object, name: str | None, type_: str, reflected: bool, _: object) -> bool:
    """Partitions are made by DDL, not declared in metadata: leave them out."""
    if type_ == "table" and name is not None:
        return not (name.endswith("_default") or "_p2" in name or name == "alembic_version")
    return True


def test_core_tables_match_the_migrated_schema(db_url: str) -> None:
    engine = create_engine(db_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn, warnings.catch_warnings():
            # Alembic cannot compare expression indexes and says so; that is expected.
            warnings.filterwarnings("ignore", message=".*expression.*", category=UserWarning)
            ctx = MigrationContext.configure(
                conn,
                opts={"include_object": _is_partition, "compare_type": True},
            )
            diff = compare_metadata(ctx, metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_the_comparison_would_notice_a_drift(db_url: str) -> None:
    drifted = MetaData()
    for table in metadata.sorted_tables:
        table.to_metadata(drifted)
    drifted.tables["decisions"].append_column(Column("extra", Integer))
    engine = create_engine(db_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*expression.*", category=UserWarning)
            ctx = MigrationContext.configure(conn, opts={"include_object": _is_partition})
            diff = compare_metadata(ctx, drifted)
    finally:
        engine.dispose()
    assert [d[0] for d in diff] == ["add_column"]
