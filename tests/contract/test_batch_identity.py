"""The request identity digest from batch columns (issue 24; docs/ingest.md, "Identity").

`request_digests` is the one definition: a request's digest does not depend on
the batch that carries it, every wire form of one request has one digest, and
any change to what a request says changes it. Real requests (the simulator's
`sample_requests` on the shipped inventory and trace, and the contract-v2
variants of tests/contract/v2_requests.py), real decoders, fixed seeds.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from service.contract import (
    HardwareClass,
    InvalidInput,
    MirrorRequest,
    ProductionDecision,
    RequestLimits,
)
from service.contract.batch import RequestBatch, Strings
from service.contract.batch.identity import (
    request_digests,
    request_encodings,
    single_request_encoding,
)
from service.contract.identity import content_sha256
from service.contract.state import frozen_array
from service.environment.samples import sample_requests
from service.transport.http.convert import mirror_to_json
from service.transport.http.decode import mirror_from_json
from service.wire.batch_codec import batch_from_pb, batch_to_pb
from service.wire.convert import mirror_request_from_pb, mirror_request_to_pb
from service.wire.snapshot_cache import SnapshotCache
from service.wire.understudy.v1 import batch_pb2
from service.wire.understudy.v1 import contract_pb2 as pb
from tests.contract import v2_requests as v2


def _everything(r: MirrorRequest) -> MirrorRequest:
    return v2.with_distribution(v2.sharing(v2.naming_devices(v2.unknown_capabilities(r))))


VARIANTS = (
    v2.with_devices,
    v2.naming_devices,
    v2.sharing,
    v2.unknown_capabilities,
    v2.with_distribution,
    v2.spread,
    _everything,
)


@pytest.fixture(scope="module")
def requests() -> list[MirrorRequest]:
    """Simulated requests (two cluster sizes) and every v2 variant of the first few."""
    simulated = [*sample_requests(12, seed=11), *sample_requests(4, seed=12, n_nodes=16)]
    return simulated + [variant(r) for r in simulated[:3] for variant in VARIANTS]


def _digest_list(batch: RequestBatch) -> list[bytes]:
    return [d.tobytes() for d in request_digests(batch)]


def _copy(r: MirrorRequest) -> MirrorRequest:
    """An equal request built afresh (no array or state object shared with `r`)."""
    return mirror_request_from_pb(mirror_request_to_pb(r))


def test_a_request_has_one_digest_whatever_batch_carries_it(requests: list[MirrorRequest]) -> None:
    alone = [content_sha256(r) for r in requests]
    assert len(set(alone)) == len(requests)
    assert _digest_list(RequestBatch.from_requests(requests)) == alone
    rng = np.random.default_rng(24)
    order = rng.permutation(len(requests)).tolist()
    shuffled = _digest_list(RequestBatch.from_requests([requests[i] for i in order]))
    assert shuffled == [alone[i] for i in order]
    # the columns the batch form gives back hash alike, alone or together
    back = RequestBatch.from_requests(requests).requests()
    assert [content_sha256(r) for r in back] == alone
    assert _digest_list(RequestBatch.from_requests([_copy(r) for r in requests])) == alone


def test_a_shared_snapshot_does_not_change_a_digest(requests: list[MirrorRequest]) -> None:
    """Requests of one scheduling cycle share a snapshot: stored once, each its own digest."""
    base = requests[0]
    cycle = [
        dataclasses.replace(r, state=base.state, request_id=f"cycle-{i}")
        for i, r in enumerate(requests[1:6])
        if r.state.n_nodes == base.state.n_nodes
    ] + [base]
    shared = RequestBatch.from_requests(cycle)
    assert shared.states.n_states == 1
    unshared = RequestBatch.from_requests([_copy(r) for r in cycle])
    assert unshared.states.n_states == len(cycle)
    expected = [content_sha256(r) for r in cycle]
    assert _digest_list(shared) == expected == _digest_list(unshared)
    mixed = RequestBatch.from_requests([requests[7], *cycle, requests[9]])
    assert _digest_list(mixed)[1:-1] == expected


def _reordered_pb(r: MirrorRequest) -> bytes:
    """`r` on the wire with its top-level fields in reverse order (still one message)."""
    msg = mirror_request_to_pb(r)
    parts = []
    for field, value in msg.ListFields():
        one = pb.MirrorRequest()
        if field.message_type is not None:
            getattr(one, field.name).CopyFrom(value)
        else:
            setattr(one, field.name, value)
        parts.append(one.SerializeToString())
    return b"".join(reversed(parts))


def test_every_form_of_one_request_has_one_digest(requests: list[MirrorRequest]) -> None:
    """JSON, protobuf, unknown fields, field order, version 1: one request, one digest."""
    for r in requests:
        digest = content_sha256(r)
        wire = mirror_request_to_pb(r).SerializeToString()
        with_unknown = wire + bytes([0xB8, 0x3E, 0x01])  # field 1000, varint 1: unknown
        forms = [
            mirror_request_from_pb(pb.MirrorRequest.FromString(wire)),
            mirror_request_from_pb(pb.MirrorRequest.FromString(with_unknown)),
            mirror_request_from_pb(pb.MirrorRequest.FromString(_reordered_pb(r))),
            mirror_from_json(mirror_to_json(r))[0],
        ]
        assert [content_sha256(f) for f in forms] == [digest] * len(forms)
    for r in requests[:16]:  # the simulated ones use no v2 field: their version-1 form
        v1 = v2.as_schema_1(r)
        from_v1 = mirror_request_from_pb(mirror_request_to_pb(v1))
        assert from_v1.schema_version == 1
        assert content_sha256(from_v1) == content_sha256(v1) == content_sha256(r)
    # deterministic encodings, not just equal hashes
    one = RequestBatch.from_requests([requests[0]])
    again = RequestBatch.from_requests([mirror_from_json(mirror_to_json(requests[0]))[0]])
    assert request_encodings(one)[0].tobytes() == request_encodings(again)[0].tobytes()


def _unsorted(strings: Strings, offsets: np.ndarray[Any, Any]) -> tuple[Strings, Any]:
    """Each set of a CSR string-set column reversed, its first member repeated."""
    values = strings.values()
    out: list[str] = []
    counts = []
    for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
        members = list(reversed(values[a:b]))
        members += members[:1]
        out += members
        counts.append(len(members))
    return Strings.of(out), frozen_array(np.concatenate([[0], np.cumsum(counts)]), np.int64)


def test_sets_sent_unsorted_or_repeated_mean_the_same_request(
    requests: list[MirrorRequest],
) -> None:
    """Labels and workload sets are sets: a sender's order and repeats are not content."""
    with_sets = [
        dataclasses.replace(
            r,
            workload=dataclasses.replace(
                r.workload,
                allowed_hardware=frozenset({"V100", "A100-80GB", "K80"}),
                affinity=frozenset({"zone=b", "zone=a"}),
            ),
        )
        for r in requests[:4]
    ]
    batch = RequestBatch.from_requests(with_sets)
    st, w = batch.states, batch.workloads
    assert len(st.label_offsets) and st.labels.values()  # the sample has labels
    labels, label_offsets = _unsorted(st.labels, st.label_offsets)
    allowed, allowed_offsets = _unsorted(w.allowed_hardware, w.allowed_hardware_offsets)
    affinity, affinity_offsets = _unsorted(w.affinity, w.affinity_offsets)
    scrambled = dataclasses.replace(
        batch,
        states=dataclasses.replace(st, labels=labels, label_offsets=label_offsets),
        workloads=dataclasses.replace(
            w,
            allowed_hardware=allowed,
            allowed_hardware_offsets=allowed_offsets,
            affinity=affinity,
            affinity_offsets=affinity_offsets,
        ),
    )
    assert scrambled.states.labels.values() != st.labels.values()
    expected = [content_sha256(r) for r in with_sets]
    assert _digest_list(scrambled) == expected
    # and the objects the scrambled columns mean (frozensets) say the same
    assert [content_sha256(r) for r in scrambled.requests()] == expected
    # and so does the batch decoded from the wire, sets in the order the sender wrote them
    wire = batch_to_pb(scrambled).SerializeToString()
    decoded = batch_from_pb(batch_pb2.MirrorBatch.FromString(wire), RequestLimits())
    assert decoded.states.labels.values() == labels.values()
    assert _digest_list(decoded) == expected


def test_a_batch_from_the_wire_has_its_requests_digests(requests: list[MirrorRequest]) -> None:
    """`MirrorBatch` bytes, decoded to read-only views, hash as the single requests do."""
    cycle = [dataclasses.replace(r, state=requests[0].state) for r in requests[1:4]]
    sent = [*requests, *cycle]
    wire = batch_to_pb(RequestBatch.from_requests(sent)).SerializeToString()
    decoded = batch_from_pb(batch_pb2.MirrorBatch.FromString(wire), RequestLimits())
    assert _digest_list(decoded) == [content_sha256(r) for r in sent]


def test_not_given_is_not_given_whatever_nan_was_sent(requests: list[MirrorRequest]) -> None:
    r = requests[0]
    batch = RequestBatch.from_requests([r])
    odd_nan = struct.unpack("<d", struct.pack("<Q", 0xFFF8_0000_DEAD_BEEF))[0]
    assert math.isnan(odd_nan)
    column = frozen_array([odd_nan], np.float64)
    sent = dataclasses.replace(batch, quota_remaining=column)
    assert _digest_list(sent) == [content_sha256(r)]


# --- any change to what a request says changes its digest ---------------------------------


def _next(x: float) -> float:
    return float(np.nextafter(x, math.inf))


def _array_changes(name: str, a: np.ndarray[Any, Any]) -> Iterator[np.ndarray[Any, Any]]:
    if a.size == 0:
        return
    if name.endswith("offsets"):
        if len(a) > 2 and a[1] < a[2]:  # move one boundary: the same values, cut elsewhere
            b = a.copy()
            b[1] += 1
            yield b
        return
    b = a.copy()
    if a.dtype == np.bool_:
        b[0] = not b[0]
    elif a.dtype.kind == "f":
        b[-1] = np.nextafter(b[-1], np.inf)
        zero = np.flatnonzero(a == 0)
        if len(zero):
            c = a.copy()
            c[zero[0]] = -0.0  # -0.0 and 0.0 are two values
            yield frozen_array(c, a.dtype.type)
    else:
        b[-1] += 1
    yield frozen_array(b, a.dtype.type)


def _value_changes(name: str, value: Any, optional: bool = False) -> Iterator[Any]:
    """Single changes of one field's value, by the value's type."""
    if isinstance(value, np.ndarray):
        yield from _array_changes(name, value)
    elif isinstance(value, bool):
        yield not value
    elif isinstance(value, int):
        yield value + 1
    elif isinstance(value, float):
        yield _next(value)
        if optional:  # "not given" / "unknown"
            yield None
    elif value is None:
        yield (1.0,) if name == "probabilities" else 2.5
    elif isinstance(value, str):
        yield value + "x"
        if value:
            yield value[:-1]
    elif isinstance(value, frozenset):
        yield value | {"extra=1"}
        if value:
            yield frozenset(sorted(value)[1:])
    elif isinstance(value, tuple) and value and isinstance(value[0], str):
        yield (value[0] + "x", *value[1:])
        if len(value) > 1 and value[0]:  # one byte moved across a boundary
            yield (value[0][:-1], value[0][-1] + value[1], *value[2:])
        if all(v == "" for v in value):
            yield ()
    elif isinstance(value, tuple) and not value and name in ("option_ids", "device_ids"):
        return  # () means "not sent"; ids of the right count come from the variants
    elif isinstance(value, tuple) and value and isinstance(value[0], frozenset):
        yield (value[0] | {"extra=1"}, *value[1:])
        if len(value) > 1 and value[0]:  # a label moved to the next node
            first = sorted(value[0])[0]
            yield (value[0] - {first}, value[1] | {first}, *value[2:])
    elif isinstance(value, tuple) and value and isinstance(value[0], HardwareClass):
        for change in _dataclass_changes(value[0]):
            yield (change, *value[1:])
        yield (*value, HardwareClass("EXTRA", 1.0, 1.0, 1.0, 1.0))
    elif isinstance(value, tuple) and value and isinstance(value[0], float):
        yield (_next(value[0]), *value[1:])
        yield value[:-1]


def _dataclass_changes(obj: Any) -> Iterator[Any]:
    for f in dataclasses.fields(obj):
        optional = "None" in str(f.type)  # annotated `float | None`
        for changed in _value_changes(f.name, getattr(obj, f.name), optional):
            yield dataclasses.replace(obj, **{f.name: changed})


def _changes(r: MirrorRequest) -> Iterator[MirrorRequest]:
    """Every single change of one field of `r` this suite knows how to make."""
    for name in ("request_id", "request_time", "quota_remaining"):
        for changed in _value_changes(name, getattr(r, name), name == "quota_remaining"):
            yield dataclasses.replace(r, **{name: changed})
    for part in ("state", "workload", "options"):
        for changed in _dataclass_changes(getattr(r, part)):
            yield dataclasses.replace(r, **{part: changed})
    if r.production is None:
        yield dataclasses.replace(r, production=ProductionDecision(0, 0.5))
    else:
        yield dataclasses.replace(r, production=None)
        for changed in _dataclass_changes(r.production):
            yield dataclasses.replace(r, production=changed)
    w = r.workload  # a byte moved between two neighbouring strings
    yield dataclasses.replace(
        r, workload=dataclasses.replace(w, workload_id=w.workload_id + w.kind[:1], kind=w.kind[1:])
    )


def test_every_single_change_gives_another_digest(requests: list[MirrorRequest]) -> None:
    """And the single-request encoding (straight from the object) is, on every one of them,
    the request's row of the batch encoding byte for byte."""
    bases = [requests[0], requests[13], *requests[16:]]
    total = 0
    for base in bases:
        family = [base, *_changes(base)]
        batch = RequestBatch.from_requests(family)
        digests = _digest_list(batch)
        assert len(set(digests)) == len(family), [
            i for i, d in enumerate(digests) if digests.index(d) != i
        ]
        data, offsets = request_encodings(batch)
        for i, r in enumerate(family):
            assert single_request_encoding(r) == data[offsets[i] : offsets[i + 1]].tobytes()
            assert content_sha256(r) == digests[i]
        total += len(family) - 1
    assert total > 500  # the changes reached every field, of every variant


def test_the_version_tag_and_state_are_in_the_encoding(requests: list[MirrorRequest]) -> None:
    """The encoding starts with its version tag, then the snapshot's digest."""
    from service.contract.batch.identity import REQUEST_TAG, state_digests

    batch = RequestBatch.from_requests(requests[:3])
    data, offsets = request_encodings(batch)
    states = state_digests(batch)
    for r in range(3):
        row = data[offsets[r] : offsets[r + 1]].tobytes()
        assert row.startswith(REQUEST_TAG)
        state = states[batch.state_index[r]].tobytes()
        assert row[len(REQUEST_TAG) : len(REQUEST_TAG) + 32] == state


def test_sets_are_put_in_one_order_however_long_their_strings() -> None:
    """The numpy sort (zero-padded bytes, length last) and the Python one for long strings
    agree with `sorted(set(...))` of the strings: prefixes, NUL bytes, non-ASCII, repeats."""
    from service.contract.batch.identity import _canonical_sets

    rng = np.random.default_rng(7)
    alphabet = ["a", "b", "\x00", "é", "ß", "zz", "", "\u4e2d"]
    sets = [
        ["".join(rng.choice(alphabet, size=rng.integers(0, 4))) for _ in range(rng.integers(0, 7))]
        for _ in range(300)
    ]
    column = Strings.of(v for s in sets for v in s)
    offsets = frozen_array(np.concatenate([[0], np.cumsum([len(s) for s in sets])]), np.int64)
    expected = [sorted(set(s)) for s in sets]
    for limit in (1 << 26, 0):  # 0: every string is "too long" to pad
        values, cut = _canonical_sets(column, offsets, len(sets), max_padded=limit)
        got = [list(values.values(a, b)) for a, b in itertools.pairwise(cut.tolist())]
        assert got == expected


# --- a snapshot decoded once and shared (service.wire.snapshot_cache) -----------------------


def _through(cache: SnapshotCache, r: MirrorRequest) -> MirrorRequest:
    """`r` sent as protobuf and decoded through `cache`, as the gRPC servicer decodes it."""
    return mirror_request_from_pb(pb.MirrorRequest.FromString(_wire(r)), snapshots=cache)


def _wire(r: MirrorRequest) -> bytes:
    return mirror_request_to_pb(r).SerializeToString()


def test_a_cached_snapshot_gives_the_digest_of_a_fresh_decode(
    requests: list[MirrorRequest],
) -> None:
    """Decoded through the cache (a miss, then hits sharing one state object) or not,
    alone or in a batch: one request, one digest, byte for byte one encoding."""
    cache = SnapshotCache()
    for r in requests:
        fresh = mirror_request_from_pb(pb.MirrorRequest.FromString(_wire(r)))
        first, again = _through(cache, r), _through(cache, dataclasses.replace(r, request_id="b"))
        assert again.state is first.state  # the second decode was a hit
        assert single_request_encoding(first) == single_request_encoding(fresh)
        assert content_sha256(first) == content_sha256(fresh) == content_sha256(r)
        assert content_sha256(again) == content_sha256(dataclasses.replace(r, request_id="b"))
        assert _digest_list(RequestBatch.from_requests([first, again])) == [
            content_sha256(first),
            content_sha256(again),
        ]
    assert cache.hits >= len(requests)  # (some of the samples share a snapshot too)


def test_a_snapshot_one_field_off_the_cached_one_is_decoded_and_hashed_anew(
    requests: list[MirrorRequest],
) -> None:
    """Every single change of a snapshot this suite makes, sent after the unchanged one is
    cached: a miss, another state object, the digest of a fresh decode, never the cached
    one's; a change that does not decode is refused as it is without the cache."""
    total = 0
    for base in [requests[0], requests[13], *requests[16:]]:
        cache = SnapshotCache(max_entries=1)  # only the base's snapshot is ever held
        cached = _through(cache, base)
        base_digest = content_sha256(cached)
        for changed_state in _dataclass_changes(base.state):
            r = dataclasses.replace(base, state=changed_state)
            raw = _wire(r)
            try:
                fresh = mirror_request_from_pb(pb.MirrorRequest.FromString(raw))
            except InvalidInput as exc:
                with pytest.raises(InvalidInput) as refused:
                    _through(cache, r)
                assert refused.value.field == exc.field
                continue
            if fresh.state is not None and _wire(fresh) == _wire(base):
                continue  # a change the wire cannot carry (the same message)
            via_cache = _through(cache, r)
            assert via_cache.state is not cached.state
            assert content_sha256(via_cache) == content_sha256(fresh) != base_digest
            assert _through(cache, base).state is not via_cache.state
            assert content_sha256(_through(cache, base)) == base_digest
            total += 1
    assert total > 100
