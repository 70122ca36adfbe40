"""Health, reflection, readiness, metrics, OpenAPI, and outcomes on every path."""

from __future__ import annotations

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from pydantic import ValidationError

from service.pipeline.journal_format import RecordKind
from service.server.app import Service
from service.settings import Settings
from service.wire.understudy.v1 import contract_pb2, shadow_pb2, shadow_pb2_grpc


def test_grpc_health_and_reflection(grpc_channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(grpc_channel)  # type: ignore[no-untyped-call]
    reply = health.Check(health_pb2.HealthCheckRequest(service="understudy.v1.ShadowEvaluation"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflect = reflection_pb2_grpc.ServerReflectionStub(grpc_channel)  # type: ignore[no-untyped-call]
    responses = reflect.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert {"understudy.v1.ShadowEvaluation", "grpc.health.v1.Health"} <= names


def test_http_liveness_readiness_metrics_and_openapi(service: Service, http: httpx.Client) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    ready = http.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"][0]["name"] == "journal"
    service.readiness.register("database", lambda: (False, "connection refused"))
    not_ready = http.get("/readyz")
    assert not_ready.status_code == 503
    assert {"name": "database", "ok": False, "detail": "connection refused"} in not_ready.json()[
        "checks"
    ]
    metrics = http.get("/metrics").text
    assert "understudy_journal_capacity_bytes" in metrics
    spec = http.get("/openapi.json").json()
    body = spec["paths"]["/v1/mirror"]["post"]["requestBody"]["content"]["application/json"]
    assert "options" in body["schema"]["properties"]
    assert "/v1/outcomes" in spec["paths"]


def test_outcomes_arrive_on_every_path(
    service: Service,
    stub: shadow_pb2_grpc.ShadowEvaluationStub,
    http: httpx.Client,
    auth: tuple[tuple[str, str], ...],
) -> None:
    def outcome(i: int) -> contract_pb2.Outcome:
        return contract_pb2.Outcome(
            request_id=f"r-{i}",
            observed_at=1.7e9 + i,
            completion_time_s=100.0 + i,
            failure=contract_pb2.FAILURE_KIND_NONE,
            production=contract_pb2.ProductionDecision(option=2, propensity=0.5),
        )

    assert stub.ReportOutcome(outcome(0), metadata=auth).status == shadow_pb2.ACK_STATUS_ACCEPTED
    stream = iter([shadow_pb2.OutcomeStreamRequest(sequence=k, outcome=outcome(k)) for k in (1, 2)])
    assert list(stub.ReportOutcomeStream(stream, metadata=auth))[-1].accepted == 2
    response = http.post(
        "/v1/outcomes", json={"request_id": "r-3", "observed_at": 1.7e9, "failure": "oom"}
    )
    assert response.status_code == 202, response.text
    bad = http.post(
        "/v1/outcomes", json={"request_id": "r-4", "observed_at": 1.7e9, "throughput": -1}
    )
    assert bad.status_code == 400 and bad.json()["field"] == "throughput"
    with pytest.raises(grpc.RpcError) as err:
        # A `failure` outside the enum is refused; an absent one means "none" (as on HTTP).
        unknown = contract_pb2.Outcome(request_id="r-5", observed_at=1.7e9, failure=42)  # type: ignore[arg-type]
        stub.ReportOutcome(unknown, metadata=auth)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "`failure`" in (
        err.value.details() or ""
    )
    records = service.journal.read("scorer", 100)
    assert [r.kind for r in records] == [RecordKind.OUTCOME] * 4
    ids = [contract_pb2.Outcome.FromString(r.payload).request_id for r in records]
    assert ids == ["r-0", "r-1", "r-2", "r-3"]


def test_settings_refuse_raw_tokens() -> None:
    with pytest.raises(ValidationError, match="sha256"):
        Settings(auth_tokens={"my-secret-token": "runtime"})
