"""The batch wire codec (issue 24): `MirrorBatch` / `OutcomeBatch` bytes <-> batch columns.

Held here, on real protobuf bytes: a batch of valid requests survives
objects -> columns -> bytes -> columns -> objects exactly (identity digest
included) and keeps shared snapshots shared; every layout check refuses the
whole batch naming its wire path; no bytes at all make the decoder raise
anything but `InvalidInput`; the JSON batch form refuses a bad row by index
with the single request's own refusal and batches the rest as the single
route decodes them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.contract import (
    FailureKind,
    InvalidInput,
    MirrorRequest,
    Outcome,
    ProductionDecision,
    RequestLimits,
    validate_request,
)
from service.contract.batch import OutcomeColumns, RequestBatch
from service.contract.errors import (
    MalformedMessage,
    MissingField,
    UnsupportedSchemaVersion,
)
from service.contract.identity import content_sha256
from service.contract.rejections import RejectionReason
from service.environment import simulated_episodes
from service.policies.synthetic import random_requests
from service.transport.http.batch_decode import decode_json_batch, decode_json_outcomes
from service.transport.http.convert import mirror_to_json
from service.transport.http.decode import mirror_from_json, outcome_from_json
from service.wire.batch_codec import (
    batch_from_pb,
    batch_to_pb,
    outcomes_from_pb,
    outcomes_to_pb,
)
from service.wire.understudy.v1 import batch_pb2
from tests.contract import v2_requests as v2
from tests.hostile.pb_strategies import bitflips, field_paths

LIMITS = RequestLimits()
VARIANTS = (
    v2.with_devices,
    v2.naming_devices,
    v2.sharing,
    v2.unknown_capabilities,
    v2.with_distribution,
    v2.spread,
)


def _valid(r: MirrorRequest) -> bool:
    try:
        validate_request(r)
    except InvalidInput:
        return False
    return True


@pytest.fixture(scope="module")
def requests() -> list[MirrorRequest]:
    """Simulated requests of both scenarios and their contract-v2 variants, valid ones only.

    `sharing`, `with_distribution` and `spread` keep their source's `ClusterState`
    object, so the batch shares snapshots between requests."""
    base = [
        r
        for scenario in ("shared", "train")
        for group, _ in simulated_episodes(scenario, 0, range(2))
        for r in group
    ]
    variants = []
    for r in base[::8]:
        for make in VARIANTS:
            try:
                variants.append(make(r))
            except (AssertionError, IndexError):  # a variant the source cannot take
                continue
    out = [r for r in base + variants if _valid(r)]
    assert len(out) > 900
    return out


def _wire(batch: RequestBatch, limits: RequestLimits = LIMITS) -> tuple[bytes, RequestBatch]:
    raw = batch_to_pb(batch).SerializeToString()
    return raw, batch_from_pb(batch_pb2.MirrorBatch.FromString(raw), limits)


def _arrays(obj: Any) -> list[tuple[str, np.ndarray]]:
    """Every array column of a batch dataclass, nested ones included, with its path."""
    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, np.ndarray):
            out.append((f.name, value))
        elif dataclasses.is_dataclass(value):
            out.extend((f"{f.name}.{p}", a) for p, a in _arrays(value))
    return out


# --- (a) round trip ------------------------------------------------------------------


def test_valid_requests_survive_the_wire_exactly(requests: list[MirrorRequest]) -> None:
    for start in range(0, len(requests), LIMITS.max_batch_requests):
        chunk = requests[start : start + LIMITS.max_batch_requests]
        batch = RequestBatch.from_requests(chunk)
        raw, decoded = _wire(batch)
        back = decoded.requests()
        for i, (sent, ref, got) in enumerate(zip(chunk, batch.requests(), back, strict=True)):
            v2.assert_same(ref, got, f"request[{start + i}]")
            assert content_sha256(got) == content_sha256(sent), start + i
        # one decoding: encoding what was decoded gives the bytes back
        assert batch_to_pb(decoded).SerializeToString() == raw


def test_shared_snapshots_stay_shared(requests: list[MirrorRequest]) -> None:
    chunk = requests[-LIMITS.max_batch_requests :]
    batch = RequestBatch.from_requests(chunk)
    assert batch.states.n_states < len(chunk) - 50  # the variants share their source's
    _, decoded = _wire(batch)
    assert decoded.states.n_states == batch.states.n_states
    assert decoded.states.n_nodes == batch.states.n_nodes
    back = decoded.requests()
    for i in range(1, len(chunk)):
        same = chunk[i].state is chunk[i - 1].state
        assert (back[i].state is back[i - 1].state) == same, i


def test_columns_are_read_only_views_of_the_message(requests: list[MirrorRequest]) -> None:
    """No copy of a column whose wire dtype is the dataclass's, and none may be written."""
    _, decoded = _wire(RequestBatch.from_requests([v2.naming_devices(requests[0]), *requests[1:9]]))
    arrays = _arrays(decoded)
    assert len(arrays) > 40
    for path, array in arrays:
        assert not array.flags.writeable, path
    assert isinstance(decoded.states.cpu_free.base, bytes)  # a view, not a copy
    assert isinstance(decoded.options.node_index.base, bytes)
    assert decoded.state_index.dtype == np.int64 and decoded.states.healthy.dtype == np.bool_


@pytest.mark.parametrize("offsets", [b"", np.zeros(1, "<i8").tobytes()])
def test_an_empty_batch_is_refused_whole(offsets: bytes) -> None:
    """No requests (no offsets, or the lone 0 of an empty CSR) is a sender's bug, refused
    naming the count's column, as `RequestBatch.from_requests([])` encodes it or bare."""
    encoded = batch_to_pb(RequestBatch.from_requests([]))
    bare = batch_pb2.MirrorBatch(schema_version=2)
    outcomes = batch_pb2.OutcomeBatch()
    for msg in (encoded, bare, outcomes):
        msg.request_id.offsets = offsets
    cases: list[tuple[Any, Callable[..., object], str]] = [
        (encoded, batch_from_pb, "request"),
        (bare, batch_from_pb, "request"),
        (outcomes, outcomes_from_pb, "outcome"),
    ]
    for msg, decode, noun in cases:
        with pytest.raises(InvalidInput) as caught:
            decode(type(msg).FromString(msg.SerializeToString()), LIMITS)
        assert caught.value.field == "request_id"
        assert caught.value.problem == f"must hold at least one {noun}, got none"


# --- (b) structural faults -------------------------------------------------------------


def _rich(requests: list[MirrorRequest]) -> batch_pb2.MirrorBatch:
    """A batch that sends every optional column: devices (one snapshot without), named
    devices, labels, option ids, distributions, quota, a snapshot shared by two requests."""
    r = requests[0]
    shared = v2.with_distribution(r)
    rows = [
        v2.naming_devices(r),
        shared,
        v2.sharing(shared),
        dataclasses.replace(requests[1], quota_remaining=3.0),
    ]
    msg = batch_pb2.MirrorBatch.FromString(
        batch_to_pb(RequestBatch.from_requests(rows)).SerializeToString()
    )
    s, o, p = msg.states, msg.options, msg.production
    for column in (s.devices_sent, s.device_offsets, s.label_offsets, s.device_ids.utf8):
        assert column
    assert o.devices_named and o.device_offsets and o.option_ids_sent
    assert p.probability_offsets and msg.quota_remaining
    assert len(s.node_offsets) == 8 * 4  # 3 snapshots for 4 requests
    return msg


def _get(msg: Any, path: str) -> Any:
    for part in path.split("."):
        msg = getattr(msg, part)
    return msg


def _set(msg: Any, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    setattr(_get(msg, ".".join(parents)) if parents else msg, last, value)


def _edit(path: str, dtype: str, change: Callable[[np.ndarray], np.ndarray]) -> Callable[..., None]:
    def apply(msg: batch_pb2.MirrorBatch) -> None:
        values = np.frombuffer(_get(msg, path), dtype=dtype).copy()
        _set(msg, path, change(values).astype(dtype).tobytes())

    return apply


def _bytes(path: str, change: Callable[[bytes], bytes]) -> Callable[..., None]:
    return lambda msg: _set(msg, path, change(_get(msg, path)))


def _clear(*paths: str) -> Callable[..., None]:
    def apply(msg: batch_pb2.MirrorBatch) -> None:
        for path in paths:
            _set(msg, path, b"")

    return apply


def _straddle(path: str) -> Callable[..., None]:
    """A 2-byte character over the boundary between the column's first two values: valid
    UTF-8 as a whole, cut inside a character by the offsets."""

    def apply(msg: batch_pb2.MirrorBatch) -> None:
        utf8 = _get(msg, f"{path}.utf8")
        end = int(np.frombuffer(_get(msg, f"{path}.offsets"), "<i8")[1])
        _set(msg, f"{path}.utf8", utf8[: end - 1] + "é".encode() + utf8[end + 1 :])

    return apply


def _put(i: int, value: float) -> Callable[[np.ndarray], np.ndarray]:
    def change(values: np.ndarray) -> np.ndarray:
        values[i] = value
        return values

    return change


# (what was done, the edit, the error class, the field the refusal names, words of its message)
FAULTS = [
    ("truncated f32 column", _bytes("states.cpu_free", lambda b: b[:-1]), InvalidInput,
     "states.cpu_free", "whole number of f32"),
    ("truncated offsets", _bytes("options.entry_offsets", lambda b: b[:-3]), InvalidInput,
     "options.entry_offsets", "whole number of i64"),
    ("a node value short", _edit("states.cpu_free", "<f4", lambda a: a[:-1]), InvalidInput,
     "states.cpu_free", "one f32 per node"),
    ("a node flag short", _bytes("states.healthy", lambda b: b[:-1]), InvalidInput,
     "states.healthy", "one u8 per node"),
    ("a request value extra", _edit("request_time", "<f8", lambda a: np.append(a, 1.0)),
     InvalidInput, "request_time", "one f64 per request"),
    ("a workload value short", _edit("workloads.gang_size", "<i4", lambda a: a[:-1]),
     InvalidInput, "workloads.gang_size", "per request"),
    ("state_index short", _edit("state_index", "<u4", lambda a: a[:-1]), InvalidInput,
     "state_index", "per request"),
    ("an entry value short", _edit("options.accelerators", "<i4", lambda a: a[:-1]),
     InvalidInput, "options.accelerators", "per entry"),
    ("a device value short", _edit("states.device_free_share", "<f4", lambda a: a[:-1]),
     InvalidInput, "states.device_free_share", "per device"),
    ("a production value short", _edit("production.propensity", "<f8", lambda a: a[:-1]),
     InvalidInput, "production.propensity", "per row"),
    ("a strings column short", _edit("workloads.tenant.offsets", "<i8", lambda a: a[:-1]),
     InvalidInput, "workloads.tenant.offsets", "n_requests + 1"),
    ("node offsets not from 0", _edit("states.node_offsets", "<i8", _put(0, 1)), InvalidInput,
     "states.node_offsets[0]", "must be 0"),
    ("entry offsets decreasing", _edit("options.entry_offsets", "<i8", _put(2, 0)),
     InvalidInput, "options.entry_offsets[2]", "non-decreasing"),
    ("option offsets past the options", _edit("options.option_offsets", "<i8", _put(-1, 10**6)),
     InvalidInput, "options.option_offsets[4]", "must end at"),
    ("device offsets short", _edit("states.device_offsets", "<i8", lambda a: a[:-1]),
     InvalidInput, "states.device_offsets", "n_nodes + 1"),
    ("label offsets past the labels", _edit("states.label_offsets", "<i8", _put(-1, 10**6)),
     InvalidInput, "states.label_offsets", "must end at"),
    ("hardware offsets short", _edit("states.hardware_offsets", "<i8", lambda a: a[:-1]),
     InvalidInput, "states.hardware_offsets", "n_states + 1"),
    ("probability offsets past", _edit("production.probability_offsets", "<i8", _put(-1, 99)),
     InvalidInput, "production.probability_offsets", "must end at"),
    ("request id offsets past the text", _edit("request_id.offsets", "<i8", _put(-1, 10**6)),
     InvalidInput, "request_id.offsets", "must end at"),
    ("bool byte 2", _edit("states.healthy", "<u1", _put(3, 2)), InvalidInput,
     "states.healthy[3]", "must be 0 or 1, got 2"),
    ("flag byte 7", _edit("options.devices_named", "<u1", _put(1, 7)), InvalidInput,
     "options.devices_named[1]", "must be 0 or 1, got 7"),
    ("devices on a snapshot that sends none", _edit("states.devices_sent", "<u1", _put(0, 0)),
     InvalidInput, "states.device_offsets[0]", "flag says it sends none"),
    ("devices named but none given", _clear("options.device_offsets", "options.device_index"),
     InvalidInput, "options.devices_named", "device_offsets is empty"),
    ("device index without offsets", _clear("options.device_offsets"), InvalidInput,
     "options.device_offsets", "options.device_index must be too"),
    ("device ids one short", _edit("states.device_ids.offsets", "<i8", lambda a: a[:-1]),
     InvalidInput, "states.device_ids.offsets", "entries"),
    ("option ids flag cleared", _edit("options.option_ids_sent", "<u1", _put(3, 0)),
     InvalidInput, "options.option_ids.offsets", "entries"),
    ("text not UTF-8", _bytes("request_id.utf8", lambda b: b"\xff" + b[1:]), MalformedMessage,
     "request_id.utf8", "must be UTF-8"),
    ("offsets inside a character", _straddle("workloads.tenant"), MalformedMessage,
     "workloads.tenant.offsets[1]", "between characters"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("edit", "error", "field", "words"),
    [pytest.param(*row[1:], id=row[0]) for row in FAULTS],
)
def test_a_layout_fault_refuses_the_whole_batch_naming_its_field(
    requests: list[MirrorRequest],
    edit: Callable[..., None],
    error: type[InvalidInput],
    field: str,
    words: str,
) -> None:
    msg = _rich(requests)
    batch_from_pb(msg, LIMITS)  # the unedited batch is sound
    edit(msg)
    with pytest.raises(error) as caught:
        batch_from_pb(batch_pb2.MirrorBatch.FromString(msg.SerializeToString()), LIMITS)
    got = caught.value.field  # a row without an index takes any: offsets name the entry
    assert got == field or ("[" not in field and got.startswith(f"{field}[")), got
    assert words in caught.value.problem


@pytest.mark.parametrize("version", [0, 1, 3])
def test_a_batch_speaks_schema_2_only(requests: list[MirrorRequest], version: int) -> None:
    msg = _rich(requests)
    msg.schema_version = version
    with pytest.raises(UnsupportedSchemaVersion) as caught:
        batch_from_pb(msg, LIMITS)
    assert caught.value.field == "schema_version" and f"got {version}" in caught.value.problem


def test_more_than_max_batch_requests_is_refused_whole(requests: list[MirrorRequest]) -> None:
    msg = _rich(requests)  # 4 requests
    assert batch_from_pb(msg, RequestLimits(max_batch_requests=4)).n_requests == 4
    with pytest.raises(InvalidInput) as caught:
        batch_from_pb(msg, RequestLimits(max_batch_requests=3))
    assert caught.value.field == "request_id"
    assert "at most 3 requests" in caught.value.problem and "got 4" in caught.value.problem


# --- (c) hostile bytes ----------------------------------------------------------------

_DTYPES = ("<i8", "<i4", "<u4", "<u1", "<f4", "<f8")
_BYTES_PATHS = [
    ".".join(f.name for f in p)
    for p in field_paths(batch_pb2.MirrorBatch.DESCRIPTOR)
    if p[-1].type == p[-1].TYPE_BYTES and not any(f.is_repeated for f in p)
]


def _column_bytes() -> st.SearchStrategy[bytes]:
    """Packed small numbers of any wire dtype (so checks past the byte length run), or raw."""
    packed = st.tuples(st.sampled_from(_DTYPES), st.lists(st.integers(-2, 9), max_size=12)).map(
        lambda t: np.array(t[1]).astype(t[0]).tobytes()
    )
    return st.one_of(packed, st.binary(max_size=24))


@st.composite
def _column_mutation(draw: st.DrawFn, raw: bytes) -> bytes:
    """`raw` with one to three columns replaced, cut, extended, bit-flipped, poked or cleared."""
    msg = batch_pb2.MirrorBatch.FromString(raw)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_BYTES_PATHS))
        old = _get(msg, path)
        how = draw(st.sampled_from(["replace", "cut", "extend", "flip", "poke", "clear"]))
        if how == "poke" and old:  # one byte set: a flag of 2, a count of 255, a stray lead
            at = draw(st.integers(0, len(old) - 1))
            new = old[:at] + bytes([draw(st.integers(0, 255))]) + old[at + 1 :]
        elif how == "replace":
            new = draw(_column_bytes())
        elif how == "cut":
            new = old[: draw(st.integers(0, max(len(old) - 1, 0)))]
        elif how == "extend":
            new = old + draw(st.binary(min_size=1, max_size=16))
        elif how == "flip" and old:
            new = draw(bitflips(old))
        else:
            new = b""
        _set(msg, path, new)
    return bytes(msg.SerializeToString())


def _hostile(raw: bytes) -> st.SearchStrategy[bytes]:
    return st.one_of(
        _column_mutation(raw),
        st.integers(0, len(raw) - 1).map(lambda k: raw[:k]),
        bitflips(raw),
        st.binary(max_size=256),
    )


def _check_sound(batch: RequestBatch) -> None:
    """What a returned batch promises: every column as long as its rows, so B's validator
    may index them freely, and one decoding of its bytes."""
    n, s, o = batch.n_requests, batch.states, batch.options
    assert len(batch.request_time) == len(batch.state_index) == n
    assert len(batch.workloads.gang_size) == len(batch.workloads.kind) == n
    assert len(s.cpu_free) == len(s.healthy) == len(s.zone) == s.n_nodes
    assert len(o.option_offsets) in ((n + 1), 0) and len(o.accelerators) == len(o.node_index)
    for text in (batch.request_id, s.node_ids, s.zone, batch.workloads.kind, o.option_ids):
        text.values()  # decodes
    for path, array in _arrays(batch):
        if array.dtype == np.bool_:  # a flag is 0 or 1, so it reads alike everywhere
            assert np.maximum.reduce(array.view(np.uint8), initial=0) <= 1, path
    again = batch_to_pb(batch).SerializeToString()
    assert batch_to_pb(batch_from_pb(batch_pb2.MirrorBatch.FromString(again), LIMITS)) == (
        batch_pb2.MirrorBatch.FromString(again)
    )


def _fuzz(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )


@functools.cache
def _rich_raw() -> bytes:
    """`_rich` of the first simulated episode, serialized (built once, outside any fixture,
    so Hypothesis replays each example on the same bytes)."""
    group, _ = simulated_episodes("shared", 0, range(1))[0]
    return bytes(_rich(list(group)).SerializeToString())


@given(hostile=st.deferred(lambda: _hostile(_rich_raw())))
@_fuzz(400)
def test_hostile_bytes_decode_or_raise_invalid_input(hostile: bytes) -> None:
    try:
        msg = batch_pb2.MirrorBatch.FromString(hostile)
    except Exception:  # not a message at all: the transport's MalformedMessage
        return
    try:
        batch = batch_from_pb(msg, LIMITS)
    except InvalidInput as exc:
        assert exc.field
        return
    _check_sound(batch)


@given(
    columns=st.dictionaries(st.sampled_from(_BYTES_PATHS), _column_bytes(), max_size=40),
    version=st.sampled_from([2, 2, 2, 1]),
)
@_fuzz(400)
def test_random_columns_decode_or_raise_invalid_input(
    columns: dict[str, bytes], version: int
) -> None:
    msg = batch_pb2.MirrorBatch(schema_version=version)
    for path, value in columns.items():
        _set(msg, path, value)
    try:
        batch = batch_from_pb(msg, LIMITS)
    except InvalidInput as exc:
        assert exc.field
        return
    _check_sound(batch)


_OUTCOME_BYTES = [
    ".".join(f.name for f in p)
    for p in field_paths(batch_pb2.OutcomeBatch.DESCRIPTOR)
    if p[-1].type == p[-1].TYPE_BYTES
]


@given(columns=st.dictionaries(st.sampled_from(_OUTCOME_BYTES), _column_bytes(), max_size=20))
@_fuzz(300)
def test_random_outcome_columns_decode_or_raise_invalid_input(columns: dict[str, bytes]) -> None:
    msg = batch_pb2.OutcomeBatch()
    for path, value in columns.items():
        _set(msg, path, value)
    try:
        cols = outcomes_from_pb(msg, LIMITS)
    except InvalidInput as exc:
        assert exc.field
        return
    assert len(cols.observed_at) == len(cols.failure) == cols.n_outcomes
    assert len(cols.slo_met) in (0, cols.n_outcomes)


# --- (d) the JSON batch form ----------------------------------------------------------


def _single_verdict(row: bytes) -> tuple[str, str, RejectionReason] | MirrorRequest:
    """What the single route makes of `row`: its refusal, or the request it accepts."""
    try:
        request, _ = mirror_from_json(row)
        validate_request(request, LIMITS)
    except UnsupportedSchemaVersion as exc:
        return exc.field, exc.problem, RejectionReason.UNSUPPORTED_SCHEMA_VERSION
    except MissingField as exc:
        return exc.field, exc.problem, RejectionReason.MISSING_FIELD
    except InvalidInput as exc:
        return exc.field, exc.problem, RejectionReason.INVALID_VALUE
    return request


def _bad_rows(good: bytes) -> dict[str, bytes]:
    body = json.loads(good)
    negative = json.loads(good)
    negative["state"]["cpu_free"][1] = -1.0
    short = json.loads(good)
    short["state"]["cpu_free"] = short["state"]["cpu_free"][:-1]
    no_workload = {k: v for k, v in body.items() if k != "workload"}
    return {
        "not an object": b"42",
        "no workload": json.dumps(no_workload).encode(),
        "negative cpu": json.dumps(negative).encode(),
        "a column short": json.dumps(short).encode(),
        "given NaN": good[:-1] + b', "quota_remaining": NaN}',
        "unknown field": good[:-1] + b', "surprise": 1}',
        "schema 3": json.dumps({**body, "schema_version": 3}).encode(),
    }


def test_json_rows_that_fail_are_refused_by_index_the_rest_batched(
    requests: list[MirrorRequest],
) -> None:
    good = [mirror_to_json(r) for r in requests[:40]]
    bad = _bad_rows(good[0])
    rows = list(good)
    at = {name: 3 + 5 * k for k, name in enumerate(bad)}
    for name, i in at.items():
        rows[i] = bad[name]
    body = b'{"requests": [' + b", ".join(rows) + b"]}"
    decoded = decode_json_batch(body, LIMITS)
    assert decoded.n_sent == len(rows)
    assert [r.index for r in decoded.refusals] == sorted(at.values())
    for refusal in decoded.refusals:
        verdict = _single_verdict(rows[refusal.index])
        assert not isinstance(verdict, MirrorRequest), refusal
        assert (refusal.field, refusal.message, refusal.reason) == verdict
    assert {r.field for r in decoded.refusals} >= {"workload", "state.cpu_free[1]", "body"}
    kept = [i for i in range(len(rows)) if i not in at.values()]
    assert decoded.index.tolist() == kept and not decoded.index.flags.writeable
    for i, got in zip(kept, decoded.batch.requests(), strict=True):
        single = _single_verdict(rows[i])
        assert isinstance(single, MirrorRequest)
        v2.assert_same(single, got, f"requests[{i}]")


def test_a_schema_1_json_row_is_refused_by_index(requests: list[MirrorRequest]) -> None:
    v1 = v2.as_schema_1(random_requests(0, 1)[0])  # simulated requests all speak v2
    rows = [mirror_to_json(requests[0]), mirror_to_json(v1)]
    assert isinstance(_single_verdict(rows[1]), MirrorRequest)  # accepted alone
    decoded = decode_json_batch(b'{"requests": [' + b",".join(rows) + b"]}", LIMITS)
    (refusal,) = decoded.refusals
    assert (refusal.index, refusal.field) == (1, "schema_version")
    assert refusal.reason is RejectionReason.UNSUPPORTED_SCHEMA_VERSION
    assert decoded.batch.n_requests == 1


@pytest.mark.parametrize(
    ("body", "error", "field"),
    [
        (b"not json", MalformedMessage, "body"),
        (b"[1, 2]", MalformedMessage, "body"),
        (b"{}", MissingField, "requests"),
        (b'{"requests": 3}', InvalidInput, "requests"),
        (b'{"requests": {"a": 1}}', InvalidInput, "requests"),
        (b'{"requests": [], "more": []}', InvalidInput, "more"),
        (b'{"requests": []}', InvalidInput, "requests"),  # an empty batch: a sender's bug
        (b'{"requests": [1, 2, 3, 4]}', InvalidInput, "requests"),  # over the limit of 3
    ],
)
def test_a_json_body_that_is_no_batch_is_refused_whole(
    body: bytes, error: type[InvalidInput], field: str
) -> None:
    limits = RequestLimits(max_batch_requests=3)
    for decode in (decode_json_batch, decode_json_outcomes):
        text = (
            body.replace(b'"requests"', b'"outcomes"') if decode is decode_json_outcomes else body
        )
        outcomes = decode is decode_json_outcomes
        expect = "outcomes" if outcomes and field == "requests" else field
        with pytest.raises(error) as caught:
            decode(text, limits)
        assert caught.value.field == expect


# --- (e) outcomes ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def outcomes() -> list[Outcome]:
    simulated = [
        o
        for scenario in ("shared", "train")
        for _, by_id in simulated_episodes(scenario, 0, range(1))
        for o in by_id.values()
    ]
    first = simulated[0]
    decided = ProductionDecision(option=2, propensity=0.5, probabilities=(0.25, 0.25, 0.5))
    return [
        *simulated,
        dataclasses.replace(first, queue_delay_s=None, throughput=None, slo_met=None),
        dataclasses.replace(first, slo_met=False, failure=FailureKind.OOM, production=decided),
        dataclasses.replace(first, failure=FailureKind.PREEMPTED, completion_time_s=None),
        dataclasses.replace(
            first, production=ProductionDecision(option=-1, propensity=None, defer_probability=1.0)
        ),
    ]


def test_outcomes_survive_the_wire_exactly(outcomes: list[Outcome]) -> None:
    assert len(outcomes) > 300
    cols = OutcomeColumns.from_outcomes(outcomes)
    raw = outcomes_to_pb(cols).SerializeToString()
    decoded = outcomes_from_pb(batch_pb2.OutcomeBatch.FromString(raw), LIMITS)
    for i, (sent, got) in enumerate(zip(outcomes, decoded.outcomes(), strict=True)):
        v2.assert_same(sent, got, f"outcome[{i}]")
    assert outcomes_to_pb(decoded).SerializeToString() == raw


def test_outcome_layout_faults_refuse_the_whole_batch(outcomes: list[Outcome]) -> None:
    raw = outcomes_to_pb(OutcomeColumns.from_outcomes(outcomes[-4:])).SerializeToString()
    for path, change, field in (
        ("observed_at", lambda b: b[:-8], "observed_at"),
        ("slo_met", lambda b: b[:-1] + b"\x03", "slo_met[3]"),
        ("failure", lambda b: b + b"\x01", "failure"),
        ("production.option", lambda b: b[:-1], "production.option"),
    ):
        msg = batch_pb2.OutcomeBatch.FromString(raw)
        _set(msg, path, change(_get(msg, path)))
        with pytest.raises(InvalidInput) as caught:
            outcomes_from_pb(msg, LIMITS)
        assert caught.value.field == field, path


def test_json_outcome_rows_that_fail_are_refused_by_index(outcomes: list[Outcome]) -> None:
    good = [
        json.dumps(
            {k: v for k, v in dataclasses.asdict(o).items() if v is not None and k != "production"}
            | {"failure": str(o.failure)}
        ).encode()
        for o in outcomes[:10]
    ]
    rows = list(good)
    rows[2] = rows[2][:-1] + b', "failure": "exploded"}'
    rows[5] = rows[5][:-1] + b', "throughput": NaN}'
    rows[7] = b'"an outcome"'
    decoded = decode_json_outcomes(b'{"outcomes": [' + b",".join(rows) + b"]}", LIMITS)
    assert [r.index for r in decoded.refusals] == [2, 5, 7]
    assert decoded.refusals[1].field == "throughput"
    assert decoded.index.tolist() == [0, 1, 3, 4, 6, 8, 9]
    for i, got in zip(decoded.index.tolist(), decoded.outcomes.outcomes(), strict=True):
        single, _ = outcome_from_json(rows[i])
        v2.assert_same(single, got, f"outcomes[{i}]")
        assert not math.isnan(got.observed_at)
