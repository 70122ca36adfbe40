"""POST /v1/mirror/batch and /v1/outcomes/batch through a real uvicorn (issue 24).

Against a real service on loopback (ingest only): a protobuf batch with bad
requests at chosen indexes is 200, the rest journaled, the bad ones named by
index, field, reason and the single validator's message; the JSON form of the
same batch gives the same reply (and, sent second, only duplicates: the two
forms are one request each, by digest); a batch refused whole is 400 naming
the column, counted per request; an empty batch is 400 naming its count (both forms,
both routes); a body over the limit is 413; a batch whose
every request is refused is 400; other content types are 415, counted; no
token is 401, a reviewer's 403; a body cut short by the request deadline is a
counted rejection of `body`; the routes are in the OpenAPI document.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from service.contract import MirrorRequest, RequestLimits
from service.contract.batch import RequestBatch
from service.server.app import Service
from service.transport.http.convert import mirror_to_json
from service.wire.batch_codec import batch_from_pb, batch_to_pb
from tests.transport.batch_helpers import (
    ack_verdicts,
    counted,
    encode,
    encode_outcomes,
    journaled,
    journaled_outcomes,
    outcomes,
    single_verdicts,
    spoil,
    truncate,
    with_ids,
)
from tests.transport.test_http_ingest_routes import LIMIT, TOKEN, Pair, _serve

PROTOBUF = {"content-type": "application/x-protobuf"}
JSON = {"content-type": "application/json"}
BAD = {2: "gang_size", 5: "cpu_free"}  # both expressible in JSON (NaN is not)


def _spoiled(sample: list[MirrorRequest], n: int, tag: str, bad: dict[int, str]) -> Any:
    msg = encode(with_ids(sample, n, tag))
    for index, how in bad.items():
        spoil(msg, index, how)
    return msg


def _json_body(msg: Any) -> bytes:
    """The JSON form of a batch: each request as POST /v1/mirror takes it."""
    rows = [json.loads(mirror_to_json(r)) for r in batch_from_pb(msg, RequestLimits()).requests()]
    return json.dumps({"requests": rows}).encode()


def _ingest(service: Service, result: str, kind: str = "mirror") -> float:
    return counted(
        service, "understudy_ingest_total", transport="http_batch", kind=kind, result=result
    )


def test_a_batch_with_bad_requests_is_accepted_but_for_those_named_by_index(
    service: Service, http: httpx.Client, requests_sample: list[MirrorRequest]
) -> None:
    msg = _spoiled(requests_sample, 7, "p", BAD)
    expected = single_verdicts(msg)
    assert set(expected) == set(BAD), expected
    reply = http.post("/v1/mirror/batch", content=msg.SerializeToString(), headers=PROTOBUF)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert {k: body[k] for k in ("status", "accepted", "shed", "rejected", "whole_batch")} == {
        "status": "rejected",
        "accepted": 5,
        "shed": 0,
        "rejected": 2,
        "whole_batch": False,
    }
    assert ack_verdicts(body["rejections"]) == expected
    assert [r["field"] for r in body["rejections"]] == ["workload.gang_size", "state.cpu_free[]"]
    assert journaled(service) == [f"p-{i}" for i in range(7) if i not in BAD]
    assert (_ingest(service, "accepted"), _ingest(service, "rejected")) == (5, 2)


def test_the_json_and_protobuf_forms_of_one_batch_give_one_result(
    service: Service, http: httpx.Client, requests_sample: list[MirrorRequest]
) -> None:
    msg = _spoiled(requests_sample, 7, "j", BAD)
    as_json = http.post("/v1/mirror/batch", content=_json_body(msg), headers=JSON)
    as_protobuf = http.post("/v1/mirror/batch", content=msg.SerializeToString(), headers=PROTOBUF)
    assert as_json.status_code == as_protobuf.status_code == 200
    assert as_json.json() == as_protobuf.json()
    # sent second, the protobuf form's requests are the JSON form's: duplicates, not
    # conflicts, and journaled once
    assert journaled(service) == [f"j-{i}" for i in range(7) if i not in BAD]
    duplicates = "understudy_ingest_duplicates_total"
    assert counted(service, duplicates, transport="http_batch") == 5


def test_a_batch_that_cannot_be_read_is_400_naming_the_column(
    service: Service, http: httpx.Client, requests_sample: list[MirrorRequest]
) -> None:
    msg = encode(with_ids(requests_sample, 4, "w"))
    truncate(msg)
    reply = http.post("/v1/mirror/batch", content=msg.SerializeToString(), headers=PROTOBUF)
    assert reply.status_code == 400
    body = reply.json()
    assert (body["status"], body["whole_batch"], body["accepted"], body["rejected"]) == (
        "rejected",
        True,
        0,
        4,
    )
    [only] = body["rejections"]
    assert (only["index"], only["field"], only["reason"]) == (0, "states.cpu_free", "invalid_value")
    assert "`states.cpu_free`" in only["message"]
    labels = {"transport": "http_batch", "kind": "mirror", "field": "states.cpu_free"}
    assert counted(service, "understudy_ingest_rejections_total", **labels) == 4
    garbage = http.post("/v1/mirror/batch", content=b"\xff\xff no", headers=PROTOBUF)
    assert garbage.status_code == 400
    assert garbage.json()["rejections"][0]["reason"] == "malformed_message"
    not_an_envelope = http.post("/v1/mirror/batch", content=b"[1, 2]", headers=JSON)
    assert not_an_envelope.status_code == 400 and not_an_envelope.json()["whole_batch"]
    assert journaled(service) == []


def test_a_batch_whose_every_request_is_refused_is_400(
    service: Service, http: httpx.Client, requests_sample: list[MirrorRequest]
) -> None:
    msg = _spoiled(requests_sample, 2, "x", {0: "gang_size", 1: "gang_size"})
    reply = http.post("/v1/mirror/batch", content=msg.SerializeToString(), headers=PROTOBUF)
    assert reply.status_code == 400
    body = reply.json()
    assert (body["accepted"], body["rejected"], body["whole_batch"]) == (0, 2, False)
    assert [r["index"] for r in body["rejections"]] == [0, 1]
    as_json = http.post("/v1/mirror/batch", content=_json_body(msg), headers=JSON)
    assert as_json.status_code == 400
    assert as_json.json() == body  # the JSON form: every row refused while decoding
    assert journaled(service) == []


def test_content_type_size_and_auth_are_checked(
    service: Service, http: httpx.Client, runtime_token: str, requests_sample: list[MirrorRequest]
) -> None:
    raw = encode(with_ids(requests_sample, 2, "c")).SerializeToString()
    for content_type in ("text/plain", "application/octet-stream", None):
        headers = {} if content_type is None else {"content-type": content_type}
        reply = http.post("/v1/mirror/batch", content=raw, headers=headers)
        assert reply.status_code == 415, (content_type, reply.text)
        assert reply.json()["field"] == "content-type"
    labels = {"transport": "http_batch", "kind": "mirror", "field": "content-type"}
    assert counted(service, "understudy_ingest_rejections_total", **labels) == 3
    charset = http.post(
        "/v1/mirror/batch",
        content=_json_body(encode(with_ids(requests_sample, 1, "cs"))),
        headers={"content-type": "Application/JSON; charset=utf-8"},
    )
    assert charset.status_code == 200, charset.text
    too_large = http.post(
        "/v1/mirror/batch", content=b"\0" * (4 * 1024 * 1024 + 1), headers=PROTOBUF
    )
    assert too_large.status_code == 413
    assert too_large.json()["rejections"][0]["reason"] == "payload_too_large"
    base = f"http://127.0.0.1:{service.http_port}"
    with httpx.Client(base_url=base, timeout=10) as anonymous:
        assert anonymous.post("/v1/mirror/batch", content=raw, headers=PROTOBUF).status_code == 401
        reviewer = {"authorization": "Bearer r-tok"} | PROTOBUF
        assert anonymous.post("/v1/mirror/batch", content=raw, headers=reviewer).status_code == 403
        assert (
            anonymous.post("/v1/outcomes/batch", content=raw, headers=PROTOBUF).status_code == 401
        )
    assert journaled(service) == ["cs-0"]


def test_outcome_batches_in_both_forms(
    service: Service, http: httpx.Client, requests_sample: list[MirrorRequest]
) -> None:
    items = outcomes(with_ids(requests_sample, 4, "o"))
    msg = encode_outcomes(items)
    observed = np.frombuffer(msg.observed_at, dtype="<f8").copy()
    observed[1] = -5.0  # before the epoch: refused by the outcome validator
    msg.observed_at = observed.tobytes()
    reply = http.post("/v1/outcomes/batch", content=msg.SerializeToString(), headers=PROTOBUF)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert (body["accepted"], body["rejected"]) == (3, 1)
    assert [(r["index"], r["field"]) for r in body["rejections"]] == [(1, "observed_at")]
    rows = [{"request_id": o.request_id, "observed_at": o.observed_at} for o in items]
    rows[2]["observed_at"] = -5.0
    as_json = http.post("/v1/outcomes/batch", content=json.dumps({"outcomes": rows}), headers=JSON)
    assert as_json.status_code == 200, as_json.text
    assert [(r["index"], r["field"]) for r in as_json.json()["rejections"]] == [(2, "observed_at")]
    assert journaled_outcomes(service) == ["o-0", "o-2", "o-3", "o-0", "o-1", "o-3"]
    assert (_ingest(service, "accepted", "outcome"), _ingest(service, "rejected", "outcome")) == (
        6,
        2,
    )


@pytest.mark.live
def test_a_batch_body_cut_short_by_the_deadline_is_a_counted_rejection(
    make_service: Callable[..., Service], runtime_token: str, requests_sample: list[MirrorRequest]
) -> None:
    service = make_service(scoring_enabled=False)
    raw = encode(with_ids(requests_sample, 2, "s")).SerializeToString()
    head = (
        f"POST /v1/mirror/batch HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {runtime_token}\r\nContent-Type: application/x-protobuf\r\n"
        f"Content-Length: {len(raw)}\r\n\r\n"
    ).encode()
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", service.http_port), timeout=30) as sock:
        sock.sendall(head + raw[: len(raw) // 2])  # then stall
        closed = sock.recv(65536) == b""  # the server closes at the request deadline
    assert closed
    assert time.monotonic() - started < 25  # uvicorn's timeout_keep_alive (5 s), not never
    deadline = time.monotonic() + 10  # the handler counts it once it sees the disconnect
    labels = {"transport": "http_batch", "kind": "mirror", "field": "body"}
    while counted(service, "understudy_ingest_rejections_total", **labels) < 1:
        assert time.monotonic() < deadline, "the cut-short body was not counted"
        time.sleep(0.05)  # poll interval of a condition wait
    assert journaled(service) == []


def test_the_batch_routes_are_in_the_openapi_document(service: Service, http: httpx.Client) -> None:
    spec = http.get("/openapi.json").json()
    for path, key in (("/v1/mirror/batch", "requests"), ("/v1/outcomes/batch", "outcomes")):
        post = spec["paths"][path]["post"]
        content = post["requestBody"]["content"]
        assert set(content) == {"application/json", "application/x-protobuf"}
        assert content["application/json"]["schema"]["required"] == [key]
        assert {"200", "400", "401", "413", "415"} <= set(post["responses"])


def test_the_fast_path_answers_batches_as_fastapi_routing_does(
    tmp_path: Path, requests_sample: list[MirrorRequest]
) -> None:
    """The same handlers behind FastAPI's routing (``fast_ingest=False``) give the same
    status and body for every case; sent to both, the second copy of a request is a
    duplicate, so even the counts agree."""
    made = Pair(tmp_path, offload=False)
    good = {"authorization": f"Bearer {TOKEN}"}
    msg = _spoiled(requests_sample, 5, "f", {1: "gang_size"})
    unreadable = encode(with_ids(requests_sample, 3, "u"))
    truncate(unreadable)
    cases = [
        ("/v1/mirror/batch", good | PROTOBUF, msg.SerializeToString()),
        ("/v1/mirror/batch", good | JSON, _json_body(msg)),
        ("/v1/mirror/batch", good | PROTOBUF, unreadable.SerializeToString()),
        ("/v1/mirror/batch", good | {"content-type": "text/csv"}, b"a,b"),
        ("/v1/mirror/batch", PROTOBUF, msg.SerializeToString()),
        ("/v1/mirror/batch", good | PROTOBUF, b"\0" * (LIMIT + 1)),
        (
            "/v1/outcomes/batch",
            good | JSON,
            b'{"outcomes": [{"request_id": "o", "observed_at": 1e9}]}',
        ),
    ]
    try:
        with _serve(made.apps[0]) as fast, _serve(made.apps[1]) as routed:
            for path, headers, content in cases:
                replies = [
                    httpx.post(url + path, content=content, headers=headers, timeout=10)
                    for url in (fast, routed)
                ]
                assert replies[0].status_code == replies[1].status_code, path
                assert replies[0].content == replies[1].content, (path, headers)
                assert replies[0].headers["content-type"] == replies[1].headers["content-type"]
    finally:
        made.journal.close()


def test_an_empty_batch_is_400_naming_its_count_in_both_forms(
    service: Service, http: httpx.Client
) -> None:
    """No requests (or outcomes) is a client bug, not a 200 of zeros: refused whole on
    both routes in both forms, naming the field that states the count, counted once."""
    empty = batch_to_pb(RequestBatch.from_requests([])).SerializeToString()
    cases = [
        ("/v1/mirror/batch", empty, PROTOBUF, "mirror", "request_id", "request"),
        ("/v1/mirror/batch", b'{"requests": []}', JSON, "mirror", "requests", "request"),
        ("/v1/outcomes/batch", b"", PROTOBUF, "outcome", "request_id", "outcome"),
        ("/v1/outcomes/batch", b'{"outcomes": []}', JSON, "outcome", "outcomes", "outcome"),
    ]
    for path, body, headers, kind, field, noun in cases:
        reply = http.post(path, content=body, headers=headers)
        assert reply.status_code == 400, (path, field, reply.text)
        got = reply.json()
        assert {k: got[k] for k in ("status", "whole_batch", "accepted", "shed", "rejected")} == {
            "status": "rejected",
            "whole_batch": True,
            "accepted": 0,
            "shed": 0,
            "rejected": 0,  # the requests it stated: none
        }
        [only] = got["rejections"]
        assert (only["index"], only["field"], only["reason"]) == (0, field, "invalid_value")
        assert only["message"] == f"`{field}` must hold at least one {noun}, got none"
        labels = {"transport": "http_batch", "kind": kind, "field": field}
        assert counted(service, "understudy_ingest_rejections_total", **labels) == 1
    # the metric counts each refused message once: it stated no request to count
    assert _ingest(service, "rejected") == 2
    assert _ingest(service, "rejected", kind="outcome") == 2
    assert _ingest(service, "accepted") == _ingest(service, "accepted", kind="outcome") == 0
    assert journaled(service) == [] and journaled_outcomes(service) == []
