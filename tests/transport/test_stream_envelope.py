"""Stream messages journal the request they carry, whatever the envelope's layout.

The stream reader journals the request's bytes sliced out of the envelope when
the envelope is laid out as every serializer writes it (sequence, then the
request, nothing after) and re-serialises otherwise. Either way the journaled
payload must decode to exactly the request the envelope holds, and the object
handed to the scorer must be what decoding that payload gives. Also here: the
cumulative-ack state (`StreamProgress`) wakes its ack generator for every
change it must announce, though it no longer notifies on each message.
"""

from __future__ import annotations

import gc
import os
import threading

import grpc
import numpy as np

from service.contract import MirrorRequest
from service.pipeline.journal_format import RecordKind
from service.server.app import Service
from service.transport.grpc.streams import StreamProgress
from service.wire.convert import mirror_request_from_pb, mirror_request_to_pb
from service.wire.understudy.v1 import contract_pb2, shadow_pb2

Proto = contract_pb2.MirrorRequest


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, body: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(body)) + body


def _sequence(value: int) -> bytes:
    return _varint(1 << 3) + _varint(value)


def _layouts(requests: list[Proto]) -> list[tuple[str, bytes, Proto]]:
    """(name, envelope bytes, the request the envelope holds) in several valid layouts.

    One request per layout: a request_id sent again with the same content is a
    duplicate (acked, not journaled again; docs/ingest.md, "Identity").
    """
    r = requests[:5]
    head, rest = Proto(), Proto()  # the fourth request split in two parts that merge back
    head.state.CopyFrom(r[3].state)
    rest.CopyFrom(r[3])
    rest.ClearField("state")
    unknown = _field(9, b"future")  # a field this build does not know
    return [
        ("canonical", _sequence(1) + _field(2, r[0].SerializeToString()), r[0]),
        ("canonical, long sequence", _sequence(2**40) + _field(2, r[1].SerializeToString()), r[1]),
        ("request first", _field(2, r[2].SerializeToString()) + _sequence(2**40 + 1), r[2]),
        (
            "request in two parts",
            _sequence(2**40 + 2)
            + _field(2, head.SerializeToString())
            + _field(2, rest.SerializeToString()),
            r[3],
        ),
        (
            "unknown field after",
            _sequence(2**40 + 3) + _field(2, r[4].SerializeToString()) + unknown,
            r[4],
        ),
    ]


def test_every_envelope_layout_journals_the_request_it_holds(
    service: Service,
    grpc_channel: grpc.Channel,
    auth: tuple[tuple[str, str], ...],
    requests_sample: list[MirrorRequest],
) -> None:
    layouts = _layouts([mirror_request_to_pb(r) for r in requests_sample[:5]])
    call = grpc_channel.stream_stream(
        "/understudy.v1.ShadowEvaluation/MirrorStream",
        request_serializer=lambda b: b,
        response_deserializer=shadow_pb2.StreamAck.FromString,
    )
    acks = list(call(iter([raw for _, raw, _ in layouts]), metadata=auth, timeout=20))
    assert max(a.accepted for a in acks) == len(layouts)
    records = [r for r in service.journal.read("scorer", 100) if r.kind == RecordKind.MIRROR]
    assert len(records) == len(layouts)
    for (name, _, expected), record in zip(layouts, records, strict=True):
        journaled = Proto.FromString(record.payload)
        assert journaled == expected, name
        decoded = record.decoded
        assert isinstance(decoded, MirrorRequest), name
        again = mirror_request_from_pb(journaled)
        assert decoded.request_id == again.request_id, name
        assert decoded.state.node_ids == again.state.node_ids, name
        assert decoded.state.labels == again.state.labels, name
        assert np.array_equal(decoded.state.cpu_free, again.state.cpu_free), name
        assert np.array_equal(decoded.options.node_index, again.options.node_index), name
        assert decoded.workload == again.workload, name


def test_canonical_envelopes_journal_the_bytes_as_sent(
    service: Service,
    grpc_channel: grpc.Channel,
    auth: tuple[tuple[str, str], ...],
    requests_sample: list[MirrorRequest],
) -> None:
    """Like the unary RPC: the journal holds the client's bytes, unknown fields included."""
    msg = mirror_request_to_pb(requests_sample[0])
    body = msg.SerializeToString() + _field(9, b"future")
    call = grpc_channel.stream_stream(
        "/understudy.v1.ShadowEvaluation/MirrorStream",
        request_serializer=lambda b: b,
        response_deserializer=shadow_pb2.StreamAck.FromString,
    )
    acks = list(call(iter([_sequence(1) + _field(2, body)]), metadata=auth, timeout=20))
    assert acks[-1].accepted == 1
    (record,) = service.journal.read("scorer", 10)
    assert record.payload == body


def _drain(progress: StreamProgress, out: list[shadow_pb2.StreamAck]) -> None:
    out.extend(progress.acks(poll_s=60.0))  # a lost wake-up would stall, not poll


def test_progress_announces_everything_while_the_generator_waits() -> None:
    """Records arrive from another thread, one at a time, while the generator waits:
    every rejection and shed is announced individually and the last cumulative ack
    covers the last sequence, with counts that add up."""
    rng = np.random.default_rng(14)
    statuses = rng.choice(
        [shadow_pb2.ACK_STATUS_ACCEPTED] * 8
        + [shadow_pb2.ACK_STATUS_SHED, shadow_pb2.ACK_STATUS_REJECTED],
        size=3000,
    )
    progress = StreamProgress()
    acks: list[shadow_pb2.StreamAck] = []
    reader = threading.Thread(target=_drain, args=(progress, acks), daemon=True)
    reader.start()
    for i, status in enumerate(statuses, start=1):
        progress.record(int(status), i)
        if i % 97 == 0:  # let the generator catch up and wait again now and then
            threading.Event().wait(0.001)
    progress.finish()
    reader.join(120)
    assert not reader.is_alive(), "the ack generator was never woken"
    individual = {a.sequence: a.status for a in acks if a.status != shadow_pb2.ACK_STATUS_ACCEPTED}
    expected = {i: int(s) for i, s in enumerate(statuses, 1) if s != shadow_pb2.ACK_STATUS_ACCEPTED}
    assert individual == expected
    last = max(
        (a for a in acks if a.status == shadow_pb2.ACK_STATUS_ACCEPTED), key=lambda a: a.sequence
    )
    assert last.sequence == len(statuses)
    assert last.accepted == int(np.sum(statuses == shadow_pb2.ACK_STATUS_ACCEPTED))
    assert last.shed == int(np.sum(statuses == shadow_pb2.ACK_STATUS_SHED))
    assert last.rejected == int(np.sum(statuses == shadow_pb2.ACK_STATUS_REJECTED))
    cumulative = [a.sequence for a in acks if a.status == shadow_pb2.ACK_STATUS_ACCEPTED]
    assert cumulative == sorted(set(cumulative))


def test_progress_wakes_a_waiting_generator_for_a_single_record() -> None:
    """One record after the generator went to sleep is acked without waiting out the
    idle timeout (60 s here; the join below gives up long before that)."""
    progress = StreamProgress()
    acks: list[shadow_pb2.StreamAck] = []
    reader = threading.Thread(target=_drain, args=(progress, acks), daemon=True)
    reader.start()
    for sequence in (1, 2, 3):
        seen = len(acks)
        threading.Event().wait(0.05)  # the generator is now inside wait()
        progress.record(shadow_pb2.ACK_STATUS_ACCEPTED, sequence)
        for _ in range(2000):
            if len(acks) > seen:
                break
            threading.Event().wait(0.005)
        assert [a.sequence for a in acks[seen:]] == [sequence]
    progress.finish()
    reader.join(30)
    assert not reader.is_alive()


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_progress_releases_its_wake_up_pipe_however_the_stream_ends() -> None:
    """Each stream's wake-up pipe is closed when its ack generator ends: finished,
    closed by gRPC mid-stream (a cancelled RPC), or dropped unstarted after a record;
    records arriving after that are still counted and harm nothing."""
    before = _open_descriptors()
    for round_ in range(200):
        progress = StreamProgress()
        acks = progress.acks(poll_s=0.01)
        progress.record(shadow_pb2.ACK_STATUS_ACCEPTED, 1)
        if round_ % 3 == 0:  # runs to the end
            progress.finish()
            assert [a.sequence for a in acks] == [1]
        elif round_ % 3 == 1:  # cancelled after the first ack
            assert next(acks).sequence == 1
            acks.close()
        else:  # the generator is collected after one ack, never finished
            next(acks)
            del acks
        progress.record(shadow_pb2.ACK_STATUS_REJECTED, 2)
        progress.finish()
        assert progress.accepted == 1 and progress.rejected == 1
    gc.collect()
    assert _open_descriptors() <= before
