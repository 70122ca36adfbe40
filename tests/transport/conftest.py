"""A real service (gRPC + uvicorn on loopback, journal on disk) per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from service.app import Service, build_service
from service.auth import token_digest
from service.policies.registry import Registry
from service.settings import Settings
from service.wire.understudy.v1 import shadow_pb2_grpc


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
        overrides.setdefault("database_url", db_url)
        settings = Settings(
            data_dir=tmp_data,
            grpc_port=0,
            http_port=0,
            auth_tokens={token_digest(runtime_token): "runtime", token_digest("r-tok"): "reviewer"},
            journal_fsync="never",
            **overrides,
        )
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
