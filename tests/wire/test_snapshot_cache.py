"""The decoded-snapshot cache (service/wire/snapshot_cache.py) and what is kept of a shared
snapshot (service/contract/batch/shared_state.py): exact, bounded, and checked as often as needed.

Real requests (the simulator's `sample_requests`), the real protobuf codec and validator.
The digests themselves are held equal to a fresh decode's, change by change, in
tests/contract/test_batch_identity.py.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from service.contract import InvalidInput, MirrorRequest, RequestLimits
from service.contract.batch import shared_state
from service.contract.identity import content_sha256
from service.contract.state import frozen_array
from service.contract.validation import validate_request
from service.environment.samples import sample_requests
from service.wire.convert import mirror_request_from_pb, mirror_request_to_pb
from service.wire.snapshot_cache import SnapshotCache
from service.wire.understudy.v1 import contract_pb2 as pb


@pytest.fixture(scope="module")
def base() -> MirrorRequest:
    return next(iter(sample_requests(1, seed=5, n_nodes=16)))


def _msg(r: MirrorRequest, schema_version: int | None = None) -> pb.MirrorRequest:
    msg = mirror_request_to_pb(r)
    if schema_version is not None:
        msg.schema_version = schema_version
    return pb.MirrorRequest.FromString(msg.SerializeToString())


def _with_node(r: MirrorRequest, name: str, value: object) -> MirrorRequest:
    column = getattr(r.state, name).copy()
    column[0] = value
    changed = dataclasses.replace(r.state, **{name: frozen_array(column, column.dtype.type)})
    return dataclasses.replace(r, state=changed)


def test_requests_of_one_snapshot_share_one_decoded_state(base: MirrorRequest) -> None:
    cache = SnapshotCache()
    cycle = [dataclasses.replace(base, request_id=f"cycle-{i}") for i in range(5)]
    decoded = [mirror_request_from_pb(_msg(r), snapshots=cache) for r in cycle]
    assert all(d.state is decoded[0].state for d in decoded)
    assert (cache.hits, cache.misses, len(cache)) == (4, 1, 1)
    assert [content_sha256(d) for d in decoded] == [content_sha256(r) for r in cycle]
    assert shared_state.facts(decoded[0].state) is not None  # marked shared: hashed once


def test_the_schema_version_is_part_of_the_key(base: MirrorRequest) -> None:
    """One snapshot's bytes read two ways: an unset capability is 0 in schema 1, unknown
    in schema 2; the cache must not hand one version's state to the other."""
    msg = mirror_request_to_pb(base)
    msg.state.hardware[0].ClearField("peak_dense_tflops")
    raw = msg.SerializeToString()
    cache = SnapshotCache()
    v2 = mirror_request_from_pb(pb.MirrorRequest.FromString(raw), snapshots=cache)
    v1_msg = pb.MirrorRequest.FromString(raw)
    v1_msg.schema_version = 1
    v1_msg.workload.ClearField("kind_name")  # a schema-2 field
    v1 = mirror_request_from_pb(v1_msg, snapshots=cache)
    assert v2.state.hardware[0].peak_dense_tflops is None
    assert v1.state.hardware[0].peak_dense_tflops == 0.0
    assert v1.state is not v2.state and cache.misses == 2


def test_a_shared_snapshot_checked_once_is_still_checked_under_other_limits(
    base: MirrorRequest,
) -> None:
    cache = SnapshotCache()
    first = mirror_request_from_pb(_msg(base), snapshots=cache)
    validate_request(first, RequestLimits())
    facts = shared_state.facts(first.state)
    assert facts is not None and facts.valid_under == RequestLimits()
    again = mirror_request_from_pb(_msg(dataclasses.replace(base, request_id="b")), snapshots=cache)
    assert again.state is first.state
    validate_request(again, RequestLimits())  # passes from what is kept
    tight = RequestLimits(max_nodes=base.state.n_nodes - 1)
    with pytest.raises(InvalidInput) as refused:
        validate_request(again, tight)
    assert refused.value.field == "state.node_ids"


def test_a_bad_snapshot_after_a_good_cached_one_is_refused(base: MirrorRequest) -> None:
    """One node's free cpu above its total: a different snapshot, decoded and checked anew
    (the good one's check is not reused), and refused naming the node; again when resent."""
    cache = SnapshotCache()
    good = mirror_request_from_pb(_msg(base), snapshots=cache)
    validate_request(good, RequestLimits())
    bad = _with_node(base, "cpu_free", float(base.state.cpu_total[0]) + 1.0)
    for _ in range(2):
        decoded = mirror_request_from_pb(_msg(bad), snapshots=cache)
        assert decoded.state is not good.state
        with pytest.raises(InvalidInput) as refused:
            validate_request(decoded, RequestLimits())
        assert refused.value.field == "state.cpu_free[0]"
    validate_request(mirror_request_from_pb(_msg(base), snapshots=cache), RequestLimits())


def test_a_snapshot_that_does_not_decode_is_not_cached(base: MirrorRequest) -> None:
    msg = mirror_request_to_pb(base)
    msg.state.node_hardware[0] = len(msg.state.hardware) + 2**31  # beyond int32: refused
    raw = msg.SerializeToString()
    cache = SnapshotCache()
    for _ in range(2):
        with pytest.raises(InvalidInput) as refused:
            mirror_request_from_pb(pb.MirrorRequest.FromString(raw), snapshots=cache)
        assert refused.value.field == "state.node_hardware[0]"
    assert len(cache) == 0 and cache.misses == 2


def test_the_cache_is_bounded_by_entries_and_bytes(base: MirrorRequest) -> None:
    snapshots = [_with_node(base, "queue_length", i) for i in range(10)]
    size = len(mirror_request_to_pb(base).state.SerializeToString())
    by_count, by_bytes = SnapshotCache(max_entries=3), SnapshotCache(max_bytes=2 * size + 10)
    for cache in (by_count, by_bytes):
        for r in snapshots:
            mirror_request_from_pb(_msg(r), snapshots=cache)
        assert len(cache) <= 3
        latest = mirror_request_from_pb(_msg(snapshots[-1]), snapshots=cache)  # still held
        first = mirror_request_from_pb(_msg(snapshots[0]), snapshots=cache)  # evicted
        assert cache.hits == 1 and cache.misses == len(snapshots) + 1
        assert content_sha256(first) == content_sha256(snapshots[0])
        assert content_sha256(latest) == content_sha256(snapshots[-1])


def test_a_state_built_elsewhere_is_hashed_and_checked_every_time(base: MirrorRequest) -> None:
    """A caller's own `ClusterState` may hold arrays it can still write: nothing is kept of
    it, so a change made in place is seen by the next digest and the next check."""
    column = np.array(base.state.cpu_free, dtype=np.float32)  # writable, the caller's
    state = dataclasses.replace(base.state, cpu_free=column)
    r = dataclasses.replace(base, state=state)
    validate_request(r, RequestLimits())
    before = content_sha256(r)
    column[0] = float(base.state.cpu_total[0]) + 1.0
    assert shared_state.facts(state) is None
    assert content_sha256(r) != before
    with pytest.raises(InvalidInput):
        validate_request(r, RequestLimits())


def test_threads_decoding_at_once_get_the_states_they_sent(base: MirrorRequest) -> None:
    """The servicer decodes on many threads through one cache."""
    cache = SnapshotCache(max_entries=4)
    variants = [_with_node(base, "queue_length", i) for i in range(8)]
    messages = [_msg(r) for r in variants]
    expected = [content_sha256(r) for r in variants]
    wrong: list[int] = []

    def work(offset: int) -> None:
        for k in range(200):
            i = (k + offset) % len(variants)
            if content_sha256(mirror_request_from_pb(messages[i], snapshots=cache)) != expected[i]:
                wrong.append(i)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong
    assert len(cache) <= 4
