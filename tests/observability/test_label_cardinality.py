"""Metric labels come from bounded sets: hostile input cannot mint series (issue 20, item 7).

Every unknown JSON key a client sent used to become a new
``understudy_ingest_rejections_total`` series (300 requests, 300 series,
``/metrics`` 42 -> 117 KB). Here a warm-up sends each kind of refusal a few
times, then hundreds more with distinct made-up field names (HTTP mirror and
outcome bodies) and distinct bad indices plus unknown protobuf fields (gRPC):
no metric family may gain a series, and ``/metrics`` may not grow beyond the
digits of its counters. Each refusal still names the actual field.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import httpx
import pytest

from service.contract import MirrorRequest
from service.metrics import OTHER_FIELD, field_label
from service.server.app import Service
from service.transport.http.convert import mirror_to_json
from service.wire.convert import mirror_request_to_pb
from tests.transport.test_bad_input import CASES, CONTROL_CASES

DISTINCT = 300


def _series(service: Service) -> dict[str, int]:
    """Series per metric family (a histogram's buckets count under its family)."""
    return {f.name: len(f.samples) for f in service.metrics.registry.collect()}


def _unknown_key(body: dict[str, Any], i: int) -> str:
    """Put a made-up key at one of three depths; return the path the refusal should name."""
    where = ("", "state", "workload")[i % 3]
    key = f"made_up_field_{i}"
    (body[where] if where else body)[key] = 1
    return f"{where}.{key}" if where else key


def _refuse_http(http: httpx.Client, base: dict[str, Any], i: int) -> None:
    body = json.loads(json.dumps(base))
    named = _unknown_key(body, i)
    response = http.post("/v1/mirror", content=json.dumps(body))
    assert response.status_code == 400, response.text
    assert f"`{named}`" in response.json()["message"]
    outcome = {"request_id": f"r-{i}", "observed_at": 1.7e9, f"made_up_outcome_{i}": True}
    response = http.post("/v1/outcomes", content=json.dumps(outcome))
    assert response.status_code == 400, response.text
    assert f"`made_up_outcome_{i}`" in response.json()["message"]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _refuse_grpc(
    mirror: Any, auth: tuple[tuple[str, str], ...], request: MirrorRequest, i: int
) -> None:
    msg = mirror_request_to_pb(request)
    node = i % len(msg.state.cpu_free)
    msg.state.cpu_free[node] = float("nan")
    # A distinct unknown field number per message (protobuf keeps it as an unknown field).
    raw = msg.SerializeToString() + _varint((1000 + i) << 3) + _varint(i)
    with pytest.raises(grpc.RpcError) as err:
        mirror(raw, metadata=auth)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"`state.cpu_free[{node}]`" in (err.value.details() or "")


def test_refused_field_names_do_not_create_series(
    service: Service,
    http: httpx.Client,
    grpc_channel: grpc.Channel,
    auth: tuple[tuple[str, str], ...],
    requests_sample: list[MirrorRequest],
) -> None:
    mirror = grpc_channel.unary_unary(
        "/understudy.v1.ShadowEvaluation/Mirror",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    base = json.loads(mirror_to_json(requests_sample[0]))
    for i in range(6):  # warm-up: every kind of refusal the load below sends
        _refuse_http(http, base, i)
        _refuse_grpc(mirror, auth, requests_sample[0], i)
    before, size_before = _series(service), len(http.get("/metrics").content)

    for i in range(6, 6 + DISTINCT):
        _refuse_http(http, base, i)
        if i % 3 == 0:
            _refuse_grpc(mirror, auth, requests_sample[0], i)

    after, size_after = _series(service), len(http.get("/metrics").content)
    grown = {name: (before.get(name, 0), n) for name, n in after.items() if n > before.get(name, 0)}
    print(
        f"\n{DISTINCT} distinct unknown fields: /metrics {size_before} -> {size_after} bytes, "
        f"{sum(before.values())} -> {sum(after.values())} samples"
    )
    assert not grown, f"metric families gained series: {grown}"
    assert size_after <= size_before * 1.05, (size_before, size_after)
    counted = service.metrics.registry.get_sample_value
    other = {"transport": "http", "kind": "mirror", "field": OTHER_FIELD}
    assert counted("understudy_ingest_rejections_total", other) == 6 + DISTINCT


def test_every_field_the_bad_input_table_names_keeps_its_own_label() -> None:
    """Bounding must not lose information: real fields are counted by name, indices dropped."""
    named = [c[5] for c in CASES] + [c[2] for c in CONTROL_CASES]
    fields = {n.split("`")[1] for n in named if n.count("`") >= 2}
    assert len(fields) > 20
    for field in fields:
        assert field_label(field) != OTHER_FIELD, field
        assert "[" not in field_label(field).replace("[]", ""), field
    extra = ["options[7]", "body", "request", "outcome", "sequence", "workload.kind", "failure"]
    assert [field_label(f) for f in extra] == ["options[]", *extra[1:]]
    assert field_label("state.made_up") == field_label("x" * 10_000) == OTHER_FIELD
