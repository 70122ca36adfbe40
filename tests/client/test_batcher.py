"""The client's batching lane, without a network: cuts, bounds, acks and resends.

Deterministic: every wait is on a condition; the clock only bounds a wait as a
hang guard (`HANG_S`), or as the linger the test sets (never asserted above).
The batches are the real ones (the client's converter and `batch_to_pb`),
decoded back with the server's `batch_from_pb` to see which requests they hold.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

from service.client.batcher import Batcher, size_bucket
from service.client.lane import ACCEPTED, REJECTED, REPEATED_SEQUENCE, SHED
from service.client.mirror_client import outcome_batcher, request_batcher
from service.contract import MirrorRequest, Outcome
from service.contract.validation import RequestLimits
from service.wire.batch_codec import batch_from_pb, outcomes_from_pb
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import shadow_pb2

HANG_S = 30.0  # a hang guard, never a duration a test depends on
NEVER = 3600.0  # a linger no test waits out


def requests(sample: list[MirrorRequest], n: int, tag: str = "r") -> list[MirrorRequest]:
    return [dataclasses.replace(sample[i % len(sample)], request_id=f"{tag}-{i}") for i in range(n)]


def ids(message: Any) -> list[str]:
    """Request ids of a built `MirrorBatchStreamRequest`, read as the server reads it."""
    batch = batch_from_pb(message.batch, RequestLimits())
    return [batch.request_id[i] for i in range(batch.n_requests)]


def batcher(diverted: list[Any] | None = None, **limits: Any) -> Batcher:
    sink = diverted if diverted is not None else []
    return request_batcher(100, lambda item, exc: sink.append(item), **limits)


def ack(status: int, sequence: int, **fields: Any) -> shadow_pb2.BatchAck:
    return shadow_pb2.BatchAck(
        status=shadow_pb2.AckStatus.Name(status), sequence=sequence, **fields
    )


def test_a_batch_is_cut_when_it_holds_max_requests(requests_sample: list[MirrorRequest]) -> None:
    b = batcher(max_requests=4, linger_s=NEVER)
    for r in requests(requests_sample, 10):
        assert b.offer(r)
    first, second = b.next_batch(HANG_S), b.next_batch(HANG_S)
    assert first is not None and second is not None
    assert (first[0], ids(first[1])) == (1, [f"r-{i}" for i in range(4)])
    assert (second[0], ids(second[1])) == (2, [f"r-{i}" for i in range(4, 8)])
    assert b.next_batch(0.0) is None, "two requests, linger not due: no batch yet"
    b.hurry(True)  # what flush() does
    third = b.next_batch(HANG_S)
    assert third is not None and ids(third[1]) == ["r-8", "r-9"]
    stats = b.batch_stats()
    assert stats.cut_by == {"requests": 2, "flush": 1}
    assert (stats.batches_sent, stats.requests_batched, stats.max_requests) == (3, 10, 4)
    assert stats.size_histogram == {2: 1, 4: 2} and stats.mean_requests == 10 / 3


def test_a_batch_is_cut_before_its_encoded_columns_pass_max_bytes(
    requests_sample: list[MirrorRequest],
) -> None:
    sent = requests(requests_sample, 12)
    one = request_batcher(10, lambda *_: None, max_requests=1)
    one.offer(sent[0])
    single = one.next_batch(HANG_S)
    assert single is not None
    size = single[1].batch.ByteSize()
    limit = int(size * 3.5)  # room for about three requests
    b = batcher(max_bytes=limit, linger_s=NEVER)
    for r in sent:
        assert b.offer(r)
    b.hurry(True)
    got: list[str] = []
    while len(got) < len(sent):
        item = b.next_batch(HANG_S)
        assert item is not None
        assert item[1].batch.ByteSize() <= limit
        got += ids(item[1])
    assert got == [r.request_id for r in sent], "a byte cut keeps every request, in order"
    stats = b.batch_stats()
    assert stats.cut_by.get("bytes", 0) >= 1 and stats.max_requests < len(sent)


def test_a_single_request_over_max_bytes_still_goes_alone(
    requests_sample: list[MirrorRequest],
) -> None:
    b = batcher(max_bytes=1, linger_s=NEVER)
    for r in requests(requests_sample, 3):
        b.offer(r)
    b.hurry(True)
    sizes = [len(ids(item[1])) for item in (b.next_batch(HANG_S) for _ in range(3)) if item]
    assert sizes == [1, 1, 1]


def test_a_batch_is_cut_linger_s_after_its_first_request(
    requests_sample: list[MirrorRequest],
) -> None:
    b = batcher(linger_s=0.05)
    for r in requests(requests_sample, 3):
        assert b.offer(r)
    item = b.next_batch(HANG_S)
    assert item is not None and len(ids(item[1])) == 3
    stats = b.batch_stats()
    assert stats.cut_by == {"linger": 1}
    assert stats.linger_waited_max_s >= 0.05, "cut only once the linger had passed"


def test_a_full_lane_refuses_without_blocking_and_counts_it(
    requests_sample: list[MirrorRequest],
) -> None:
    b = request_batcher(5, lambda *_: None, max_requests=3, linger_s=NEVER)
    offered = requests(requests_sample, 9)
    assert [b.offer(r) for r in offered[:7]] == [True] * 5 + [False] * 2
    assert b.next_batch(HANG_S) is not None  # 3 requests now in flight, still held
    assert not b.offer(offered[7]), "requests in an unacked batch still fill the buffer"
    b.acknowledge(ack(ACCEPTED, 1))  # retires the batch: room for 3
    assert b.offer(offered[8])
    stats = b.stats()
    assert (stats.offered, stats.dropped, stats.accepted, stats.in_flight) == (9, 3, 3, 3)
    assert stats.offered == stats.delivered + stats.dropped + stats.in_flight


def test_after_a_broken_stream_unacked_batches_are_resent_whole_and_acked_ones_never(
    requests_sample: list[MirrorRequest],
) -> None:
    b = batcher(max_requests=2, linger_s=NEVER)
    for r in requests(requests_sample, 6):
        b.offer(r)
    sent = [b.next_batch(HANG_S) for _ in range(3)]
    assert [s[0] for s in sent if s] == [1, 2, 3]
    b.acknowledge(ack(ACCEPTED, 1))  # batch 1 retired; 2 and 3 unacked when the stream breaks
    b.requeue_unacked()
    resent = [b.next_batch(HANG_S) for _ in range(2)]
    assert b.next_batch(0.0) is None, "nothing else to send: batch 1 is never resent"
    assert [(s[0], ids(s[1])) for s in resent if s] == [
        (4, ["r-2", "r-3"]),
        (5, ["r-4", "r-5"]),
    ], "whole, in order, renumbered above every earlier sequence"
    b.acknowledge(ack(ACCEPTED, 5))
    stats, batches = b.stats(), b.batch_stats()
    assert (stats.accepted, stats.in_flight, stats.resent) == (6, 0, 4)
    assert (batches.batches_sent, batches.batches_resent) == (3, 2)


def test_a_broken_streams_waiting_sender_leaves_the_batch_for_the_next_stream(
    requests_sample: list[MirrorRequest],
) -> None:
    """The lane race (test_lane_broken_stream.py) in batch form."""
    b = batcher(linger_s=0.0)
    broken = threading.Event()
    waiting = threading.Event()
    got: list[object] = []

    def dead_stream_sender() -> None:
        waiting.set()
        got.append(b.next_batch(HANG_S, live=lambda: not broken.is_set()))

    sender = threading.Thread(target=dead_stream_sender)
    sender.start()
    assert waiting.wait(HANG_S)
    broken.set()
    b.requeue_unacked()
    assert b.offer(requests(requests_sample, 1)[0])  # wakes the dead stream's sender
    sender.join(HANG_S)
    assert not sender.is_alive() and got == [None]
    item = b.next_batch(HANG_S, live=lambda: True)
    assert item is not None and ids(item[1]) == ["r-0"]


def test_per_batch_acks_give_per_request_fates(requests_sample: list[MirrorRequest]) -> None:
    b = batcher(max_requests=3, linger_s=NEVER)
    for r in requests(requests_sample, 12):
        b.offer(r)
    for _ in range(4):
        assert b.next_batch(HANG_S) is not None
    b.acknowledge(
        ack(
            REJECTED,
            2,
            accepted=1,
            rejected=2,
            rejections=[
                shadow_pb2.BatchRejection(
                    index=0, field="state.cpu_free[0]", reason="invalid_value"
                ),
                shadow_pb2.BatchRejection(index=2, field="workload", reason="missing_field"),
            ],
        )
    )
    b.acknowledge(ack(SHED, 3, accepted=1, shed=2))
    b.acknowledge(
        ack(
            REJECTED,
            4,
            whole_batch=True,
            rejections=[shadow_pb2.BatchRejection(field="states.cpu_free", reason="malformed")],
        )
    )
    assert b.stats().delivered == 0, "individual acks wait for the cumulative one"
    b.acknowledge(ack(ACCEPTED, 4))
    stats = b.stats()
    assert (stats.accepted, stats.shed, stats.rejected, stats.in_flight) == (3 + 1 + 1, 2, 5, 0)
    assert stats.rejected_by_reason == {"invalid_value": 1, "missing_field": 1, "malformed": 3}
    assert stats.delivered == 12 and stats.protocol_errors == 0


def test_acks_about_no_batch_or_with_wrong_counts_are_protocol_errors(
    requests_sample: list[MirrorRequest],
) -> None:
    b = batcher(max_requests=2, linger_s=NEVER)
    for r in requests(requests_sample, 4):
        b.offer(r)
    for _ in range(2):
        assert b.next_batch(HANG_S) is not None
    b.acknowledge(ack(REPEATED_SEQUENCE, 1))
    b.acknowledge(ack(REJECTED, 0, whole_batch=True))  # a message the server could not read
    b.acknowledge(ack(SHED, 9, shed=2))  # a batch this lane never sent
    b.acknowledge(ack(SHED, 2, accepted=2, shed=2))  # four fates for a batch of two
    b.acknowledge(ack(ACCEPTED, 2))
    stats = b.stats()
    assert stats.protocol_errors == 4
    assert (stats.accepted, stats.shed, stats.rejected) == (4, 0, 0)
    assert stats.offered == stats.delivered + stats.dropped + stats.in_flight


def test_what_a_batch_cannot_carry_is_diverted_not_lost(
    requests_sample: list[MirrorRequest],
) -> None:
    diverted: list[Any] = []
    b = batcher(diverted, linger_s=NEVER)
    good = requests(requests_sample, 2)
    no_state = mirror_request_to_pb(good[0])
    no_state.request_id = "no-state"
    no_state.ClearField("state")
    schema_1 = mirror_request_to_pb(good[1])
    schema_1.request_id, schema_1.schema_version = "v1", 1
    for offered in (good[0], no_state, schema_1, mirror_request_to_pb(good[1])):
        assert b.offer(offered)
    b.hurry(True)
    item = b.next_batch(HANG_S)
    assert item is not None and ids(item[1]) == ["r-0", "r-1"]
    assert [d.request_id for d in diverted] == ["no-state", "v1"]
    assert b.batch_stats().diverted == 2 and b.stats().in_flight == 2


def test_outcomes_batch_the_same_way(requests_sample: list[MirrorRequest]) -> None:
    b = outcome_batcher(10, lambda *_: None, max_requests=2, linger_s=NEVER)
    for i in range(3):
        assert b.offer(Outcome(request_id=f"o-{i}", observed_at=1.0 + i, throughput=2.0))
    first = b.next_batch(HANG_S)
    assert first is not None
    cols = outcomes_from_pb(first[1].batch, RequestLimits())
    assert [o.request_id for o in cols.outcomes()] == ["o-0", "o-1"]
    assert b.next_batch(0.0) is None


@pytest.mark.parametrize(("n", "bucket"), [(1, 1), (2, 2), (3, 4), (64, 64), (65, 128)])
def test_size_buckets_are_powers_of_two(n: int, bucket: int) -> None:
    assert size_bucket(n) == bucket


def test_consecutive_protobuf_requests_with_equal_states_share_one_snapshot(
    requests_sample: list[MirrorRequest],
) -> None:
    """One scheduling cycle's requests, mirrored as protobuf one after another, cost one
    snapshot in the batch; a batch still means exactly the requests it was given."""
    a, b = requests_sample[0], requests_sample[1]
    pbs = []
    for i, source in enumerate([a, a, a, b, b, a]):
        msg = mirror_request_to_pb(source)
        msg.request_id = f"p-{i}"
        pbs.append(msg)
    lane = batcher(linger_s=NEVER)
    for msg in pbs:
        assert lane.offer(msg)
    lane.hurry(True)
    item = lane.next_batch(HANG_S)
    assert item is not None
    batch = batch_from_pb(item[1].batch, RequestLimits())
    assert batch.states.n_states == 3, "a, b, then a again: only the previous state is compared"
    assert batch.state_index.tolist() == [0, 0, 0, 1, 1, 2]
    assert [mirror_request_to_pb(r) for r in batch.requests()] == pbs
