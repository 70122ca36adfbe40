"""Shared fixtures: sample requests, the embedded database, a running service."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from hypothesis import settings as hypothesis_settings

from service.auth import token_digest
from service.contract import MirrorRequest
from service.environment.samples import sample_requests, shared_data_dir
from service.policies.registry import Registry
from service.server.app import Service, build_service
from service.settings import Settings
from service.wire.understudy.v1 import shadow_pb2_grpc
from tests.pg_fixtures import TEMPLATE, db_url, fresh_db, pg_dir, pg_home, pg_server

# CI runs the property tests and fuzzers derandomized, so a red build reproduces;
# local runs keep exploring new examples.
hypothesis_settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")

__all__ = ["TEMPLATE", "db_url", "fresh_db", "pg_dir", "pg_home", "pg_server"]


def pytest_configure(config: pytest.Config) -> None:
    """Register `live`: tests that drive a real service and wait on it (make test-busy)."""
    config.addinivalue_line(
        "markers",
        "live: drives a real service and waits on what it does; run under load by make test-busy",
    )


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


@pytest.fixture()
def make_service(
    tmp_data: Path, runtime_token: str, db_url: str
) -> Iterator[Callable[..., Service]]:
    """Factory: start a service with overrides; every one started is stopped.

    Each test's service logs to its own fresh database on the session's
    embedded PostgreSQL (see tests/pg_fixtures.py).
    """
    started: list[Service] = []

    def make(policies: Registry | None = None, **overrides: Any) -> Service:
        options: dict[str, Any] = {
            "database_url": db_url,
            "data_dir": tmp_data,
            "grpc_port": 0,
            "http_port": 0,
            "auth_tokens": {
                token_digest(runtime_token): "runtime",
                token_digest("r-tok"): "reviewer",
            },
            "journal_fsync": "never",
            # Pinned: the default `auto` spawns a scorer process per service on a
            # multi-core box, and hundreds of tests start services to test other
            # things (seconds each). Process mode's tests ask for it, and
            # tests/pipeline/test_scorer_mode.py runs the unpinned default.
            "scorer_mode": "thread",
        }
        settings = Settings(**(options | overrides))
        service = build_service(settings, policies=policies)
        service.start()
        service.wait_started()
        started.append(service)
        return service

    yield make
    for service in started:
        service.stop(grace=0.5)


@pytest.fixture()
def service(make_service: Callable[..., Service]) -> Service:
    """An ingest-only service (no scorer), so tests can read the journal untouched."""
    return make_service(scoring_enabled=False)


@pytest.fixture()
def grpc_channel(service: Service) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        yield channel


@pytest.fixture()
def stub(grpc_channel: grpc.Channel) -> shadow_pb2_grpc.ShadowEvaluationStub:
    return shadow_pb2_grpc.ShadowEvaluationStub(grpc_channel)  # type: ignore[no-untyped-call]


@pytest.fixture()
def auth(runtime_token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {runtime_token}"),)


@pytest.fixture()
def http(service: Service, runtime_token: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=f"http://127.0.0.1:{service.http_port}",
        headers={"authorization": f"Bearer {runtime_token}"},
        timeout=10,
    ) as client:
        yield client
