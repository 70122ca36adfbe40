"""Every ```sql block of docs/reviewer.md runs as the reviewer role on a populated log."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text

from tests.storage.reviewer.conftest import World

DOC = Path(__file__).resolve().parents[3] / "docs" / "reviewer.md"
QUERIES = re.findall(r"^```sql\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def test_the_document_has_queries() -> None:
    assert len(QUERIES) >= 8


@pytest.mark.parametrize("query", QUERIES, ids=[f"sql{i}" for i in range(len(QUERIES))])
def test_documented_query_runs_as_the_reviewer(world: World, query: str) -> None:
    with psycopg.connect(world.reviewer_conninfo()) as conn:
        cursor = conn.execute(query)
        assert cursor.description is not None
        cursor.fetchall()
        conn.rollback()


def test_the_documented_agreement_query_counts_every_decision(world: World) -> None:
    with psycopg.connect(world.reviewer_conninfo()) as conn:
        rows = conn.execute(QUERIES[0]).fetchall()
    with world.engine.connect() as conn:  # as the service's role
        truth = conn.execute(
            text("SELECT policy_name, policy_version, count(*) FROM decisions GROUP BY 1, 2")
        ).all()
    assert {(r[0], r[1], r[2]) for r in rows} == {tuple(t) for t in truth}
    assert len(rows) >= world.n_policies
