"""Every endpoint x every role, plus no token and a wrong token, on both transports.

Expected outcomes come from the declared rules (docs/ingest.md, docs/protocols.md):
ingest needs `runtime` (or `admin`); metrics and the API document need any role;
protocol reads need reviewer, safety or admin; decision-log reads (docs/reviewer.md)
reviewer or admin. Liveness and readiness are open.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import httpx
import pytest

from service.auth import token_digest
from service.contract import MirrorRequest
from service.server.app import Service
from service.transport.http.convert import mirror_to_json
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import contract_pb2, shadow_pb2

ROLES = ("runtime", "reviewer", "safety", "admin")
CALLERS = (*ROLES, "none", "wrong")
TOKENS = {role: f"{role}-token-for-the-matrix" for role in ROLES}

OK, UNAUTH, DENIED = "ok", "unauthenticated", "denied"


def expected(endpoint: str, caller: str) -> str:
    if caller in ("none", "wrong"):
        return OK if endpoint in ("healthz", "readyz") else UNAUTH
    if endpoint in ("healthz", "readyz", "metrics", "openapi"):
        return OK
    if endpoint.startswith("ingest"):
        return OK if caller in ("runtime", "admin") else DENIED
    if endpoint == "protocols-list":
        return OK if caller in ("reviewer", "safety", "admin") else DENIED
    if endpoint.startswith("reviewer-"):  # the decision-log read surface (docs/reviewer.md)
        return OK if caller in ("reviewer", "admin") else DENIED
    raise AssertionError(endpoint)


@pytest.fixture()
def matrix_service(make_service: Callable[..., Service]) -> Service:
    tokens = {token_digest(t): f"{role}:{role}-person" for role, t in TOKENS.items()}
    return make_service(auth_tokens=tokens)


def _header(caller: str) -> dict[str, str]:
    if caller == "none":
        return {}
    token = TOKENS.get(caller, "not-a-known-token")
    return {"authorization": f"Bearer {token}"}


def _http_outcome(response: httpx.Response, not_found_is_ok: bool = False) -> str:
    """`not_found_is_ok`: for a read of one request that is not logged, a 404 means the
    caller got past the role check (the role is checked before existence)."""
    if response.status_code == 401:
        return UNAUTH
    if response.status_code == 403:
        return DENIED
    if not_found_is_ok and response.status_code == 404:
        return OK
    assert response.status_code < 400, response.text
    return OK


def _grpc_outcome(call: Callable[[], object]) -> str:
    try:
        call()
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            return UNAUTH
        if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
            return DENIED
        raise
    return OK


def test_role_matrix(matrix_service: Service, requests_sample: list[MirrorRequest]) -> None:
    service = matrix_service
    base = f"http://127.0.0.1:{service.http_port}"
    mirror = mirror_request_to_pb(requests_sample[0])
    outcome = contract_pb2.Outcome(
        request_id="r", observed_at=1.7e9, failure=contract_pb2.FAILURE_KIND_NONE
    )
    got: dict[tuple[str, str], str] = {}
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        unary_mirror = channel.unary_unary(
            "/understudy.v1.ShadowEvaluation/Mirror",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=shadow_pb2.MirrorAck.FromString,
        )
        unary_outcome = channel.unary_unary(
            "/understudy.v1.ShadowEvaluation/ReportOutcome",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=shadow_pb2.OutcomeAck.FromString,
        )
        stream_mirror = channel.stream_stream(
            "/understudy.v1.ShadowEvaluation/MirrorStream",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=shadow_pb2.StreamAck.FromString,
        )
        stream_outcome = channel.stream_stream(
            "/understudy.v1.ShadowEvaluation/ReportOutcomeStream",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=shadow_pb2.StreamAck.FromString,
        )
        for caller in CALLERS:
            meta = tuple(_header(caller).items())
            env = shadow_pb2.MirrorStreamRequest(sequence=1, request=mirror)
            oenv = shadow_pb2.OutcomeStreamRequest(sequence=1, outcome=outcome)
            got[("ingest-grpc-mirror", caller)] = _grpc_outcome(
                lambda meta=meta: unary_mirror(mirror, metadata=meta, timeout=10)
            )
            got[("ingest-grpc-outcome", caller)] = _grpc_outcome(
                lambda meta=meta: unary_outcome(outcome, metadata=meta, timeout=10)
            )
            got[("ingest-grpc-mirror-stream", caller)] = _grpc_outcome(
                lambda meta=meta, env=env: list(
                    stream_mirror(iter([env]), metadata=meta, timeout=10)
                )
            )
            got[("ingest-grpc-outcome-stream", caller)] = _grpc_outcome(
                lambda meta=meta, oenv=oenv: list(
                    stream_outcome(iter([oenv]), metadata=meta, timeout=10)
                )
            )
    with httpx.Client(base_url=base, timeout=10) as http:
        for caller in CALLERS:
            headers = _header(caller)
            got[("ingest-http-mirror", caller)] = _http_outcome(
                http.post("/v1/mirror", content=mirror_to_json(requests_sample[0]), headers=headers)
            )
            got[("ingest-http-outcome", caller)] = _http_outcome(
                http.post(
                    "/v1/outcomes",
                    json={"request_id": "r", "observed_at": 1.7e9},
                    headers=headers,
                )
            )
            for endpoint, path in (
                ("healthz", "/healthz"),
                ("readyz", "/readyz"),
                ("metrics", "/metrics"),
                ("openapi", "/openapi.json"),
                ("protocols-list", "/v1/protocols"),
                ("reviewer-decisions", "/v1/reviewer/decisions"),
                ("reviewer-experiments", "/v1/reviewer/experiments"),
            ):
                got[(endpoint, caller)] = _http_outcome(http.get(path, headers=headers))
            for endpoint, path in (
                ("reviewer-request", "/v1/reviewer/requests/never-logged"),
                ("reviewer-feasibility", "/v1/reviewer/requests/never-logged/feasibility"),
            ):
                got[(endpoint, caller)] = _http_outcome(
                    http.get(path, headers=headers), not_found_is_ok=True
                )
    wrong = {k: (v, expected(k[0], k[1])) for k, v in got.items() if v != expected(k[0], k[1])}
    assert wrong == {}, wrong
    assert len(got) == 15 * len(CALLERS)
