"""Storage test fixtures; the server and database fixtures are in tests/pg_fixtures.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from service.storage import make_engine


@pytest.fixture()
def engine(db_url: str) -> Iterator[Engine]:
    """An engine on the test's database."""
    eng = make_engine(db_url)
    yield eng
    eng.dispose()
