"""Ingest hands its decoded request to the scorer through the journal, within bounds.

The hand-off is an in-memory shortcut only: the journaled bytes stay the truth,
a record the journal no longer holds decoded is decoded from its bytes, and
what is handed over must be exactly what decoding the bytes gives.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from service.contract import DEFAULT_FEATURES, MirrorRequest
from service.pipeline.journal import IngestJournal, JournalConfig, RecordKind
from service.pipeline.scorer import decode
from service.wire.convert import mirror_request_from_pb, mirror_request_to_pb
from service.wire.understudy.v1 import contract_pb2, shadow_pb2


def _journal(directory: Path, decoded_records: int = 1024) -> IngestJournal:
    return IngestJournal(JournalConfig(directory=directory, decoded_cache_records=decoded_records))


def _payload(request: MirrorRequest) -> bytes:
    return bytes(mirror_request_to_pb(request).SerializeToString())


def test_reader_receives_the_decoded_object(
    tmp_path: Path, requests_sample: list[MirrorRequest]
) -> None:
    first, second = requests_sample[:2]
    with _journal(tmp_path) as journal:
        journal.append(RecordKind.MIRROR, _payload(first), first)
        journal.append(RecordKind.MIRROR, _payload(second))
        records = journal.read("scorer", 10)
    assert records[0].decoded is first
    assert decode(records[0]) is first
    assert records[1].decoded is None
    decoded = decode(records[1])
    assert isinstance(decoded, MirrorRequest) and decoded.request_id == second.request_id


def test_hand_off_is_bounded_and_released_on_commit(
    tmp_path: Path, requests_sample: list[MirrorRequest]
) -> None:
    requests = requests_sample[:4]
    with _journal(tmp_path, decoded_records=2) as journal:
        for r in requests:
            journal.append(RecordKind.MIRROR, _payload(r), r)
        records = journal.read("scorer", 10)
        assert [rec.decoded is not None for rec in records] == [True, True, False, False]
        journal.commit("scorer", records[0].seq)
        again = journal.read("scorer", 10, after_seq=0)
        assert [rec.decoded is not None for rec in again] == [False, True, False, False]
        journal.commit("scorer", records[1].seq)
        journal.append(RecordKind.MIRROR, _payload(requests[0]), requests[0])
        assert journal.read("scorer", 10)[-1].decoded is requests[0]


def test_a_reopened_journal_has_only_the_bytes(
    tmp_path: Path, requests_sample: list[MirrorRequest]
) -> None:
    request = requests_sample[0]
    with _journal(tmp_path) as journal:
        journal.append(RecordKind.MIRROR, _payload(request), request)
    with _journal(tmp_path) as journal:
        (record,) = journal.read("scorer", 10)
    assert record.decoded is None
    assert _payload(decode(record)) == _payload(request)  # type: ignore[arg-type]


def test_what_the_stream_hands_over_equals_decoding_its_payload(
    requests_sample: list[MirrorRequest],
) -> None:
    """The servicer's object (built from the envelope) and the scorer's (from the bytes) agree."""
    for i, request in enumerate(requests_sample):
        raw = shadow_pb2.MirrorStreamRequest(
            sequence=i + 1, request=mirror_request_to_pb(request)
        ).SerializeToString()
        envelope = shadow_pb2.MirrorStreamRequest.FromString(raw)
        handed = mirror_request_from_pb(envelope.request)
        payload = envelope.request.SerializeToString()
        from_bytes = mirror_request_from_pb(contract_pb2.MirrorRequest.FromString(payload))
        assert _payload(handed) == _payload(from_bytes)
        a = DEFAULT_FEATURES(handed.state, handed.workload, handed.options)
        b = DEFAULT_FEATURES(from_bytes.state, from_bytes.workload, from_bytes.options)
        assert a.tobytes() == b.tobytes()
        assert handed.state.labels == from_bytes.state.labels
        assert np.array_equal(handed.options.node_index, from_bytes.options.node_index)


def test_hand_off_is_bounded_by_payload_bytes(
    tmp_path: Path, requests_sample: list[MirrorRequest]
) -> None:
    payloads = [_payload(r) for r in requests_sample[:3]]
    room = len(payloads[0]) + len(payloads[1])
    config = JournalConfig(directory=tmp_path, decoded_cache_payload_bytes=room)
    with IngestJournal(config) as journal:
        for r, p in zip(requests_sample[:3], payloads, strict=True):
            journal.append(RecordKind.MIRROR, p, r)
        records = journal.read("scorer", 10)
        assert [rec.decoded is not None for rec in records] == [True, True, False]
        journal.commit("scorer", records[1].seq)
        journal.append(RecordKind.MIRROR, payloads[2], requests_sample[2])
        assert journal.read("scorer", 10)[-1].decoded is requests_sample[2]
