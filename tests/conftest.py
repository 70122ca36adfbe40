"""Shared fixtures: sample requests from ../shared/data and a running service."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.contract import MirrorRequest
from service.samples import sample_requests, shared_data_dir
from tests.pg_fixtures import TEMPLATE, db_url, fresh_db, pg_dir, pg_home, pg_server

__all__ = ["TEMPLATE", "db_url", "fresh_db", "pg_dir", "pg_home", "pg_server"]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data sets; the suite needs them (CI lays ../shared beside the clone)."""
    path = shared_data_dir()
    assert path.is_dir(), f"shared data not found at {path}; set UNDERSTUDY_SHARED_DATA"
    return path


@pytest.fixture(scope="session")
def requests_sample(shared_data: Path) -> list[MirrorRequest]:
    """Thirty valid mirror requests built from the real inventory and trace."""
    return list(sample_requests(30, seed=3))


@pytest.fixture()
def runtime_token() -> str:
    """A fresh bearer token for the runtime role."""
    return secrets.token_urlsafe(16)


@pytest.fixture()
def tmp_data(tmp_path: Path) -> Iterator[Path]:
    """A data directory for one test."""
    yield tmp_path / "data"
