"""A populated decision log behind a running service, shared by the reviewer tests.

One real service (gRPC + uvicorn on loopback, the committed ONNX policies and
the baselines, its own database on the session's embedded PostgreSQL) with a
shadow experiment started over HTTP, then real sample requests mirrored over
HTTP — some of each workload kind — and outcomes reported for half of them.
Tests that add rows use their own policy names or partitions, so they do not
disturb each other's expectations.
"""

from __future__ import annotations

import dataclasses
import itertools
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy import Engine

from service.auth import token_digest
from service.contract import MirrorRequest, WorkloadKind
from service.server.app import Service, build_service
from service.settings import Settings
from service.storage import (
    EmbeddedPostgres,
    count_decisions,
    count_joined_outcomes,
    create_database,
    drop_database,
)
from service.transport.http.convert import mirror_to_json
from tests.live_traffic import wait_for
from tests.pg_fixtures import TEMPLATE

REPO = Path(__file__).resolve().parents[3]
ROLES = ("reviewer", "admin", "runtime", "safety")
TOKENS = {role: f"{role}-token-for-reviewer-tests" for role in ROLES}
PRINCIPALS = {"reviewer": "rita", "admin": "alice", "runtime": "runtime-1", "safety": "sam"}
EXPERIMENT = "gavel-scorer-shadow"
_names = itertools.count()


@dataclass(frozen=True)
class World:
    """The running service, its database, and what was sent to it."""

    service: Service
    engine: Engine
    url: str
    database: str
    server: EmbeddedPostgres
    sent: dict[str, MirrorRequest]
    with_outcome: frozenset[str]
    n_policies: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.service.http_port}"

    def client(self, role: str = "reviewer") -> httpx.Client:
        return httpx.Client(
            base_url=self.base,
            headers={"authorization": f"Bearer {TOKENS[role]}"},
            timeout=30,
        )

    def reviewer_url(self) -> str:
        """SQLAlchemy URL of this database as the read-only reviewer role."""
        return self.server.url(self.database).replace(
            "postgresql+psycopg://postgres:@", "postgresql+psycopg://understudy_reviewer:@"
        )

    def reviewer_conninfo(self) -> str:
        """libpq conninfo of this database as the reviewer role."""
        return f"dbname={self.database} host={self.server.socket_dir} user=understudy_reviewer"


def _kinds(requests: list[MirrorRequest]) -> list[MirrorRequest]:
    """The samples are all training jobs; give some every other kind, and unique ids."""
    kinds = list(WorkloadKind)
    out = []
    for i, r in enumerate(requests):
        workload = dataclasses.replace(r.workload, kind=kinds[i % len(kinds)])
        out.append(dataclasses.replace(r, request_id=f"rv-{i}", workload=workload))
    return out


@pytest.fixture(scope="package")
def world(pg_server: EmbeddedPostgres, requests_sample: list[MirrorRequest]) -> Iterator[World]:
    database = f"reviewer_{next(_names)}"
    url = create_database(pg_server.url(), database, template=TEMPLATE)
    data_dir = Path(tempfile.mkdtemp(prefix="understudy-reviewer-"))
    settings = Settings(
        database_url=url,
        data_dir=data_dir,
        grpc_port=0,
        http_port=0,
        auth_tokens={token_digest(TOKENS[r]): f"{r}:{PRINCIPALS[r]}" for r in ROLES},
        journal_fsync="never",
        evaluator_enabled=False,
    )
    service = build_service(settings)
    service.start()
    service.wait_started()
    try:
        assert service.engine is not None and service.policies is not None
        engine = service.engine
        document = yaml.safe_load((REPO / "protocols" / f"{EXPERIMENT}.yaml").read_text())
        requests = _kinds(requests_sample)
        with httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as http:
            admin = {"authorization": f"Bearer {TOKENS['admin']}"}
            started = http.post(
                f"/v1/protocols/{EXPERIMENT}/versions/1/start",
                json={"reason": "reviewer tests", "document": document},
                headers=admin,
            )
            assert started.status_code == 200, started.text
            runtime = {"authorization": f"Bearer {TOKENS['runtime']}"}
            for r in requests:
                ack = http.post("/v1/mirror", content=mirror_to_json(r), headers=runtime)
                assert ack.json()["status"] == "accepted", ack.text
            reported = [r.request_id for r in requests[::2]]
            for i, request_id in enumerate(reported):
                body = {
                    "request_id": request_id,
                    "observed_at": 1.7e9 + 3600 + i,
                    "queue_delay_s": 1.0 + i,
                    "throughput": 2.0,
                    "completion_time_s": 600.0,
                    "slo_met": i % 3 != 0,
                }
                ack = http.post("/v1/outcomes", json=body, headers=runtime)
                assert ack.status_code == 202, ack.text
        n_policies = len(service.policies.policies)
        wait_for(lambda: count_decisions(engine) == len(requests) * n_policies, "scoring")
        wait_for(lambda: count_joined_outcomes(engine) == len(reported), "outcome joins")
        yield World(
            service=service,
            engine=engine,
            url=url,
            database=database,
            server=pg_server,
            sent={r.request_id: r for r in requests},
            with_outcome=frozenset(reported),
            n_policies=n_policies,
        )
    finally:
        service.stop(grace=0.5)
        drop_database(pg_server.url(), database)
        shutil.rmtree(data_dir, ignore_errors=True)
