"""Hypothesis-made hostile batches on a real gRPC server (MirrorMany) and a real HTTP
server (POST /v1/mirror/batch, protobuf and JSON) (issue 24, acceptance).

What is sent: raw bytes; a valid serialized MirrorBatch (16 requests sharing 2
snapshots) truncated or bit-flipped; the same with one to three of its packed
columns cut short, grown, resized by whole items, cleared, replaced, a byte
poked, or an offset / index / count set to an extreme (negative, past the end,
2**31, 2**62, ...); invalid UTF-8 in a string; nested unknown groups; and the
JSON form with values replaced, removed or lists grown.

What must hold for every message: no crash, no INTERNAL / UNKNOWN, no 5xx;
the answer is an ack (whose rejections each name a known field and reason, with
a message) or INVALID_ARGUMENT / 4xx naming a field; `understudy_ingest_total`
moves by exactly the ack's counts (a refused batch: nothing accepted, at least
one rejection) and `understudy_ingest_rejections_total` with it; nothing is
journaled for a refused batch. After the run the server accepts a valid batch.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections import Counter
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.contract import MirrorRequest
from service.contract.batch import RequestBatch
from service.contract.rejections import REASON_CODES
from service.metrics import OTHER_FIELD, field_label
from service.server.app import Service
from service.transport.grpc.servicer import SERVICE_NAME
from service.transport.http.convert import mirror_to_json
from service.wire.batch_codec import batch_to_pb
from service.wire.field_paths import KNOWN_FIELD_PATHS
from service.wire.understudy.v1 import batch_pb2, shadow_pb2
from tests.hostile.metrics_read import counter_sum
from tests.hostile.pb_strategies import (
    Drawn,
    _parent,
    bad_utf8,
    bitflips,
    field_paths,
    nested_groups,
)
from tests.hostile.test_http_fuzz import JSON_VALUES, json_mutation
from tests.reliability.batch_load import shaped_batches

Metadata = tuple[tuple[str, str], ...]
OK, INVALID = grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT
NAMES_A_FIELD = re.compile(r"`[^`]+`")
PROTOBUF = {"content-type": "application/x-protobuf"}
JSON = {"content-type": "application/json"}
SIZE = 16
EXTREMES = (-1, -(2**31), 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, -(2**63))

BYTES_PATHS = [
    p
    for p in field_paths(batch_pb2.MirrorBatch.DESCRIPTOR)
    if p[-1].type == FieldDescriptor.TYPE_BYTES and not any(f.is_repeated for f in p[:-1])
]


def _template(tag: str) -> batch_pb2.MirrorBatch:
    return shaped_batches(1, tag, size=SIZE, n_nodes=8)[0].msg


@st.composite
def column_mutation(draw: st.DrawFn, valid: batch_pb2.MirrorBatch) -> bytes:
    """`valid` with one to three packed columns damaged (see the module docstring)."""
    msg = batch_pb2.MirrorBatch()
    msg.CopyFrom(valid)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(BYTES_PATHS))
        parent, name = _parent(msg, path), path[-1].name
        old: bytes = getattr(parent, name)
        action = draw(
            st.sampled_from(
                ["truncate", "grow", "resize", "clear", "replace", "poke", "extreme", "extreme"]
            )
        )
        new = old
        if action == "truncate" and old:
            new = old[: draw(st.integers(0, len(old) - 1))]
        elif action == "grow":
            new = old + draw(st.binary(min_size=1, max_size=16))
        elif action == "resize" and old:
            width = draw(st.sampled_from([1, 4, 8]))
            new = old[:-width] if draw(st.booleans()) else old + old[-width:]
        elif action == "clear":
            new = b""
        elif action == "replace":
            new = draw(st.binary(max_size=64))
        elif action == "poke" and old:
            at = draw(st.integers(0, len(old) - 1))
            new = old[:at] + bytes([draw(st.integers(0, 255))]) + old[at + 1 :]
        elif action == "extreme" and len(old) >= 4:
            dtype = "<i8" if "offsets" in name and len(old) % 8 == 0 else "<i4"
            width = np.dtype(dtype).itemsize
            whole = len(old) // width * width
            items = np.frombuffer(old[:whole], dtype=dtype).copy()
            at = draw(st.integers(0, len(items) - 1))
            info = np.iinfo(items.dtype)
            value = draw(
                st.sampled_from([*EXTREMES, int(items[at]) + 1, int(items[at]) - 1, len(items)])
            )
            items[at] = min(max(value, int(info.min)), int(info.max))
            new = items.tobytes() + old[whole:]
        setattr(parent, name, new)
    if draw(st.integers(0, 9)) == 0:
        msg.schema_version = draw(st.integers(0, 2**32 - 1))
    return bytes(msg.SerializeToString())


ENVELOPES: list[Any] = [
    {},
    {"requests": None},
    {"requests": {}},
    {"requests": "x"},
    {"requests": [None, 1, "x", [], {}]},
    {"requests": [], "extra": 1},
    [],
    None,
    1e308,
]
"""JSON batch bodies wrong as a whole (or in every row)."""


@st.composite
def json_rows(draw: st.DrawFn, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON batch of `rows` with one or two rows mutated (values replaced, removed,
    lists grown: tests/hostile/test_http_fuzz.py's mutation of one request)."""
    body = [json.loads(json.dumps(r)) for r in rows]
    for _ in range(draw(st.integers(1, 2))):
        at = draw(st.integers(0, len(body) - 1))
        body[at] = draw(json_mutation(body[at]))
    return {"requests": body}


def hostile_batches(valid: batch_pb2.MirrorBatch) -> st.SearchStrategy[Drawn]:
    """Every kind of hostile MirrorBatch bytes, labelled by how they were made."""
    raw = bytes(valid.SerializeToString())
    return st.one_of(
        column_mutation(valid).map(lambda b: ("columns", b)),
        column_mutation(valid).map(lambda b: ("columns", b)),
        st.binary(max_size=512).map(lambda b: ("garbage", b)),
        st.integers(0, len(raw) - 1).map(lambda k: ("truncated", raw[:k])),
        bitflips(raw).map(lambda b: ("bitflip", b)),
        bad_utf8(valid).map(lambda b: ("bad_utf8", b)),
        st.integers(50, 5_000).map(lambda d: ("nested", nested_groups(d))),
    )


def fuzz_settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )


def _counts(service: Service, transport: str) -> dict[str, float]:
    out = {
        result: counter_sum(service, "understudy_ingest_total", transport=transport, result=result)
        for result in ("accepted", "shed", "rejected")
    }
    out["refusals"] = counter_sum(
        service, "understudy_ingest_rejections_total", transport=transport
    )
    out["head"] = float(service.journal.head_seq)
    return out


def _moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before}


def _check_rejections(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        # `other`: a name the client made up (an unknown JSON key), which cannot be a label;
        # the message still names it
        named = re.findall(r"`([^`]*)`", row["message"])
        assert named, row
        assert row["field"] in KNOWN_FIELD_PATHS | {OTHER_FIELD}, row
        if row["field"] == OTHER_FIELD:  # only for a name no schema knows
            assert field_label(named[0]) == OTHER_FIELD, row
        assert row["reason"] in REASON_CODES, row
        assert row["message"], row


def _check_ack(moved: dict[str, float], fate: dict[str, Any]) -> None:
    """The counters moved by exactly what the ack says."""
    assert moved["accepted"] == fate["accepted"], (moved, fate)
    assert moved["shed"] == fate["shed"], (moved, fate)
    if fate["whole_batch"]:
        assert moved["rejected"] >= 1 and fate["accepted"] == fate["shed"] == 0, (moved, fate)
        assert moved["head"] == 0, "nothing journaled for a batch refused whole"
    else:
        assert moved["rejected"] == fate["rejected"], (moved, fate)
        assert moved["head"] <= 1, "a batch is at most one record"
    assert moved["refusals"] == moved["rejected"], (moved, fate)
    _check_rejections(fate["rejections"])


def _fuzz_grpc(service: Service, auth: Metadata, valid: Any, examples: int) -> Counter[str]:
    seen: Counter[str] = Counter()
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        call = channel.unary_unary(
            f"/{SERVICE_NAME}/MirrorMany",
            request_serializer=lambda b: b,
            response_deserializer=shadow_pb2.BatchAck.FromString,
        )

        @fuzz_settings(examples)
        @given(drawn=hostile_batches(valid))
        def run(drawn: Drawn) -> None:
            label, raw = drawn
            before = _counts(service, "grpc_batch")
            try:
                ack = call(raw, metadata=auth, timeout=30)
                code, details = OK, ""
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details() or ""
            seen[f"{label} {code.name}"] += 1
            assert code in (OK, INVALID), (label, code, details, raw[:200])
            moved = _moved(before, _counts(service, "grpc_batch"))
            if code is OK:
                rows = [
                    {k: getattr(r, k) for k in ("index", "field", "reason", "message")}
                    for r in ack.rejections
                ]
                fate = {
                    "accepted": ack.accepted,
                    "shed": ack.shed,
                    "rejected": ack.rejected,
                    "whole_batch": ack.whole_batch,
                    "rejections": rows,
                }
                assert not ack.whole_batch, ack  # a batch refused whole is INVALID_ARGUMENT
                _check_ack(moved, fate)
            else:
                assert NAMES_A_FIELD.search(details), details
                _check_ack(
                    moved,
                    {
                        "accepted": 0,
                        "shed": 0,
                        "rejected": None,
                        "whole_batch": True,
                        "rejections": [],
                    },
                )

        run()
        ack = call(_template("after-grpc").SerializeToString(), metadata=auth, timeout=30)
        assert (ack.status, ack.accepted) == (shadow_pb2.ACK_STATUS_ACCEPTED, SIZE), ack
    return seen


def _post_and_check(
    service: Service, http: httpx.Client, body: bytes, headers: dict[str, str], label: str
) -> int:
    before = _counts(service, "http_batch")
    reply = http.post("/v1/mirror/batch", content=body, headers=headers)
    assert reply.status_code in (200, 400), (label, reply.status_code, reply.text[:500])
    fate = reply.json()
    moved = _moved(before, _counts(service, "http_batch"))
    if reply.status_code == 400:
        assert fate["accepted"] == fate["shed"] == 0, fate
        assert fate["rejections"], fate
        assert NAMES_A_FIELD.search(fate["rejections"][0]["message"]), fate
    else:
        # something accepted or shed (an empty batch is refused whole since issue 24: 400)
        assert fate["accepted"] + fate["shed"] > 0 or not fate["rejections"], fate
        assert fate["accepted"] + fate["shed"] > 0 or fate["rejected"] == 0, fate
    _check_ack(moved, fate)
    return int(reply.status_code)


def _fuzz_http(service: Service, token: str, valid: Any, examples: int) -> Counter[str]:
    seen: Counter[str] = Counter()
    rows = [json.loads(mirror_to_json(r)) for r in _requests(valid)[:4]]
    with httpx.Client(
        base_url=f"http://127.0.0.1:{service.http_port}",
        headers={"authorization": f"Bearer {token}"},
        timeout=30,
    ) as http:

        @fuzz_settings(examples)
        @given(drawn=hostile_batches(valid))
        def protobuf(drawn: Drawn) -> None:
            label, raw = drawn
            seen[f"protobuf {label} {_post_and_check(service, http, raw, PROTOBUF, label)}"] += 1

        @fuzz_settings(max(examples // 2, 10))
        @given(
            body=st.one_of(
                json_rows(rows).map(lambda b: json.dumps(b).encode()),
                json_rows(rows).map(lambda b: json.dumps(b).encode()),
                st.sampled_from(ENVELOPES).map(lambda b: json.dumps(b).encode()),
                st.dictionaries(st.text(max_size=10), JSON_VALUES, max_size=3).map(
                    lambda b: json.dumps(b).encode()
                ),
                st.binary(max_size=256),
                st.text(max_size=64).map(str.encode),
            )
        )
        def as_json(body: bytes) -> None:
            seen[f"json {_post_and_check(service, http, body, JSON, 'json')}"] += 1

        protobuf()
        as_json()
        after = _template("after-http").SerializeToString()
        reply = http.post("/v1/mirror/batch", content=after, headers=PROTOBUF)
        assert reply.status_code == 200 and reply.json()["accepted"] == SIZE, reply.text
    return seen


def _requests(msg: batch_pb2.MirrorBatch) -> list[MirrorRequest]:
    from service.contract import RequestLimits
    from service.wire.batch_codec import batch_from_pb

    return [
        dataclasses.replace(r, request_id=f"json-{i}")
        for i, r in enumerate(batch_from_pb(msg, RequestLimits()).requests())
    ]


def _every_rejection_label_is_known(service: Service) -> None:
    for family in service.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "understudy_ingest_rejections_total":
                assert sample.labels["field"] in KNOWN_FIELD_PATHS | {OTHER_FIELD}, sample


def _run(service: Service, token: str, examples: int) -> None:
    started = time.perf_counter()
    auth = (("authorization", f"Bearer {token}"),)
    valid = _template("fz")
    grpc_seen = _fuzz_grpc(service, auth, valid, examples)
    http_seen = _fuzz_http(service, token, valid, examples)
    _every_rejection_label_is_known(service)
    print(
        f"\nbatch fuzz in {time.perf_counter() - started:.1f} s\n"
        f"MirrorMany: {dict(sorted(grpc_seen.items()))}\n"
        f"POST /v1/mirror/batch: {dict(sorted(http_seen.items()))}"
    )


def test_batch_fuzz_smoke(service: Service, runtime_token: str) -> None:
    _run(service, runtime_token, examples=100)


@pytest.mark.slow
def test_batch_fuzz(service: Service, runtime_token: str) -> None:
    _run(service, runtime_token, examples=500)


def test_the_template_is_a_valid_batch_of_shared_snapshots() -> None:
    """The fuzz starts from a batch the service accepts whole, with shared snapshots."""
    msg = _template("t")
    batch = RequestBatch.from_requests(_requests(msg))
    assert len(_requests(msg)) == SIZE and batch.states.n_states == SIZE // 8
    assert batch_to_pb(batch).states.node_offsets  # packed columns present


def test_json_batch_bodies_wrong_as_a_whole_are_400_naming_their_field(
    service: Service, runtime_token: str
) -> None:
    """Each of `ENVELOPES` is refused whole, counted, and named: a missing or malformed
    `requests` list is the label `requests` (a fixed name, not `other`)."""
    with httpx.Client(
        base_url=f"http://127.0.0.1:{service.http_port}",
        headers={"authorization": f"Bearer {runtime_token}"},
        timeout=30,
    ) as http:
        for body in ENVELOPES:
            raw = json.dumps(body).encode()
            status = _post_and_check(service, http, raw, JSON, "envelope")
            reply = http.post("/v1/mirror/batch", content=raw, headers=JSON).json()
            assert status == 400, reply
            if body in ({}, {"requests": None}, {"requests": {}}, {"requests": "x"}):
                assert reply["rejections"][0]["field"] == "requests", reply
