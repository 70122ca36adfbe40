"""Ingest knows recent request ids: a re-send is acked once journaled, a clash is refused.

Real `IngestJournal` on disk, real `Ingest` and metrics; the digest is the one
the writer stores (`service.contract.identity.content_sha256`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from service.contract import MirrorRequest, RequestLimits
from service.contract.batch import RequestBatch
from service.contract.batch.identity import request_encodings
from service.contract.errors import ConflictingRequest
from service.contract.identity import content_sha256
from service.metrics import ServiceMetrics
from service.pipeline.ingest import AckStatus, Ingest
from service.pipeline.journal import IngestJournal, JournalConfig
from service.pipeline.request_index import RequestIndex, Seen, fill_from_journal
from service.transport.http.convert import mirror_to_json
from service.transport.http.decode import mirror_from_json
from service.wire.convert import mirror_request_from_pb, mirror_request_to_pb


def _ingest(journal: IngestJournal) -> Ingest:
    return Ingest(journal, ServiceMetrics(CollectorRegistry()), RequestLimits())


def _send(ingest: Ingest, request: MirrorRequest) -> tuple[AckStatus, int | None]:
    payload = mirror_request_to_pb(request).SerializeToString()
    result = ingest.mirror("grpc", lambda: (request, payload), canonical=True)
    return result.status, result.journal_seq


def _later(request: MirrorRequest) -> MirrorRequest:
    return dataclasses.replace(request, request_time=request.request_time + 60.0)


def _counted(metrics: ServiceMetrics, name: str, labels: dict[str, str]) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_resend_is_acked_without_a_second_record_and_a_clash_is_refused(
    tmp_path: Path, requests_sample: list[MirrorRequest]
) -> None:
    r = requests_sample[0]
    with IngestJournal(JournalConfig(tmp_path)) as journal:
        metrics = ServiceMetrics(CollectorRegistry())
        ingest = Ingest(journal, metrics, RequestLimits())
        assert _send(ingest, r) == (AckStatus.ACCEPTED, 1)
        assert _send(ingest, r) == (AckStatus.ACCEPTED, None)  # a duplicate: not journaled
        with pytest.raises(ConflictingRequest) as refused:
            _send(ingest, _later(r))
        assert refused.value.field == "request_id"
        assert refused.value.request_id == r.request_id
        assert str(refused.value).startswith("`request_id` ")
        assert journal.head_seq == 1
        assert _counted(metrics, "understudy_request_conflicts_total", {"stage": "ingest"}) == 1
        assert _counted(metrics, "understudy_ingest_duplicates_total", {"transport": "grpc"}) == 1
        received = {"transport": "grpc", "kind": "mirror"}
        assert _counted(metrics, "understudy_ingest_total", received | {"result": "accepted"}) == 2
        assert _counted(metrics, "understudy_ingest_total", received | {"result": "rejected"}) == 1


def test_after_a_restart_the_index_is_filled_from_the_journal(
    tmp_path: Path, requests_sample: list[MirrorRequest]
) -> None:
    kept = requests_sample[:5]
    with IngestJournal(JournalConfig(tmp_path)) as journal:
        ingest = _ingest(journal)
        for r in kept:
            _send(ingest, r)
    with IngestJournal(JournalConfig(tmp_path)) as journal:
        ingest = _ingest(journal)
        assert fill_from_journal(ingest.index, journal) == len(kept)
        assert _send(ingest, kept[2]) == (AckStatus.ACCEPTED, None)
        with pytest.raises(ConflictingRequest):
            _send(ingest, _later(kept[3]))
        ingest.index.clear()  # what the writer must then catch
        assert _send(ingest, _later(kept[3])) == (AckStatus.ACCEPTED, len(kept) + 1)


def test_a_shed_request_is_not_remembered(
    tmp_path: Path, requests_sample: list[MirrorRequest]
) -> None:
    r = requests_sample[1]
    size = len(mirror_request_to_pb(r).SerializeToString())
    with IngestJournal(JournalConfig(tmp_path, max_bytes=size // 2)) as journal:
        ingest = _ingest(journal)
        assert _send(ingest, r) == (AckStatus.SHED, None)
        assert len(ingest.index) == 0  # the re-send must be journaled, not called a duplicate


def test_the_index_forgets_the_oldest_first() -> None:
    index = RequestIndex(capacity=2)
    for name in ("a", "b", "c"):
        assert index.claim(name, b"x", lambda: 1, lambda _: True).seen is Seen.NEW
    assert index.claim("a", b"x", lambda: 1, lambda _: True).seen is Seen.NEW  # forgotten
    assert index.claim("c", b"x", lambda: 1, lambda _: True).seen is Seen.DUPLICATE
    assert index.claim("c", b"y", lambda: 1, lambda _: True).seen is Seen.CONFLICT
    assert len(index) == 2


def test_one_digest_for_every_encoding_of_one_request(requests_sample: list[MirrorRequest]) -> None:
    """JSON, protobuf, version 1: the same request. Any content change: another one."""
    r = requests_sample[2]
    digest = content_sha256(r)
    from_pb = mirror_request_from_pb(mirror_request_to_pb(r))
    from_json, _ = mirror_from_json(mirror_to_json(r))
    assert content_sha256(from_pb) == digest
    assert content_sha256(from_json) == digest
    assert content_sha256(dataclasses.replace(r, schema_version=1)) == digest
    encoded, again = (request_encodings(RequestBatch.from_requests([x]))[0] for x in (r, from_json))
    assert encoded.tobytes() == again.tobytes()  # deterministic, not just equal hashes
    changed = [
        _later(r),
        dataclasses.replace(r, workload=dataclasses.replace(r.workload, tenant="other")),
        dataclasses.replace(r, quota_remaining=3.0),
        dataclasses.replace(r, state=requests_sample[3].state),
    ]
    assert len({digest, *(content_sha256(c) for c in changed)}) == 1 + len(changed)


def test_an_index_of_size_zero_leaves_every_check_to_the_writer(
    tmp_path: Path, requests_sample: list[MirrorRequest]
) -> None:
    """``UNDERSTUDY_REQUEST_INDEX_SIZE=0``: re-sends and clashes are journaled as sent."""
    r = requests_sample[4]
    with IngestJournal(JournalConfig(tmp_path)) as journal:
        ingest = Ingest(
            journal, ServiceMetrics(CollectorRegistry()), RequestLimits(), RequestIndex(0)
        )
        sent = [_send(ingest, r), _send(ingest, r), _send(ingest, _later(r))]
        assert sent == [(AckStatus.ACCEPTED, 1), (AckStatus.ACCEPTED, 2), (AckStatus.ACCEPTED, 3)]
