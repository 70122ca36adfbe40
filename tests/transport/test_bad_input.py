"""Bad input, as a table: refused with a status naming the field, counted, and harmless.

Each row mutates a valid request, sends it over gRPC unary and HTTP, checks the
status and that the message names the field, that the rejection was counted,
and that the next valid request is still accepted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc
import httpx
import pytest

from service.contract import MirrorRequest
from service.server.app import Service
from service.transport.http.convert import mirror_to_json
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import contract_pb2, shadow_pb2, shadow_pb2_grpc

Proto = contract_pb2.MirrorRequest
Body = dict[str, Any]


def _many_options(n: int) -> tuple[Callable[[Proto], None], Callable[[Body], None]]:
    def proto(m: Proto) -> None:
        del m.options.node_offsets[:], m.options.node_index[:], m.options.accelerators[:]
        del m.options.option_ids[:]
        m.options.node_offsets.extend(range(n + 1))
        m.options.node_index.extend([0] * n)
        m.options.accelerators.extend([1] * n)

    def body(b: Body) -> None:
        b["options"] = {
            "node_offsets": list(range(n + 1)),
            "node_index": [0] * n,
            "accelerators": [1] * n,
        }

    return proto, body


def _set_first(field: str, value: Any) -> tuple[Callable[[Proto], None], Callable[[Body], None]]:
    def proto(m: Proto) -> None:
        getattr(m.state, field)[0] = value

    def body(b: Body) -> None:
        b["state"][field][0] = value

    return proto, body


def _dup(m: Proto) -> None:
    m.state.node_ids[1] = m.state.node_ids[0]


def _dup_body(b: Body) -> None:
    b["state"]["node_ids"][1] = b["state"]["node_ids"][0]


def _text(path: str, value: str) -> tuple[Callable[[Proto], None], Callable[[Body], None]]:
    """Set a string at `path` ("state.zone.0": the first zone; "...+": append) on both forms."""
    *parents, last = path.split(".")

    def proto(m: Proto) -> None:
        _put(m, parents, last, value)

    def body(b: Body) -> None:
        _put(b, parents, last, value)

    return proto, body


def _put(root: Any, parents: list[str], last: str, value: str) -> None:
    for name in parents:
        if name.isdigit():
            root = root[int(name)]
        else:
            root = root[name] if isinstance(root, dict) else getattr(root, name)
    if last == "+":
        root.append(value)
    elif last.isdigit():
        root[int(last)] = value
    elif isinstance(root, dict):
        root[last] = value
    else:
        setattr(root, last, value)


# (case id, where the string goes, field named): NUL and other C0 controls in every
# string of the contract (service.contract.text); issue 20 item 9 found most accepted.
CONTROL_CASES = [
    ("NUL in a node id", "state.node_ids.0", "`state.node_ids[0]`"),
    ("NUL in a zone", "state.zone.0", "`state.zone[0]`"),
    ("NUL in a locality", "state.locality.0", "`state.locality[0]`"),
    ("NUL in a label", "state.labels.0", "`state.labels` of node 0"),
    ("NUL in a hardware name", "state.hardware.0.name", "`state.hardware[0].name`"),
    ("NUL in an option id", "options.option_ids.0", "`options.option_ids[0]`"),
    ("NUL in allowed hardware", "workload.allowed_hardware.+", "`workload.allowed_hardware`"),
    ("NUL in affinity", "workload.affinity.+", "`workload.affinity`"),
    ("NUL in anti-affinity", "workload.anti_affinity.+", "`workload.anti_affinity`"),
    ("NUL in the model family", "workload.model_family", "`workload.model_family`"),
    ("NUL in the workload id", "workload.workload_id", "`workload.workload_id`"),
    ("newline in a node id", "state.node_ids.1", "`state.node_ids[1]`"),
    ("escape in a zone", "state.zone.2", "`state.zone[2]`"),
    ("tab in the tenant", "workload.tenant", "`workload.tenant`"),
    ("unit separator in an option id", "options.option_ids.3", "`options.option_ids[3]`"),
]
_CONTROL_VALUES = {"NUL": "a\x00b", "newline": "a\nb", "escape": "a\x1b[31m", "tab": "a\tb"}


def _control_rows() -> list[
    tuple[str, Callable[[Proto], None], Callable[[Body], None], grpc.StatusCode, int, str]
]:
    rows = []
    for case, path, named in CONTROL_CASES:
        value = _CONTROL_VALUES.get(case.split()[0], "a\x1fb")
        rows.append((case, *_text(path, value), grpc.StatusCode.INVALID_ARGUMENT, 400, named))
    return rows


BIG = "x" * (10 * 1024 * 1024)

# (case id, proto mutation, JSON mutation, gRPC code, HTTP status, field named in message)
CASES: list[
    tuple[str, Callable[[Proto], None], Callable[[Body], None], grpc.StatusCode, int, str]
] = [
    (
        "missing state",
        lambda m: m.ClearField("state"),
        lambda b: b.pop("state"),
        grpc.StatusCode.INVALID_ARGUMENT,
        400,
        "`state`",
    ),
    (
        "missing request id",
        lambda m: m.ClearField("request_id"),
        lambda b: b.pop("request_id"),
        grpc.StatusCode.INVALID_ARGUMENT,
        400,
        "`request_id`",
    ),
    (
        "nan cpu",
        *_set_first("cpu_free", float("nan")),
        grpc.StatusCode.INVALID_ARGUMENT,
        400,
        "`state.cpu_free[0]`",
    ),
    (
        "inf memory",
        *_set_first("memory_free_gb", float("inf")),
        grpc.StatusCode.INVALID_ARGUMENT,
        400,
        "`state.memory_free_gb[0]`",
    ),
    (
        "inf request time",
        lambda m: setattr(m, "request_time", float("inf")),
        lambda b: b.update(request_time=float("inf")),
        grpc.StatusCode.INVALID_ARGUMENT,
        400,
        "`request_time`",
    ),
    (
        "negative capacity",
        *_set_first("accelerators_free", -1),
        grpc.StatusCode.INVALID_ARGUMENT,
        400,
        "`state.accelerators_free[0]`",
    ),
    (
        "negative memory total",
        *_set_first("memory_total_gb", -5.0),
        grpc.StatusCode.INVALID_ARGUMENT,
        400,
        "`state.memory",
    ),
    (
        "duplicate node ids",
        _dup,
        _dup_body,
        grpc.StatusCode.INVALID_ARGUMENT,
        400,
        "`state.node_ids[1]`",
    ),
    ("zero options", *_many_options(0), grpc.StatusCode.INVALID_ARGUMENT, 400, "`options`"),
    ("100k options", *_many_options(100_000), grpc.StatusCode.INVALID_ARGUMENT, 400, "`options`"),
    (
        "unknown schema version",
        lambda m: setattr(m, "schema_version", 99),
        lambda b: b.update(schema_version=99),
        grpc.StatusCode.INVALID_ARGUMENT,
        400,
        "`schema_version`",
    ),
    (
        "propensity out of range",
        lambda m: setattr(m.production, "propensity", 1.5),
        lambda b: b["production"].update(propensity=1.5),
        grpc.StatusCode.INVALID_ARGUMENT,
        400,
        "`production.propensity`",
    ),
    (
        "option index out of range",
        lambda m: m.options.node_index.__setitem__(0, 10_000),
        lambda b: b["options"]["node_index"].__setitem__(0, 10_000),
        grpc.StatusCode.INVALID_ARGUMENT,
        400,
        "`options.node_index[0]`",
    ),
    (
        "NUL in request id",
        lambda m: setattr(m, "request_id", "req\x00id"),
        lambda b: b.update(request_id="req\x00id"),
        grpc.StatusCode.INVALID_ARGUMENT,
        400,
        "`request_id`",
    ),
    (
        "NUL in tenant",
        lambda m: setattr(m.workload, "tenant", "team\x00"),
        lambda b: b["workload"].update(tenant="team\x00"),
        grpc.StatusCode.INVALID_ARGUMENT,
        400,
        "`workload.tenant`",
    ),
    (
        "request time past year 9999",
        lambda m: setattr(m, "request_time", 1e15),
        lambda b: b.update(request_time=1e15),
        grpc.StatusCode.INVALID_ARGUMENT,
        400,
        "`request_time`",
    ),
    (
        "absurd hardware capability",
        lambda m: setattr(m.state.hardware[0], "accelerator_memory_gb", 1e300),
        lambda b: b["state"]["hardware"][0].update(accelerator_memory_gb=1e300),
        grpc.StatusCode.INVALID_ARGUMENT,
        400,
        "`state.hardware[0].accelerator_memory_gb` must be at most",
    ),
    (
        "hardware index beyond int32",
        lambda m: m.state.node_hardware.__setitem__(0, 2**32 - 1),
        lambda b: b["state"]["node_hardware"].__setitem__(0, 2**32 - 1),
        grpc.StatusCode.INVALID_ARGUMENT,
        400,
        "`state.node_hardware[0]` must index state.hardware",
    ),
    (
        "10 MB body",
        lambda m: setattr(m.workload, "tenant", BIG),
        lambda b: b["workload"].update(tenant=BIG),
        grpc.StatusCode.INVALID_ARGUMENT,
        413,
        "limit",
    ),
    *_control_rows(),
]


def _counted(service: Service, transport: str, result: str = "rejected") -> float:
    labels = {"transport": transport, "kind": "mirror", "result": result}
    return service.metrics.registry.get_sample_value("understudy_ingest_total", labels) or 0.0


@pytest.mark.parametrize(
    ("proto_mutation", "code", "named"),
    [pytest.param(c[1], c[3], c[5], id=c[0]) for c in CASES],
)
def test_grpc_refuses_bad_input_and_serves_the_next(
    service: Service,
    stub: shadow_pb2_grpc.ShadowEvaluationStub,
    auth: tuple[tuple[str, str], ...],
    requests_sample: list[MirrorRequest],
    proto_mutation: Callable[[Proto], None],
    code: grpc.StatusCode,
    named: str,
) -> None:
    msg = mirror_request_to_pb(requests_sample[0])
    proto_mutation(msg)
    with pytest.raises(grpc.RpcError) as err:
        stub.Mirror(msg, metadata=auth)
    assert err.value.code() == code
    assert named in (err.value.details() or "")
    assert _counted(service, "grpc") == 1
    ack = stub.Mirror(mirror_request_to_pb(requests_sample[1]), metadata=auth)
    assert ack.status == shadow_pb2.ACK_STATUS_ACCEPTED


@pytest.mark.parametrize(
    ("body_mutation", "status", "named"),
    [pytest.param(c[2], c[4], c[5], id=c[0]) for c in CASES],
)
def test_http_refuses_bad_input_and_serves_the_next(
    service: Service,
    http: httpx.Client,
    requests_sample: list[MirrorRequest],
    body_mutation: Callable[[Body], None],
    status: int,
    named: str,
) -> None:
    body = json.loads(mirror_to_json(requests_sample[0]))
    body_mutation(body)
    response = http.post("/v1/mirror", content=json.dumps(body))
    assert response.status_code == status, response.text
    assert named in response.json()["message"]
    assert _counted(service, "http") == 1
    ok = http.post("/v1/mirror", content=mirror_to_json(requests_sample[1]))
    assert ok.status_code == 202 and ok.json()["status"] == "accepted"


# JSON numbers that their protobuf twin could not hold (found by schemathesis:
# they used to fail in the encoder or in numpy, as HTTP 500).
HTTP_ONLY: list[tuple[str, Callable[[Body], None], str]] = [
    (
        "boolean as a number (schemathesis regression)",
        lambda b: b["production"].update(propensity=True),
        "`production.propensity`",
    ),
    (
        "numeric string as an integer",
        lambda b: b["workload"].update(accelerators="2"),
        "`workload.accelerators`",
    ),
    (
        "int32 overflow",
        lambda b: b["workload"].update(accelerators=2**40),
        "`workload.accelerators`",
    ),
    ("negative uint32", lambda b: b.update(schema_version=-1), "`schema_version`"),
    (
        "int64 overflow",
        lambda b: b["options"]["node_offsets"].__setitem__(0, 2**70),
        "`options.node_offsets[0]`",
    ),
    (
        "float32 overflow",
        lambda b: b["state"]["cpu_free"].__setitem__(0, 1e300),
        "`state.cpu_free[0]`",
    ),
    ("option overflow", lambda b: b["production"].update(option=2**40), "`production.option`"),
    (
        "hardware index beyond uint32",
        lambda b: b["state"]["node_hardware"].__setitem__(0, 2**40),
        "`state.node_hardware[0]`",
    ),
]


@pytest.mark.parametrize(
    ("body_mutation", "named"), [pytest.param(c[1], c[2], id=c[0]) for c in HTTP_ONLY]
)
def test_http_refuses_numbers_out_of_their_wire_range(
    service: Service,
    http: httpx.Client,
    requests_sample: list[MirrorRequest],
    body_mutation: Callable[[Body], None],
    named: str,
) -> None:
    body = json.loads(mirror_to_json(requests_sample[0]))
    body_mutation(body)
    response = http.post("/v1/mirror", content=json.dumps(body))
    assert response.status_code == 400, response.text
    assert named in response.json()["message"]
    assert _counted(service, "http") == 1


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"observed_at": 1e15}, "`observed_at`"),
        ({"request_id": "req\x00id"}, "`request_id`"),
    ],
    ids=["observed past year 9999", "NUL in request id"],
)
def test_outcomes_that_could_not_be_logged_are_refused_on_both_transports(
    service: Service,
    stub: shadow_pb2_grpc.ShadowEvaluationStub,
    auth: tuple[tuple[str, str], ...],
    http: httpx.Client,
    change: dict[str, Any],
    named: str,
) -> None:
    fields = {"request_id": "r-1", "observed_at": 1.7e9, "failure": "none"} | change
    response = http.post("/v1/outcomes", content=json.dumps(fields))
    assert response.status_code == 400 and named in response.json()["message"]
    message = contract_pb2.Outcome(failure=contract_pb2.FAILURE_KIND_NONE)
    message.request_id, message.observed_at = fields["request_id"], fields["observed_at"]
    with pytest.raises(grpc.RpcError) as err:
        stub.ReportOutcome(message, metadata=auth)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in (err.value.details() or "")
    assert service.journal.head_seq == 0


def test_malformed_protobuf_is_invalid_argument(
    service: Service, grpc_channel: grpc.Channel, auth: tuple[tuple[str, str], ...]
) -> None:
    raw = grpc_channel.unary_unary(
        "/understudy.v1.ShadowEvaluation/Mirror",
        request_serializer=lambda b: b,
        response_deserializer=shadow_pb2.MirrorAck.FromString,
    )
    with pytest.raises(grpc.RpcError) as err:
        raw(b"\xff\xff\xff\xff garbage", metadata=auth)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "`request`" in (err.value.details() or "")
    assert _counted(service, "grpc") == 1


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[]", b'{"schema_version": 1}', b"\xff\xfe", b""],
    ids=["truncated", "array", "missing fields", "not utf8", "empty"],
)
def test_malformed_json_is_400_naming_the_field(
    service: Service, http: httpx.Client, body: bytes
) -> None:
    response = http.post("/v1/mirror", content=body)
    assert response.status_code == 400
    payload = response.json()
    assert payload["field"] and f"`{payload['field']}`" in payload["message"]
    assert _counted(service, "http") == 1


@pytest.mark.parametrize(
    ("header", "grpc_code", "http_status"),
    [
        (None, grpc.StatusCode.UNAUTHENTICATED, 401),
        ("Bearer wrong-token", grpc.StatusCode.UNAUTHENTICATED, 401),
        ("Basic dXNlcjpwYXNz", grpc.StatusCode.UNAUTHENTICATED, 401),
        ("Bearer r-tok", grpc.StatusCode.PERMISSION_DENIED, 403),
    ],
    ids=["missing", "wrong", "wrong scheme", "reviewer role"],
)
def test_credentials_are_checked_on_both_transports(
    service: Service,
    stub: shadow_pb2_grpc.ShadowEvaluationStub,
    requests_sample: list[MirrorRequest],
    header: str | None,
    grpc_code: grpc.StatusCode,
    http_status: int,
) -> None:
    metadata = () if header is None else (("authorization", header),)
    with pytest.raises(grpc.RpcError) as err:
        stub.Mirror(mirror_request_to_pb(requests_sample[0]), metadata=metadata)
    assert err.value.code() == grpc_code
    assert "authorization" in (err.value.details() or "") or "role" in (err.value.details() or "")
    headers = {} if header is None else {"authorization": header}
    response = httpx.post(
        f"http://127.0.0.1:{service.http_port}/v1/mirror",
        content=mirror_to_json(requests_sample[0]),
        headers=headers,
    )
    assert response.status_code == http_status
    failures = service.metrics.registry.get_sample_value
    kind = "PermissionDenied" if http_status == 403 else "Unauthenticated"
    assert failures("understudy_auth_failures_total", {"transport": "grpc", "reason": kind}) == 1
    assert failures("understudy_auth_failures_total", {"transport": "http", "reason": kind}) == 1
    assert service.journal.head_seq == 0, "nothing unauthenticated may reach the journal"


def test_stream_refuses_stale_sequences_without_journaling_them(
    service: Service,
    stub: shadow_pb2_grpc.ShadowEvaluationStub,
    auth: tuple[tuple[str, str], ...],
    requests_sample: list[MirrorRequest],
) -> None:
    """Found by the gRPC fuzzer: a stale sequence used to be journaled *and* rejected."""

    def envelope(sequence: int, request_id: str, valid: bool = True) -> Any:
        msg = mirror_request_to_pb(requests_sample[0])
        msg.request_id = request_id
        if not valid:
            msg.ClearField("state")
        return shadow_pb2.MirrorStreamRequest(sequence=sequence, request=msg)

    sent = [
        envelope(1, "first"),
        envelope(1, "stale-repeat"),
        envelope(3, "invalid", valid=False),
        envelope(2, "stale-after-invalid"),
        envelope(4, "fourth"),
    ]
    acks = list(stub.MirrorStream(iter(sent), metadata=auth))
    refused = [(a.sequence, a.status) for a in acks if a.status != shadow_pb2.ACK_STATUS_ACCEPTED]
    assert refused == [
        (1, shadow_pb2.ACK_STATUS_REPEATED_SEQUENCE),
        (3, shadow_pb2.ACK_STATUS_REJECTED),
        (2, shadow_pb2.ACK_STATUS_REPEATED_SEQUENCE),
    ]
    assert (acks[-1].accepted, acks[-1].rejected) == (2, 3)
    journaled = [
        contract_pb2.MirrorRequest.FromString(r.payload).request_id
        for r in service.journal.read("scorer", 100)
    ]
    assert journaled == ["first", "fourth"]
    assert _counted(service, "grpc_stream") == 3
    assert _counted(service, "grpc_stream", "accepted") == 2
