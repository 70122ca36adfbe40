"""Batch RPCs through a real gRPC server (issue 24): refusals by index, acks per batch.

Against a real service on loopback (ingest only, so the journal is read
untouched): a batch with bad requests at chosen indexes is accepted except
those, which are named by index, field, reason and the very message the
single-request validator gives for that request; a batch that cannot be read
(a truncated column) is INVALID_ARGUMENT naming the column, counted per
request; an empty batch is refused whole naming `request_id` (unary and
stream); on the batch stream, wholly accepted batches are covered by
cumulative acks, a batch with refusals is acked alone under its sequence
before any cumulative ack covers it, a repeated sequence is REPEATED_SEQUENCE,
an unreadable message is REJECTED under sequence 0, and the running totals
equal what was sent; a batch that does not parse inside readable framing keeps
its sequence; an idle batch stream is closed; seeded fuzzes of damaged batch
bytes are all answered and counted exactly; outcome batches likewise; no token
is UNAUTHENTICATED. With the scorer on, a batch's accepted requests (over gRPC
and HTTP) reach the decision log and its refused ones do not.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from service.contract import MirrorRequest
from service.contract.batch import RequestBatch
from service.contract.errors import NotFound
from service.contract.rejections import REASON_CODES
from service.server.app import Service
from service.storage import count_requests, logged_request
from service.wire.batch_codec import batch_to_pb
from service.wire.field_paths import KNOWN_FIELD_PATHS
from service.wire.understudy.v1 import batch_pb2, shadow_pb2, shadow_pb2_grpc
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

ACCEPTED = shadow_pb2.ACK_STATUS_ACCEPTED
REJECTED = shadow_pb2.ACK_STATUS_REJECTED
REPEATED = shadow_pb2.ACK_STATUS_REPEATED_SEQUENCE
Metadata = tuple[tuple[str, str], ...]
Stub = shadow_pb2_grpc.ShadowEvaluationStub
BAD = {1: "request_time", 4: "gang_size", 6: "cpu_free"}
PROTOBUF = "application/x-protobuf"


def _spoiled(sample: list[MirrorRequest], n: int, tag: str, bad: dict[int, str]) -> Any:
    msg = encode(with_ids(sample, n, tag))
    for index, how in bad.items():
        spoil(msg, index, how)
    return msg


def _ingest(service: Service, transport: str, result: str) -> float:
    return counted(
        service, "understudy_ingest_total", transport=transport, kind="mirror", result=result
    )


def test_a_unary_batch_refuses_bad_requests_by_index_and_accepts_the_rest(
    service: Service, stub: Stub, auth: Metadata, requests_sample: list[MirrorRequest]
) -> None:
    msg = _spoiled(requests_sample, 8, "u", BAD)
    expected = single_verdicts(msg)
    assert set(expected) == set(BAD), expected  # the oracle sees exactly the spoiled ones
    ack = stub.MirrorMany(msg, metadata=auth)
    assert (ack.status, ack.sequence, ack.accepted, ack.shed, ack.rejected) == (
        REJECTED,
        0,
        5,
        0,
        3,
    )
    assert not ack.whole_batch
    assert ack_verdicts(ack.rejections) == expected  # same field, reason and words
    assert [r.field for r in ack.rejections] == [
        "request_time",
        "workload.gang_size",
        "state.cpu_free[]",
    ]
    assert "`state.cpu_free[5]`" in ack.rejections[2].message  # the exact path, in the text
    for r in ack.rejections:
        assert r.field in KNOWN_FIELD_PATHS and r.reason in REASON_CODES
    assert journaled(service) == [f"u-{i}" for i in range(8) if i not in BAD]
    assert _ingest(service, "grpc_batch", "accepted") == 5
    assert _ingest(service, "grpc_batch", "rejected") == 3
    rejections = "understudy_ingest_rejections_total"
    labels = {"transport": "grpc_batch", "kind": "mirror"}
    assert counted(service, rejections, **labels, field="workload.gang_size") == 1
    assert counted(service, rejections, **labels, field="state.cpu_free[]") == 1


def test_a_wholly_valid_unary_batch_is_accepted(
    service: Service, stub: Stub, auth: Metadata, requests_sample: list[MirrorRequest]
) -> None:
    ack = stub.MirrorMany(encode(with_ids(requests_sample, 5, "ok")), metadata=auth)
    assert (ack.status, ack.accepted, ack.shed, ack.rejected, len(ack.rejections)) == (
        ACCEPTED,
        5,
        0,
        0,
        0,
    )
    assert journaled(service) == [f"ok-{i}" for i in range(5)]


def test_an_unreadable_batch_is_invalid_argument_naming_the_column_counted_per_request(
    service: Service, stub: Stub, auth: Metadata, requests_sample: list[MirrorRequest]
) -> None:
    msg = encode(with_ids(requests_sample, 6, "t"))
    truncate(msg)
    with pytest.raises(grpc.RpcError) as caught:
        stub.MirrorMany(msg, metadata=auth)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "`states.cpu_free`" in caught.value.details()
    labels = {"transport": "grpc_batch", "kind": "mirror"}
    assert (
        counted(service, "understudy_ingest_rejections_total", **labels, field="states.cpu_free")
        == 6
    )
    assert _ingest(service, "grpc_batch", "rejected") == 6
    assert journaled(service) == []
    # not a protobuf at all: refused, counted, not an uncounted INTERNAL
    raw = grpc_raw_unary(service, "MirrorMany", b"\xff\xff not a batch", auth)
    assert raw == grpc.StatusCode.INVALID_ARGUMENT
    assert _ingest(service, "grpc_batch", "rejected") == 7


def grpc_raw_unary(service: Service, method: str, body: bytes, auth: Metadata) -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        call = channel.unary_unary(
            f"/understudy.v1.ShadowEvaluation/{method}",
            request_serializer=lambda b: b,
            response_deserializer=shadow_pb2.BatchAck.FromString,
        )
        try:
            call(body, metadata=auth, timeout=30)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def _envelope(sequence: int, batch: Any | None) -> bytes:
    env = shadow_pb2.MirrorBatchStreamRequest(sequence=sequence)
    if batch is not None:
        env.batch.CopyFrom(batch)
    return bytes(env.SerializeToString())


def _batch_stream(service: Service, raws: list[bytes], auth: Metadata) -> list[Any]:
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        call = channel.stream_stream(
            "/understudy.v1.ShadowEvaluation/MirrorManyStream",
            request_serializer=lambda b: b,
            response_deserializer=shadow_pb2.BatchStreamAck.FromString,
        )
        return [a.ack for a in call(iter(raws), metadata=auth, timeout=60)]


def test_the_batch_stream_acks_cumulatively_and_each_refused_batch_alone(
    service: Service, auth: Metadata, requests_sample: list[MirrorRequest]
) -> None:
    sample = requests_sample
    good_a = encode(with_ids(sample, 3, "a"))
    good_b = encode(with_ids(sample, 2, "b"))
    mixed = _spoiled(sample, 4, "c", {0: "gang_size", 2: "request_time"})
    expected_c = single_verdicts(mixed)
    unreadable = encode(with_ids(sample, 3, "d"))
    truncate(unreadable)
    reused = encode(with_ids(sample, 2, "e"))
    good_f = encode(with_ids(sample, 2, "f"))
    raws = [
        _envelope(1, good_a),
        _envelope(2, good_b),
        _envelope(3, mixed),
        _envelope(4, unreadable),
        _envelope(4, reused),  # repeated: not read further, not journaled
        b"\xff\xff not a protobuf",  # no sequence of its own
        _envelope(5, good_f),
        _envelope(6, None),  # numbered, but holds no batch
    ]
    acks = _batch_stream(service, raws, auth)
    individual = [a for a in acks if a.status != ACCEPTED]
    summary = [(a.status, a.sequence, a.accepted, a.rejected, a.whole_batch) for a in individual]
    assert summary == [
        (REJECTED, 3, 2, 2, False),
        (REJECTED, 4, 0, 3, True),  # the stated count of a batch refused whole
        (REPEATED, 4, 0, 2, True),
        (REJECTED, 0, 0, 0, True),  # unreadable: its size is unknown
        (REJECTED, 6, 0, 0, True),
    ]
    assert ack_verdicts(individual[0].rejections) == expected_c
    whole = [
        (a.rejections[0].index, a.rejections[0].field, a.rejections[0].reason)
        for a in individual[1:]
    ]
    assert whole == [
        (0, "states.cpu_free", "invalid_value"),
        (0, "sequence", "repeated_sequence"),
        (0, "message", "malformed_message"),
        (0, "batch", "missing_field"),
    ]
    assert all(len(a.rejections) == 1 for a in individual[1:])
    assert "`states.cpu_free`" in individual[1].rejections[0].message
    # cumulative acks: increasing, ending at the last sequence; a refused batch is announced
    # before the first cumulative ack that covers it
    cumulative = [a.sequence for a in acks if a.status == ACCEPTED]
    assert cumulative == sorted(set(cumulative)) and cumulative[-1] == 6
    first_covering_3 = next(
        i for i, a in enumerate(acks) if a.status == ACCEPTED and a.sequence >= 3
    )
    assert acks.index(individual[0]) < first_covering_3
    assert all(not a.rejections and not a.whole_batch for a in acks if a.status == ACCEPTED)
    # running totals of requests: what was sent (readable), on every ack, never decreasing
    last = acks[-1]
    assert (last.stream_accepted, last.stream_shed, last.stream_rejected) == (9, 0, 7)
    totals = [(a.stream_accepted, a.stream_rejected) for a in acks]
    assert totals == sorted(totals)
    assert sum(a.accepted for a in acks) == last.stream_accepted  # nothing counted twice
    assert journaled(service) == [
        *(f"a-{i}" for i in range(3)),
        *(f"b-{i}" for i in range(2)),
        "c-1",
        "c-3",
        *(f"f-{i}" for i in range(2)),
    ]
    stream = "grpc_batch_stream"
    assert _ingest(service, stream, "accepted") == 9
    # 7 requests refused with a readable count, plus the unreadable message and the empty
    # envelope counted as one each (their size is unknown)
    assert _ingest(service, stream, "rejected") == 9
    refusals = "understudy_grpc_stream_refusals_total"
    assert counted(service, refusals, kind="mirror", reason="repeated_sequence") == 1
    assert counted(service, refusals, kind="mirror", reason="malformed_message") == 1


def test_outcome_batches_refuse_by_index_on_the_unary_call_and_the_stream(
    service: Service, auth: Metadata, stub: Stub, requests_sample: list[MirrorRequest]
) -> None:
    items = outcomes(with_ids(requests_sample, 5, "o"))
    msg = encode_outcomes(items)
    observed = np.frombuffer(msg.observed_at, dtype="<f8").copy()
    observed[3] = float("nan")
    msg.observed_at = observed.tobytes()
    ack = stub.ReportOutcomes(msg, metadata=auth)
    assert (ack.status, ack.accepted, ack.rejected) == (REJECTED, 4, 1)
    assert [(r.index, r.field) for r in ack.rejections] == [(3, "observed_at")]
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        call = channel.stream_stream(
            "/understudy.v1.ShadowEvaluation/ReportOutcomesStream",
            request_serializer=lambda b: b,
            response_deserializer=shadow_pb2.BatchStreamAck.FromString,
        )
        envelopes = [
            shadow_pb2.OutcomeBatchStreamRequest(sequence=1, batch=encode_outcomes(items[:2])),
            shadow_pb2.OutcomeBatchStreamRequest(sequence=2, batch=msg),
        ]
        raws = [e.SerializeToString() for e in envelopes]
        acks = [a.ack for a in call(iter(raws), metadata=auth, timeout=60)]
    refused = [a for a in acks if a.status != ACCEPTED]
    assert [(a.sequence, a.accepted, a.rejected) for a in refused] == [(2, 4, 1)]
    assert (acks[-1].sequence, acks[-1].stream_accepted, acks[-1].stream_rejected) == (2, 6, 1)
    kept = [o.request_id for i, o in enumerate(items) if i != 3]
    assert journaled_outcomes(service) == kept + [o.request_id for o in items[:2]] + kept


def test_batch_rpcs_need_a_runtime_token(
    service: Service, stub: Stub, requests_sample: list[MirrorRequest]
) -> None:
    msg = encode(with_ids(requests_sample, 2, "n"))
    with pytest.raises(grpc.RpcError) as unary:
        stub.MirrorMany(msg)
    assert unary.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as streamed:
        list(
            stub.MirrorManyStream(
                iter([shadow_pb2.MirrorBatchStreamRequest(sequence=1, batch=msg)])
            )
        )
    assert streamed.value.code() == grpc.StatusCode.UNAUTHENTICATED
    reviewer = (("authorization", "Bearer r-tok"),)
    with pytest.raises(grpc.RpcError) as wrong_role:
        stub.MirrorMany(msg, metadata=reviewer)
    assert wrong_role.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert journaled(service) == []


def test_an_idle_batch_stream_is_closed_and_counted(
    make_service: Callable[..., Service], auth: Metadata, requests_sample: list[MirrorRequest]
) -> None:
    """The batch stream shares the single streams' driver: idle past the timeout, it is
    closed DEADLINE_EXCEEDED (after acking what came), and counted."""
    service = make_service(scoring_enabled=False, grpc_stream_idle_timeout_s=0.5)
    gate = threading.Event()

    def sends() -> Iterator[bytes]:
        yield _envelope(1, encode(with_ids(requests_sample, 2, "i")))
        gate.wait(30)  # then nothing, until the server gives up on the stream

    acks: list[Any] = []
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        call = channel.stream_stream(
            "/understudy.v1.ShadowEvaluation/MirrorManyStream",
            request_serializer=lambda b: b,
            response_deserializer=shadow_pb2.BatchStreamAck.FromString,
        )
        with pytest.raises(grpc.RpcError) as closed:
            for ack in call(sends(), metadata=auth, timeout=30):
                acks.append(ack.ack)
        gate.set()
    assert closed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "UNDERSTUDY_GRPC_STREAM_IDLE_TIMEOUT_S" in closed.value.details()
    assert [(a.status, a.sequence, a.stream_accepted) for a in acks] == [(ACCEPTED, 1, 2)]
    assert counted(service, "understudy_grpc_streams_idle_closed_total") == 1


@pytest.mark.parametrize("seed", range(12))
def test_a_fuzzed_batch_stream_answers_every_message_and_counts_exactly(
    service: Service, auth: Metadata, requests_sample: list[MirrorRequest], seed: int
) -> None:
    """Random damage to the bytes of valid batches (bytes changed, cut short): the stream
    never fails, every numbered message is handled (acked alone or covered by a
    cumulative ack), ack counts stay within what was sent, every field and reason is
    from the allow-lists, and what ingest counted equals what the acks say."""
    rng = random.Random(seed)
    raws = []
    for sequence in range(1, rng.randint(1, 5) + 1):
        batch = encode(with_ids(requests_sample, 3, f"z{seed}-{sequence}"))
        body = bytearray(batch.SerializeToString())
        for _ in range(rng.randint(0, 4)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        if rng.random() < 0.5:
            body = body[: rng.randint(0, len(body))]
        env = shadow_pb2.MirrorBatchStreamRequest(sequence=sequence).SerializeToString()
        raws.append(env + b"\x12" + _varint(len(body)) + bytes(body))
    acks = _batch_stream(service, raws, auth)  # raises if the stream failed
    handled = {a.sequence for a in acks if a.status != ACCEPTED}
    covered = max((a.sequence for a in acks if a.status == ACCEPTED), default=0)
    assert all(s in handled or s <= covered for s in range(1, len(raws) + 1)), acks
    for a in acks:
        assert a.accepted + a.shed + a.rejected <= 3 * len(raws)
        for r in a.rejections:
            assert r.field in KNOWN_FIELD_PATHS and r.reason in REASON_CODES, r
    last = acks[-1]
    assert last.stream_accepted + last.stream_shed + last.stream_rejected <= 3 * len(raws)
    assert _ingest(service, "grpc_batch_stream", "accepted") == last.stream_accepted
    assert len(journaled(service)) == last.stream_accepted  # fresh ids: none is a duplicate


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def test_a_batch_that_does_not_parse_is_refused_under_its_own_sequence(
    service: Service, auth: Metadata, requests_sample: list[MirrorRequest]
) -> None:
    """The framing around it was readable, so the message keeps its number (the client
    can retire exactly that batch); the next batch is still accepted."""
    corrupt = shadow_pb2.MirrorBatchStreamRequest(sequence=1).SerializeToString()
    corrupt += b"\x12\x04\xff\xff\xff\xff"  # field 2, four bytes that are no MirrorBatch
    acks = _batch_stream(
        service, [corrupt, _envelope(2, encode(with_ids(requests_sample, 2, "k")))], auth
    )
    refused = [a for a in acks if a.status != ACCEPTED]
    assert [(a.sequence, a.whole_batch) for a in refused] == [(1, True)]
    assert (refused[0].rejections[0].field, refused[0].rejections[0].reason) == (
        "batch",
        "malformed_message",
    )
    assert (acks[-1].status, acks[-1].sequence, acks[-1].stream_accepted) == (ACCEPTED, 2, 2)
    assert journaled(service) == ["k-0", "k-1"]


@pytest.mark.live
def test_the_accepted_requests_of_a_batch_are_logged_on_both_transports(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    """With the scorer on: the good requests of a batch with bad ones, sent over gRPC
    and over HTTP, reach the decision log; the refused ones do not."""
    service = make_service()
    assert service.engine is not None
    engine = service.engine
    auth = (("authorization", f"Bearer {runtime_token}"),)
    over_grpc = _spoiled(requests_sample, 6, "lg", {1: "gang_size", 4: "cpu_free"})
    over_http = _spoiled(requests_sample[6:], 5, "lh", {0: "request_time"})
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = shadow_pb2_grpc.ShadowEvaluationStub(channel)  # type: ignore[no-untyped-call]
        assert stub.MirrorMany(over_grpc, metadata=auth).accepted == 4
    reply = httpx.post(
        f"http://127.0.0.1:{service.http_port}/v1/mirror/batch",
        content=over_http.SerializeToString(),
        headers={"authorization": f"Bearer {runtime_token}"} | {"content-type": PROTOBUF},
        timeout=30,
    )
    assert reply.json()["accepted"] == 4
    good = [f"lg-{i}" for i in (0, 2, 3, 5)] + [f"lh-{i}" for i in (1, 2, 3, 4)]
    deadline = time.monotonic() + 120  # a hang guard, not a speed requirement
    while count_requests(engine) < len(good):
        assert time.monotonic() < deadline, "the batch's requests were never logged"
        time.sleep(0.05)  # poll interval of a condition wait
    for request_id in good:
        assert logged_request(engine, request_id).request_id == request_id
    for refused in ("lg-1", "lg-4", "lh-0"):
        with pytest.raises(NotFound):
            logged_request(engine, refused)
    assert count_requests(engine) == len(good)


def test_batch_streams_count_toward_the_stream_limits(
    make_service: Callable[..., Service], auth: Metadata, requests_sample: list[MirrorRequest]
) -> None:
    """Admission wraps every streaming RPC: with one stream per connection, an open
    MirrorStream leaves no room for a MirrorManyStream on the same connection (refused
    RESOURCE_EXHAUSTED naming the setting, counted), and the place is free once it ends."""
    service = make_service(scoring_enabled=False, grpc_max_streams_per_connection=1)
    gate = threading.Event()

    def idle() -> Iterator[bytes]:
        gate.wait(30)
        yield from ()

    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        holder = channel.stream_stream(
            "/understudy.v1.ShadowEvaluation/MirrorStream", request_serializer=lambda b: b
        )(idle(), metadata=auth, timeout=30)
        deadline = time.monotonic() + 30  # a hang guard
        while counted(service, "understudy_grpc_streams_open") < 1:
            assert time.monotonic() < deadline, "the first stream never opened"
            time.sleep(0.01)  # poll interval of a condition wait
        raws = [_envelope(1, encode(with_ids(requests_sample, 1, "l")))]
        call = channel.stream_stream(
            "/understudy.v1.ShadowEvaluation/MirrorManyStream",
            request_serializer=lambda b: b,
            response_deserializer=shadow_pb2.BatchStreamAck.FromString,
        )
        with pytest.raises(grpc.RpcError) as refused:
            list(call(iter(raws), metadata=auth, timeout=30))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "UNDERSTUDY_GRPC_MAX_STREAMS_PER_CONNECTION" in refused.value.details()
        gate.set()
        list(holder)
        while counted(service, "understudy_grpc_streams_open") > 0:
            assert time.monotonic() < deadline, "the first stream was never released"
            time.sleep(0.01)  # poll interval of a condition wait
        acks = [a.ack for a in call(iter(raws), metadata=auth, timeout=30)]
    assert acks[-1].stream_accepted == 1
    assert counted(service, "understudy_grpc_streams_refused_total", reason="connection") == 1


def test_an_empty_batch_is_refused_whole_naming_its_count(
    service: Service, stub: Stub, auth: Metadata, requests_sample: list[MirrorRequest]
) -> None:
    """No requests (or outcomes) is a client bug (a sender with a linger never sends
    one), not an ack of zeros: INVALID_ARGUMENT on the unary calls, a refusal under its
    own sequence on the stream, naming `request_id` (whose offsets state the count), each
    counted as one rejection."""
    empty = batch_to_pb(RequestBatch.from_requests([]))
    for call, msg, noun in (
        (stub.MirrorMany, empty, "request"),
        (stub.ReportOutcomes, batch_pb2.OutcomeBatch(), "outcome"),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            call(msg, metadata=auth)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"`request_id` must hold at least one {noun}, got none" in caught.value.details()
    for kind in ("mirror", "outcome"):
        labels = {"transport": "grpc_batch", "kind": kind, "field": "request_id"}
        assert counted(service, "understudy_ingest_rejections_total", **labels) == 1
    assert _ingest(service, "grpc_batch", "rejected") == 1
    raws = [
        _envelope(1, encode(with_ids(requests_sample, 2, "e"))),
        _envelope(2, empty),
        _envelope(3, encode(with_ids(requests_sample, 2, "f"))),
    ]
    acks = _batch_stream(service, raws, auth)
    refused = [a for a in acks if a.status != ACCEPTED]
    summary = [(a.status, a.sequence, a.accepted, a.rejected, a.whole_batch) for a in refused]
    assert summary == [(REJECTED, 2, 0, 0, True)]
    [only] = refused[0].rejections
    assert (only.index, only.field, only.reason) == (0, "request_id", "invalid_value")
    assert "`request_id` must hold at least one request, got none" in only.message
    last = acks[-1]
    assert (last.sequence, last.stream_accepted, last.stream_rejected) == (3, 4, 0)
    assert _ingest(service, "grpc_batch_stream", "rejected") == 1
    assert journaled(service) == ["e-0", "e-1", "f-0", "f-1"]
