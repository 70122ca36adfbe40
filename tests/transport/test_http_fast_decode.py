"""The msgspec decode of HTTP bodies agrees with the pydantic reference, and is canonical.

`service.transport.http.decode` is what ingest runs; `service.transport.http.convert`
(pydantic) is the documented contract and the oracle here. For every body — the
real sample requests, a table of awkward JSON, and seeded mutations of valid
bodies — both must accept with equal contract objects (same dtypes, values and
read-only flags) or both refuse with the same error class, field and message.
An accepted request must also equal what the scorer decodes from the journaled
payload, because ingest hands it over as ``canonical``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.contract import InvalidInput, MirrorRequest, Outcome
from service.transport.http import convert, decode
from service.transport.http.convert import mirror_to_json
from service.wire.convert import mirror_request_from_pb, outcome_from_pb
from service.wire.understudy.v1 import contract_pb2


def _assert_same(a: Any, b: Any, path: str = "request") -> None:
    """Deep equality for the contract dataclasses (their arrays compare by identity)."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), path
        for f in dataclasses.fields(a):
            _assert_same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), path
        assert a.dtype == b.dtype, path
        assert a.flags.writeable == b.flags.writeable, path
        assert a.tobytes() == b.tobytes(), path  # bit for bit: -0.0 and NaN included
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float) and a != a:
        assert b != b, path
    else:
        assert type(a) is type(b) and a == b, (path, a, b)


def _outcome_of(fn: Any, body: bytes) -> tuple[str, Any]:
    try:
        return "accepted", fn(body)
    except InvalidInput as exc:
        return "refused", (type(exc), exc.field, str(exc))


def _assert_mirror_agrees(body: bytes) -> str:
    """Both decoders agree on `body`; returns "accepted" or "refused"."""
    ref_kind, ref = _outcome_of(convert.mirror_from_json, body)
    fast_kind, fast = _outcome_of(decode.mirror_from_json, body)
    assert fast_kind == ref_kind, (body[:300], ref, fast)
    if ref_kind == "refused":
        assert fast == ref
        return ref_kind
    request, payload = fast
    assert isinstance(request, MirrorRequest)
    _assert_same(request, ref[0])
    journaled = mirror_request_from_pb(contract_pb2.MirrorRequest.FromString(payload))
    _assert_same(request, journaled)  # what `canonical=True` promises the scorer
    return ref_kind


def test_sample_requests_decode_alike_and_journal_the_same_bytes(
    requests_sample: list[MirrorRequest],
) -> None:
    for request in requests_sample:
        body = mirror_to_json(request)
        assert _assert_mirror_agrees(body) == "accepted"
        # Bodies written by our own client (sorted labels) journal as before, byte for byte.
        assert decode.mirror_from_json(body)[1] == convert.mirror_from_json(body)[1]


def _body(requests: list[MirrorRequest]) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(mirror_to_json(requests[0]))
    return body


# (case id, change to a valid body as JSON text or dict mutation)
AWKWARD: list[tuple[str, Any]] = [
    ("NaN literal", lambda b: b["state"]["cpu_free"].__setitem__(0, float("nan"))),
    ("Infinity in a double", lambda b: b.update(request_time=float("inf"))),
    ("Infinity in a float32", lambda b: b["state"]["utilisation"].__setitem__(0, float("inf"))),
    ("1e400 in a double", "1e400"),
    ("float32 just over its range", lambda b: b["state"]["cpu_total"].__setitem__(0, 3.5e38)),
    ("float32 at its range", lambda b: b["state"]["cpu_total"].__setitem__(0, 3.4028234e38)),
    ("negative zero", lambda b: b["state"]["cpu_free"].__setitem__(0, -0.0)),
    ("int for a double", lambda b: b.update(request_time=1_700_000_000)),
    ("float for an int", lambda b: b["workload"].update(accelerators=2.0)),
    ("bool for an int", lambda b: b["state"]["queue_length"].__setitem__(0, True)),
    ("bool for a float", lambda b: b["workload"].update(model_size_b=False)),
    ("int for a bool", lambda b: b["state"]["healthy"].__setitem__(0, 1)),
    ("string for a float", lambda b: b["workload"].update(cpu_per_node="4")),
    ("int32 edge", lambda b: b["workload"].update(priority=2**31 - 1)),
    ("int32 overflow", lambda b: b["workload"].update(priority=2**31)),
    ("uint32 negative", lambda b: b["state"]["node_hardware"].__setitem__(0, -1)),
    ("int64 overflow", lambda b: b["options"]["node_offsets"].__setitem__(1, 2**63)),
    ("huge int", lambda b: b["options"]["node_offsets"].__setitem__(1, 10**30)),
    ("unknown kind", lambda b: b["workload"].update(kind="serve")),
    ("unknown field", lambda b: b.update(priority=1)),
    ("unknown nested field", lambda b: b["state"]["hardware"][0].update(colour="red")),
    ("missing nested field", lambda b: b["workload"].pop("tenant")),
    ("null for a required field", lambda b: b.update(request_id=None)),
    ("null for an optional field", lambda b: b.update(quota_remaining=None, production=None)),
    ("list for a scalar", lambda b: b.update(request_id=["a"])),
    ("scalar for a list", lambda b: b["state"].update(zone="z1")),
    ("empty options", lambda b: b["options"].update(node_offsets=[], node_index=[])),
    ("labels unsorted", lambda b: b["state"].update(labels=list(reversed(b["state"]["labels"])))),
    ("allowed hardware unsorted", lambda b: b["workload"].update(allowed_hardware=["z", "a"])),
    ("NUL in a string", lambda b: b.update(request_id="a\x00b")),
    ("non-ASCII string", lambda b: b["workload"].update(tenant="équipe-東京")),
    ("lone surrogate", '"\\ud800"'),
    ("duplicate key", "duplicate"),
    ("byte order mark", "bom"),
    ("trailing garbage", "trailing"),
    ("not an object", "array"),
]


def _apply(base: dict[str, Any], change: Any) -> bytes:
    body = json.loads(json.dumps(base))
    if callable(change):
        change(body)
        return json.dumps(body).encode()
    text = json.dumps(body)
    rid = json.dumps(body["request_id"])
    if change == "duplicate":
        return text.replace('"request_id": ', '"request_id": "first", "request_id": ', 1).encode()
    if change == "bom":
        return b"\xef\xbb\xbf" + text.encode()
    if change == "trailing":
        return text.encode() + b" x"
    if change == "array":
        return f"[{text}]".encode()
    if change == "1e400":
        time = f'"request_time": {body["request_time"]!r}'
        return text.replace(time, '"request_time": 1e400').encode()
    return text.replace(rid, change, 1).encode()


@pytest.mark.parametrize("change", [pytest.param(c[1], id=c[0]) for c in AWKWARD])
def test_awkward_json_is_decoded_or_refused_alike(
    requests_sample: list[MirrorRequest], change: Any
) -> None:
    _assert_mirror_agrees(_apply(_body(requests_sample), change))


def test_awkward_table_reaches_both_outcomes(requests_sample: list[MirrorRequest]) -> None:
    """The table is not all refusals (nor all acceptances): both paths are compared."""
    seen = {_assert_mirror_agrees(_apply(_body(requests_sample), c)) for _, c in AWKWARD}
    assert seen == {"accepted", "refused"}


LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 2**31 - 1, 2**31, 2**32, 2**63, 3.4028234e38, 3.5e38, -0.0]),
    st.text(max_size=6),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.sampled_from(["name", "x", "option"]), st.integers(0, 2), max_size=2),
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, child in node.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(node, list):
        for i, child in enumerate(node[:2]):
            out += _paths(child, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn, valid: dict[str, Any]) -> bytes:
    """`valid` with one or two values replaced, removed, or an unknown key added."""
    body = json.loads(json.dumps(valid))
    for _ in range(draw(st.integers(1, 2))):
        path = draw(st.sampled_from(_paths(body)))
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "replace", "remove", "add"]))
        if action == "remove" and isinstance(parent, dict):
            parent.pop(path[-1])
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "labels", "production"]))] = draw(LEAVES)
        else:
            parent[path[-1]] = draw(LEAVES)
    return json.dumps(body).encode()


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mutated_bodies_are_decoded_or_refused_alike(
    requests_sample: list[MirrorRequest], data: st.DataObject
) -> None:
    index = data.draw(st.integers(0, 4))
    body = data.draw(mutated(json.loads(mirror_to_json(requests_sample[index]))))
    _assert_mirror_agrees(body)


OUTCOMES: list[dict[str, Any]] = [
    {"request_id": "r-1", "observed_at": 1.7e9},
    {"request_id": "r-2", "observed_at": 1.7e9, "failure": "oom", "slo_met": False},
    {
        "request_id": "r-3",
        "observed_at": 1.7e9,
        "queue_delay_s": 1.5,
        "throughput": 2,
        "completion_time_s": None,
        "production": {"option": 3, "propensity": 0.25},
    },
    {"request_id": "r-4", "observed_at": 1.7e9, "failure": "melted"},
    {"request_id": "r-5", "observed_at": "soon"},
    {"request_id": "r-6", "observed_at": 1.7e9, "slo_met": 1},
    {"request_id": "r-7", "observed_at": float("nan")},
    {"request_id": "r-8", "observed_at": 1.7e9, "production": {"option": 2**31}},
    {"request_id": "r-9", "observed_at": 1.7e9, "unknown": 1},
    {"observed_at": 1.7e9},
]


@pytest.mark.parametrize("fields", OUTCOMES, ids=[str(i) for i in range(len(OUTCOMES))])
def test_outcomes_are_decoded_or_refused_alike(fields: dict[str, Any]) -> None:
    body = json.dumps(fields).encode()
    ref_kind, ref = _outcome_of(convert.outcome_from_json, body)
    fast_kind, fast = _outcome_of(decode.outcome_from_json, body)
    assert fast_kind == ref_kind, (ref, fast)
    if ref_kind == "refused":
        assert fast == ref
        return
    assert isinstance(fast[0], Outcome)
    _assert_same(fast[0], ref[0])
    assert fast[1] == ref[1]
    _assert_same(outcome_from_pb(contract_pb2.Outcome.FromString(fast[1])), fast[0])


def test_the_journal_holds_the_body_as_sent(requests_sample: list[MirrorRequest]) -> None:
    """As on gRPC: label and hardware-name order are kept, not re-sorted (the contract's
    sets are equal either way). The pydantic path sorted them, so this also shows that
    a valid body is served by the msgspec path, not by the fallback."""
    body = _body(requests_sample)
    n_nodes = len(body["state"]["node_ids"])
    body["state"]["labels"] = ["zone=b", "pool=a"]
    body["state"]["label_offsets"] = [0] + [2] * n_nodes
    body["workload"]["allowed_hardware"] = ["z-class", "a-class"]
    raw = json.dumps(body).encode()
    assert _assert_mirror_agrees(raw) == "accepted"
    journaled = contract_pb2.MirrorRequest.FromString(decode.mirror_from_json(raw)[1])
    assert list(journaled.state.labels) == ["zone=b", "pool=a"]
    assert list(journaled.workload.allowed_hardware) == ["z-class", "a-class"]
