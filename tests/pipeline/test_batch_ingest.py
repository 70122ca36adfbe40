"""A batch is journaled as one record of its accepted requests, and scored as those requests.

Real `IngestJournal` on disk, real `Ingest`, metrics, request index and batch
codec (the protobuf a client sends), and for the scoring tests the real scorer
and decision-log writer on the session's embedded PostgreSQL. Each batch is
held to the single-request path it stands for: the refusals name the fields the
single validator names, the digests are `content_sha256` of each request, and
what the log stores for a batch's request replays as that request.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf.message import DecodeError
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from service.contract import DEFAULT_FEATURES, InvalidInput, MirrorRequest, Outcome, RequestLimits
from service.contract.batch import OutcomeColumns, RequestBatch
from service.contract.errors import MalformedMessage
from service.contract.identity import content_sha256
from service.contract.outcome import FailureKind
from service.contract.rejections import RejectionReason
from service.contract.validation import validate_request
from service.metrics import ServiceMetrics
from service.pipeline import batch_record
from service.pipeline.dead_letter import DeadLetterBox
from service.pipeline.ingest import BatchResult, Ingest
from service.pipeline.journal import IngestJournal, JournalConfig
from service.pipeline.journal_format import RecordKind, read_all
from service.pipeline.request_index import RequestIndex, fill_from_journal
from service.pipeline.scorer import ScoredBatch, Scorer, ScorerConfig, SinkResult, logged_items
from service.pipeline.scorer_metrics import ScorerMetrics
from service.policies.baselines import FirstFit, LeastLoaded
from service.policies.registry import Registry
from service.server.app import Service
from service.server.decision_log import DecisionLogSink
from service.storage import (
    DecisionLogWriter,
    count_decisions,
    count_joined_outcomes,
    count_requests,
    decisions_for,
    load_raw_request,
    make_engine,
    rows_from,
)
from service.storage.log import tables as t
from service.wire.batch_codec import (
    DecodedBatch,
    DecodedOutcomes,
    batch_from_pb,
    batch_to_pb,
    outcomes_from_pb,
    outcomes_to_pb,
)
from service.wire.convert import mirror_request_from_pb, mirror_request_to_pb
from service.wire.understudy.v1 import batch_pb2, contract_pb2, shadow_pb2_grpc
from tests.transport.test_decision_log_e2e import wait_until

LIMITS = RequestLimits()
POLICIES = (FirstFit(), LeastLoaded())


def _wire(requests: Sequence[MirrorRequest]) -> bytes:
    return batch_to_pb(RequestBatch.from_requests(list(requests))).SerializeToString()


def _decoder(raw: bytes):  # type: ignore[no-untyped-def]
    """What a protobuf transport hands `mirror_batch`: decode the bytes it received."""

    def decode() -> tuple[DecodedBatch, bytes]:
        try:
            msg = batch_pb2.MirrorBatch.FromString(raw)
        except DecodeError:
            raise MalformedMessage("", "is not a MirrorBatch") from None
        batch = batch_from_pb(msg, LIMITS)
        n = batch.n_requests
        return DecodedBatch(batch, np.arange(n, dtype=np.int64), (), n), raw

    return decode


def _send(ingest: Ingest, requests: Sequence[MirrorRequest]) -> BatchResult:
    return ingest.mirror_batch("grpc", _decoder(_wire(requests)))


def _value(metrics: ServiceMetrics, name: str, labels: dict[str, str]) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def _named(requests: Sequence[MirrorRequest], prefix: str) -> list[MirrorRequest]:
    return [dataclasses.replace(r, request_id=f"{prefix}-{i}") for i, r in enumerate(requests)]


def _bad_workload(r: MirrorRequest) -> MirrorRequest:
    return dataclasses.replace(r, workload=dataclasses.replace(r.workload, accelerators=-1))


def _bad_state(r: MirrorRequest) -> MirrorRequest:
    cpu = r.state.cpu_free.copy()
    cpu[5] = -4.0
    cpu.flags.writeable = False
    return dataclasses.replace(r, state=dataclasses.replace(r.state, cpu_free=cpu))


def _single_refusal(r: MirrorRequest) -> tuple[str, str]:
    with pytest.raises(InvalidInput) as refused:
        validate_request(r, LIMITS)
    return refused.value.field, refused.value.problem


def _scorer(journal: IngestJournal, engine, metrics: ServiceMetrics, **config) -> Scorer:  # type: ignore[no-untyped-def]
    return Scorer(
        journal,
        lambda: list(POLICIES),
        DecisionLogSink(DecisionLogWriter(engine)),
        ScorerMetrics(metrics),
        DEFAULT_FEATURES,
        ScorerConfig(retry_initial_s=0.01, **config),
    )


def test_bad_requests_are_refused_by_index_and_the_rest_is_one_record_scored_and_logged(
    tmp_path: Path, db_url: str, requests_sample: list[MirrorRequest]
) -> None:
    sent = _named(requests_sample[:12], "b")
    bad = {2: _bad_workload(sent[2]), 7: _bad_state(sent[7])}
    sent = [bad.get(i, r) for i, r in enumerate(sent)]
    good = [r for i, r in enumerate(sent) if i not in bad]
    engine = make_engine(db_url)
    metrics = ServiceMetrics(CollectorRegistry())
    try:
        with IngestJournal(JournalConfig(tmp_path / "journal")) as journal:
            ingest = Ingest(journal, metrics, LIMITS)
            result = _send(ingest, sent)
            assert (result.accepted, result.shed, result.rejected) == (10, 0, 2)
            assert result.journal_seq == 1
            assert [r.index for r in result.rejections] == [2, 7]
            for refusal in result.rejections:  # as the single-request path refuses it
                assert (refusal.field, refusal.message) == _single_refusal(sent[refusal.index])
                assert refusal.reason is RejectionReason.INVALID_VALUE
            assert [r.field for r in result.rejections] == [
                "workload.accelerators",
                "state.cpu_free[5]",
            ]

            records = read_all(tmp_path / "journal")
            assert [(r.seq, r.kind) for r in records] == [(1, RecordKind.MIRROR_BATCH)]
            held = batch_record.unpack(records[0].payload, RecordKind.MIRROR_BATCH)
            assert held.rows.tolist() == [i for i in range(12) if i not in bad]
            assert held.body == _wire(sent), "the batch bytes are journaled as received"
            assert [held.digest(i) for i in range(10)] == [content_sha256(r) for r in good]

            received = {"transport": "grpc", "kind": "mirror"}
            assert (
                _value(metrics, "understudy_ingest_total", received | {"result": "accepted"}) == 10
            )
            assert (
                _value(metrics, "understudy_ingest_total", received | {"result": "rejected"}) == 2
            )
            for field in ("workload.accelerators", "state.cpu_free[]"):
                assert (
                    _value(
                        metrics, "understudy_ingest_rejections_total", received | {"field": field}
                    )
                    == 1
                )
            assert _value(metrics, "understudy_ingest_batch_requests_count", received) == 1
            assert _value(metrics, "understudy_ingest_batch_requests_sum", received) == 12
            assert (
                _value(metrics, "understudy_ack_latency_seconds_count", {"transport": "grpc"}) == 1
            )

            scorer = _scorer(journal, engine, metrics)
            assert scorer.step() == 1
        assert count_requests(engine) == 10
        assert count_decisions(engine) == 10 * len(POLICIES)
        for r in good:  # every policy decided it; what the log keeps replays as the request
            assert {d.policy_name for d in decisions_for(engine, r.request_id)} == {
                str(p.name) for p in POLICIES
            }
            replayed = mirror_request_from_pb(
                contract_pb2.MirrorRequest.FromString(load_raw_request(engine, r.request_id))
            )
            assert content_sha256(replayed) == content_sha256(r)
        with engine.connect() as conn:
            ids = t.request_identities.c
            stored = {
                rid: bytes(d) for rid, d in conn.execute(select(ids.request_id, ids.content_sha256))
            }
            seqs = set(conn.execute(select(t.requests.c.journal_seq)).scalars())
            bits = list(conn.execute(select(t.requests.c.feasibility_bits)).scalars())
        assert stored == {r.request_id: content_sha256(r) for r in good}
        assert seqs == {1}
        assert all(b is not None for b in bits), "each request keeps its own feasibility bits"
        for r in (sent[2], sent[7]):
            assert not decisions_for(engine, r.request_id)
    finally:
        engine.dispose()


def test_a_shared_snapshot_at_fault_refuses_every_request_on_it(
    tmp_path: Path, requests_sample: list[MirrorRequest]
) -> None:
    broken = _bad_state(requests_sample[0]).state
    sent = _named(requests_sample[:6], "s")
    sent = [dataclasses.replace(r, state=broken) if i in (1, 4) else r for i, r in enumerate(sent)]
    assert RequestBatch.from_requests(sent).states.n_states == 5, "1 and 4 share one snapshot"
    with IngestJournal(JournalConfig(tmp_path)) as journal:
        result = _send(Ingest(journal, ServiceMetrics(CollectorRegistry()), LIMITS), sent)
    assert (result.accepted, result.rejected) == (4, 2)
    assert [(r.index, r.field, r.message) for r in result.rejections] == [
        (i, *_single_refusal(sent[i])) for i in (1, 4)
    ]


def test_duplicates_and_conflicts_inside_a_batch_and_across_batches(
    tmp_path: Path, requests_sample: list[MirrorRequest]
) -> None:
    a, b, c = _named(requests_sample[:3], "d")
    a_changed = dataclasses.replace(a, request_time=a.request_time + 60.0)
    b_changed = dataclasses.replace(b, request_time=b.request_time + 60.0)
    metrics = ServiceMetrics(CollectorRegistry())
    with IngestJournal(JournalConfig(tmp_path)) as journal:
        ingest = Ingest(journal, metrics, LIMITS)
        first = _send(ingest, [a, b, a, a_changed])  # the first copy of an id wins
        assert (first.accepted, first.rejected, first.duplicates) == (3, 1, 1)
        assert [(r.index, r.field, r.reason) for r in first.rejections] == [
            (3, "request_id", RejectionReason.CONFLICTING_REQUEST)
        ]
        second = _send(ingest, [b, c, b_changed])
        assert (second.accepted, second.rejected, second.duplicates) == (2, 1, 1)
        assert [r.index for r in second.rejections] == [2]
        again = _send(ingest, [a, b, c])  # nothing new: no record at all
        assert (again.accepted, again.duplicates, again.journal_seq) == (3, 3, None)
        assert journal.head_seq == 2
    rows = [batch_record.unpack(r.payload).rows.tolist() for r in read_all(tmp_path)]
    assert rows == [[0, 1], [1]]
    received = {"transport": "grpc", "kind": "mirror"}
    assert _value(metrics, "understudy_ingest_total", received | {"result": "accepted"}) == 8
    assert _value(metrics, "understudy_ingest_total", received | {"result": "rejected"}) == 2
    assert _value(metrics, "understudy_ingest_duplicates_total", {"transport": "grpc"}) == 5
    assert _value(metrics, "understudy_request_conflicts_total", {"stage": "ingest"}) == 2
    assert (
        _value(metrics, "understudy_ingest_rejections_total", received | {"field": "request_id"})
        == 2
    )


def test_a_full_journal_sheds_every_request_of_the_batch_and_forgets_them(
    tmp_path: Path, requests_sample: list[MirrorRequest]
) -> None:
    small = _named(requests_sample[:2], "small")
    big = _named(requests_sample[2:10], "big")
    big_sent = [*big, big[0], _bad_workload(dataclasses.replace(big[1], request_id="big-bad"))]
    bound = len(_wire(small)) + len(_wire(big_sent))  # room for one of them, not both
    metrics = ServiceMetrics(CollectorRegistry())
    with IngestJournal(JournalConfig(tmp_path, max_bytes=bound)) as journal:
        ingest = Ingest(journal, metrics, LIMITS)
        assert _send(ingest, small).accepted == 2
        shed = _send(ingest, big_sent)
        assert (shed.accepted, shed.shed, shed.rejected, shed.duplicates) == (0, 9, 1, 0)
        assert shed.sent == len(big_sent) and shed.journal_seq is None
        assert len(ingest.index) == 2, "no id of a shed batch is remembered"
        received = {"transport": "grpc", "kind": "mirror"}
        assert _value(metrics, "understudy_ingest_total", received | {"result": "shed"}) == 9
        assert (
            _value(metrics, "understudy_ingest_sheds_total", received | {"reason": "journal_full"})
            == 9
        )
        journal.commit("scorer", 1)  # the scorer catches up: room again
        resent = _send(ingest, big_sent)
        assert (resent.accepted, resent.shed, resent.rejected, resent.duplicates) == (9, 0, 1, 1)
        assert resent.journal_seq == 2
        total = sum(
            _value(metrics, "understudy_ingest_total", received | {"result": r})
            for r in ("accepted", "shed", "rejected")
        )
        assert total == len(small) + 2 * len(big_sent)


def test_a_closed_journal_sheds_the_batch_as_a_journal_error(
    tmp_path: Path, requests_sample: list[MirrorRequest]
) -> None:
    metrics = ServiceMetrics(CollectorRegistry())
    journal = IngestJournal(JournalConfig(tmp_path))
    index = RequestIndex()
    ingest = Ingest(journal, metrics, LIMITS, index)
    journal.close()
    result = _send(ingest, _named(requests_sample[:3], "c"))
    assert (result.shed, result.shed_reason) == (3, "journal_error")
    assert len(index) == 0


def test_a_batch_refused_whole_is_counted_and_raised(tmp_path: Path) -> None:
    metrics = ServiceMetrics(CollectorRegistry())
    with IngestJournal(JournalConfig(tmp_path)) as journal:
        ingest = Ingest(journal, metrics, LIMITS)
        with pytest.raises(InvalidInput):
            ingest.mirror_batch("grpc", _decoder(b"\x0a\x05junk"))
        assert journal.head_seq == 0
    received = {"transport": "grpc", "kind": "mirror"}
    assert _value(metrics, "understudy_ingest_total", received | {"result": "rejected"}) == 1


def test_two_streams_racing_on_the_same_ids_journal_each_once(
    tmp_path: Path, requests_sample: list[MirrorRequest]
) -> None:
    requests = _named(requests_sample[:8], "race")
    wires = [_wire(requests), _wire(list(reversed(requests)))]
    results: list[BatchResult] = []
    with IngestJournal(JournalConfig(tmp_path)) as journal:
        ingest = Ingest(journal, ServiceMetrics(CollectorRegistry()), LIMITS)
        start = threading.Barrier(len(wires) * 4)

        def send(raw: bytes) -> None:
            start.wait()
            results.append(ingest.mirror_batch("grpc", _decoder(raw)))

        threads = [threading.Thread(target=send, args=(w,)) for w in wires * 4]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert all(r.accepted == 8 and r.rejected == 0 for r in results)
    journaled = [
        batch_record.request_ids_of(batch_record.unpack(r.payload)) for r in read_all(tmp_path)
    ]
    assert sorted(rid for ids in journaled for rid in ids) == sorted(r.request_id for r in requests)
    assert sum(r.duplicates for r in results) == 7 * 8


def test_after_a_restart_the_index_is_filled_from_batch_records(
    tmp_path: Path, requests_sample: list[MirrorRequest]
) -> None:
    kept = _named(requests_sample[:6], "fill")
    with IngestJournal(JournalConfig(tmp_path)) as journal:
        ingest = Ingest(journal, ServiceMetrics(CollectorRegistry()), LIMITS)
        _send(ingest, [*kept[:3], _bad_workload(kept[3])])
        _send(ingest, kept[4:])
    with IngestJournal(JournalConfig(tmp_path)) as journal:
        ingest = Ingest(journal, ServiceMetrics(CollectorRegistry()), LIMITS)
        assert fill_from_journal(ingest.index, journal) == 5  # the refused one was never journaled
        again = _send(ingest, kept)
        assert (again.accepted, again.duplicates, again.journal_seq) == (6, 5, 3)
        changed = dataclasses.replace(kept[0], request_time=kept[0].request_time + 1.0)
        assert [r.field for r in _send(ingest, [changed]).rejections] == ["request_id"]


def test_a_restart_before_the_checkpoint_replays_the_batch_without_doubling_the_log(
    tmp_path: Path, db_url: str, requests_sample: list[MirrorRequest]
) -> None:
    sent = _named(requests_sample[:9], "k")
    engine = make_engine(db_url)
    try:
        with IngestJournal(JournalConfig(tmp_path / "journal")) as journal:
            metrics = ServiceMetrics(CollectorRegistry())
            _send(Ingest(journal, metrics, LIMITS), sent)
            scorer = _scorer(journal, engine, metrics)
            records = journal.read("scorer", 10)
            assert scorer.batches.score_and_write(records)  # logged, the checkpoint not moved
        assert count_requests(engine) == 9
        with IngestJournal(JournalConfig(tmp_path / "journal")) as journal:  # as after SIGKILL
            assert journal.depth_records("scorer") == 1
            scorer = _scorer(journal, engine, ServiceMetrics(CollectorRegistry()))
            assert scorer.step() == 1
            assert journal.depth_records("scorer") == 0
        assert count_requests(engine) == 9
        assert count_decisions(engine) == 9 * len(POLICIES)
    finally:
        engine.dispose()


def test_a_scoring_step_takes_whole_records_up_to_max_batch_requests(
    tmp_path: Path, db_url: str, requests_sample: list[MirrorRequest]
) -> None:
    engine = make_engine(db_url)
    try:
        with IngestJournal(JournalConfig(tmp_path)) as journal:
            metrics = ServiceMetrics(CollectorRegistry())
            ingest = Ingest(journal, metrics, LIMITS)
            for k in range(3):
                _send(ingest, _named(requests_sample[k * 5 : k * 5 + 5], f"m{k}"))
            scorer = _scorer(journal, engine, metrics, max_batch=8)
            assert scorer.step() == 1  # 5 requests; with the next record 10 > 8
            assert count_requests(engine) == 5
            scorer = _scorer(journal, engine, metrics, max_batch=2)
            assert scorer.step() == 1  # a record over the bound is still taken whole
            assert count_requests(engine) == 10
    finally:
        engine.dispose()


def _outcomes(requests: Sequence[MirrorRequest]) -> list[Outcome]:
    return [
        Outcome(
            request_id=r.request_id,
            observed_at=r.request_time + 30.0,
            queue_delay_s=1.5,
            throughput=2.0,
            completion_time_s=None,
            slo_met=True,
            failure=FailureKind.NONE,
        )
        for r in requests
    ]


def test_an_outcome_batch_is_one_record_and_joins_its_requests(
    tmp_path: Path, db_url: str, requests_sample: list[MirrorRequest]
) -> None:
    requests = _named(requests_sample[:5], "o")
    outcomes = _outcomes(requests)
    outcomes[3] = dataclasses.replace(outcomes[3], queue_delay_s=-1.0)
    raw = outcomes_to_pb(OutcomeColumns.from_outcomes(outcomes)).SerializeToString()

    def decode() -> tuple[DecodedOutcomes, bytes]:
        cols = outcomes_from_pb(batch_pb2.OutcomeBatch.FromString(raw), LIMITS)
        n = cols.n_outcomes
        return DecodedOutcomes(cols, np.arange(n, dtype=np.int64), (), n), raw

    engine = make_engine(db_url)
    metrics = ServiceMetrics(CollectorRegistry())
    try:
        with IngestJournal(JournalConfig(tmp_path)) as journal:
            ingest = Ingest(journal, metrics, LIMITS)
            _send(ingest, requests)
            result = ingest.outcome_batch("http", decode)
            assert (result.accepted, result.rejected, result.journal_seq) == (4, 1, 2)
            assert [(r.index, r.field) for r in result.rejections] == [(3, "queue_delay_s")]
            kinds = [r.kind for r in read_all(tmp_path)]
            assert kinds == [RecordKind.MIRROR_BATCH, RecordKind.OUTCOME_BATCH]
            items = logged_items(journal.read("scorer", 2)[1])
            assert [(o.row, o.outcome) for o in items] == [  # type: ignore[union-attr]
                (i, outcomes[i]) for i in (0, 1, 2, 4)
            ]
            assert _scorer(journal, engine, metrics).step() == 2
        assert count_joined_outcomes(engine) == 4
        received = {"transport": "http", "kind": "outcome"}
        assert _value(metrics, "understudy_ingest_total", received | {"result": "accepted"}) == 4
        assert _value(metrics, "understudy_ingest_total", received | {"result": "rejected"}) == 1
    finally:
        engine.dispose()


class RefusesPoison:
    """The real sink, except that it refuses any batch holding a poison id (as
    tests/reliability/test_dead_letters.py: a data-dependent database error)."""

    def __init__(self, inner: DecisionLogSink) -> None:
        self.inner = inner

    def write(self, batch: ScoredBatch) -> SinkResult:
        if any(r.request.request_id.startswith("poison") for r in batch.requests):
            raise ValueError("value violates a check constraint")
        return self.inner.write(batch)


def test_a_request_of_a_batch_is_dead_lettered_alone_as_its_single_request(
    tmp_path: Path, db_url: str, requests_sample: list[MirrorRequest]
) -> None:
    sent = _named(requests_sample[:6], "fine")
    sent[4] = dataclasses.replace(sent[4], request_id="poison-4")
    engine = make_engine(db_url)
    box = DeadLetterBox(tmp_path / "dead-letter")
    try:
        with IngestJournal(JournalConfig(tmp_path / "journal")) as journal:
            metrics = ServiceMetrics(CollectorRegistry())
            _send(Ingest(journal, metrics, LIMITS), sent)
            scorer = Scorer(
                journal,
                lambda: [LeastLoaded()],
                RefusesPoison(DecisionLogSink(DecisionLogWriter(engine))),
                ScorerMetrics(metrics),
                DEFAULT_FEATURES,
                ScorerConfig(retry_initial_s=0.01, poison_attempts=2),
                dead_letters=box,
            )
            assert scorer.step() == 1
        assert count_requests(engine) == 5
        [letter] = box.letters()
        assert (letter["seq"], letter["row"], letter["request_id"]) == (1, 4, "poison-4")
        stored = (box.directory / f"{1:020d}-{4:06d}.pb").read_bytes()
        request = mirror_request_from_pb(contract_pb2.MirrorRequest.FromString(stored))
        assert content_sha256(request) == content_sha256(sent[4])
    finally:
        engine.dispose()


def _single(r: MirrorRequest) -> Callable[[], tuple[MirrorRequest, bytes]]:
    payload = mirror_request_to_pb(r).SerializeToString()
    return lambda: (r, payload)


def test_records_of_the_single_request_form_still_score(
    tmp_path: Path, db_url: str, requests_sample: list[MirrorRequest]
) -> None:
    """A journal written before batches (or by the single-request RPCs) mixes with batches."""
    singles = _named(requests_sample[:3], "one")
    batch = _named(requests_sample[3:6], "many")
    engine = make_engine(db_url)
    try:
        with IngestJournal(JournalConfig(tmp_path)) as journal:
            metrics = ServiceMetrics(CollectorRegistry())
            ingest = Ingest(journal, metrics, LIMITS)
            for r in singles:
                ingest.mirror("grpc", _single(r), canonical=True)
            _send(ingest, batch)
            assert [r.kind for r in read_all(tmp_path)] == [RecordKind.MIRROR] * 3 + [
                RecordKind.MIRROR_BATCH
            ]
            assert _scorer(journal, engine, metrics).step() == 4
        assert count_requests(engine) == 6
    finally:
        engine.dispose()


def test_a_damaged_batch_header_is_refused_not_read_as_other_rows() -> None:
    digests = np.arange(3 * 32, dtype=np.uint8).reshape(3, 32)
    payload = batch_record.pack(RecordKind.MIRROR_BATCH, np.array([0, 2, 5]), 6, b"body", digests)
    held = batch_record.unpack(payload, RecordKind.MIRROR_BATCH)
    assert (held.rows.tolist(), held.n_batch, held.body) == ([0, 2, 5], 6, b"body")
    assert batch_record.row_count(payload) == 3
    for offset in (0, 4, 5, 8, 12, 16, 20, batch_record.HEADER_SIZE, batch_record.HEADER_SIZE + 13):
        damaged = bytearray(payload)
        damaged[offset] ^= 0x01
        with pytest.raises(batch_record.BatchRecordCorrupt):
            batch_record.unpack(bytes(damaged))
    with pytest.raises(batch_record.BatchRecordCorrupt):
        batch_record.unpack(payload[:-1])
    with pytest.raises(batch_record.BatchRecordCorrupt):
        batch_record.unpack(payload, RecordKind.OUTCOME_BATCH)
    with pytest.raises(ValueError):
        batch_record.pack(RecordKind.MIRROR_BATCH, np.array([2, 1]), 6, b"", digests[:2])
    outcome = batch_record.pack(RecordKind.OUTCOME_BATCH, np.array([1]), 2, b"o")
    assert batch_record.unpack(outcome).digests is None


@pytest.mark.live  # a real service and its scorer process
def test_a_batch_mirrored_over_grpc_is_scored_in_the_scorer_process(
    make_service: Callable[..., Service], runtime_token: str, requests_sample: list[MirrorRequest]
) -> None:
    """The child decodes batch records from the pipe's bytes (no decoded handoff)."""
    baselines = Registry(
        policies={"least-loaded": LeastLoaded(), "first-fit": FirstFit()}, predictors={}
    )
    service = make_service(scorer_mode="process", policies=baselines)
    sent = _named(requests_sample[:10], "proc")
    sent[6] = _bad_workload(sent[6])
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = shadow_pb2_grpc.ShadowEvaluationStub(channel)  # type: ignore[no-untyped-call]
        ack = stub.MirrorMany(
            batch_to_pb(RequestBatch.from_requests(sent)),
            metadata=(("authorization", f"Bearer {runtime_token}"),),
        )
    assert (ack.accepted, ack.rejected) == (9, 1)
    assert [(r.index, r.field) for r in ack.rejections] == [(6, "workload.accelerators")]
    engine = service.engine
    assert engine is not None
    wait_until(lambda: count_decisions(engine) == 9 * 2)
    assert count_requests(engine) == 9
    assert [r.kind for r in read_all(service.settings.resolved_journal_dir)] == [
        RecordKind.MIRROR_BATCH
    ]


def test_the_scorer_reuses_the_batch_ingest_decoded_and_reads_the_same_requests_without_it(
    tmp_path: Path, requests_sample: list[MirrorRequest]
) -> None:
    sent = _named(requests_sample[:5], "h")
    sent[1] = _bad_workload(sent[1])
    with IngestJournal(JournalConfig(tmp_path)) as journal:
        _send(Ingest(journal, ServiceMetrics(CollectorRegistry()), LIMITS), sent)
        [record] = journal.read("scorer", 1)
        assert isinstance(record.decoded, RequestBatch), "handed over in memory"
        handed = logged_items(record)
    [from_disk] = read_all(tmp_path)
    assert from_disk.decoded is None
    parsed = logged_items(from_disk)
    for a, b in zip(handed, parsed, strict=True):
        assert isinstance(a, type(b))
    assert [(r.row, r.payload, r.digest) for r in handed] == [  # type: ignore[union-attr]
        (r.row, r.payload, r.digest)  # type: ignore[union-attr]
        for r in parsed
    ]
    assert [r.row for r in parsed] == [0, 2, 3, 4]


def _logged(db: str, journal_dir: Path, send: Callable[[Ingest], None]) -> dict[str, object]:
    """Ingest with `send`, score everything, and read back what the log holds per request."""
    engine = make_engine(db)
    try:
        with IngestJournal(JournalConfig(journal_dir)) as journal:
            metrics = ServiceMetrics(CollectorRegistry())
            send(Ingest(journal, metrics, LIMITS))
            scorer = _scorer(journal, engine, metrics)
            while scorer.step():
                pass
        with engine.connect() as conn:
            r = t.requests.c
            rows = conn.execute(select(r.request_id, r.feasibility_bits, r.n_options)).all()
        out: dict[str, object] = {}
        for request_id, bits, n_options in rows:
            decisions = [
                (d.policy_name, d.status, d.chosen_option, d.chosen_probability, d.scores.tobytes())
                for d in decisions_for(engine, request_id)
            ]
            out[request_id] = (
                bytes(bits),
                n_options,
                decisions,
                load_raw_request(engine, request_id),
            )
        return out
    finally:
        engine.dispose()


def test_a_batch_logs_exactly_what_its_requests_sent_one_by_one_log(
    tmp_path: Path,
    db_url: str,
    fresh_db: Callable[[bool], str],
    requests_sample: list[MirrorRequest],
) -> None:
    """Invariant 1 through the scorer and the writer: the same decisions (policy, status,
    option, probability, scores), feasibility bits and stored payload bytes."""
    requests = _named(requests_sample[:16], "same")
    shared = requests[3].state  # two requests of one scheduling cycle share a snapshot
    requests[4] = dataclasses.replace(requests[4], state=shared)

    def one_by_one(ingest: Ingest) -> None:
        for r in requests:
            ingest.mirror("grpc", _single(r), canonical=True)

    def batched(ingest: Ingest) -> None:
        assert _send(ingest, requests[:9]).accepted == 9
        assert _send(ingest, requests[9:]).accepted == 7

    singles = _logged(db_url, tmp_path / "singles", one_by_one)
    batches = _logged(fresh_db(True), tmp_path / "batches", batched)
    assert len(singles) == len(requests)
    assert batches == singles


def test_the_writer_stores_the_digest_it_is_given(requests_sample: list[MirrorRequest]) -> None:
    r = requests_sample[0]
    row, _ = rows_from(r, _single(r)()[1], 1, 0.0, "v", "h", content_digest=b"d" * 32)
    assert row.content_sha256 == b"d" * 32
    row, _ = rows_from(r, _single(r)()[1], 1, 0.0, "v", "h")
    assert row.content_sha256 == content_sha256(r)


def test_repeats_inside_a_batch_are_caught_even_with_the_index_off() -> None:
    index = RequestIndex(capacity=0)
    digests = b"a" * 32 + b"b" * 32 + b"a" * 32 + b"a" * 32
    seen: list[list[int]] = []
    claim = index.claim_batch(
        ["x", "y", "x", "z"], digests, lambda new: seen.append(new.tolist()), lambda _: True
    )
    assert seen == [[0, 1, 3]]
    assert (claim.new.tolist(), claim.repeats.tolist(), claim.conflicts.tolist()) == (
        [0, 1, 3],
        [2],
        [],
    )
    again = index.claim_batch(["x", "x"], b"a" * 32 + b"c" * 32, lambda new: None, lambda _: True)
    assert (again.new.tolist(), again.conflicts.tolist()) == ([0], [1])
    assert len(index) == 0
