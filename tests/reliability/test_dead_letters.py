"""A record the decision log refuses every time is set aside; everything else is logged."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from service.contract import DEFAULT_FEATURES, MirrorRequest
from service.metrics import ServiceMetrics
from service.pipeline.dead_letter import DeadLetterBox
from service.pipeline.journal import IngestJournal, JournalConfig
from service.pipeline.journal_format import RecordKind
from service.pipeline.scorer import ScoredBatch, Scorer, ScorerConfig, SinkResult
from service.pipeline.scorer_metrics import ScorerMetrics
from service.policies.baselines import LeastLoaded
from service.server.decision_log import DecisionLogSink
from service.storage import DecisionLogWriter, count_requests, make_engine
from service.wire.convert import mirror_request_to_pb


class RefusesPoison:
    """The real decision-log sink, except that it refuses any batch holding a poison id.

    Stands in for a data-dependent database error (a constraint the validator
    missed): the real sink cannot be made to fail on one record on demand.
    """

    def __init__(self, inner: DecisionLogSink) -> None:
        self.inner = inner
        self.refusals = 0

    def write(self, batch: ScoredBatch) -> SinkResult:
        if any(r.request.request_id.startswith("poison") for r in batch.requests):
            self.refusals += 1
            raise ValueError("value violates a check constraint")
        return self.inner.write(batch)


def test_poison_records_are_dead_lettered_and_the_rest_is_logged(
    tmp_path: Path, db_url: str, requests_sample: list[MirrorRequest]
) -> None:
    engine = make_engine(db_url)
    journal = IngestJournal(JournalConfig(directory=tmp_path / "journal"))
    metrics = ServiceMetrics(CollectorRegistry())
    box = DeadLetterBox(tmp_path / "dead-letter")
    sink = RefusesPoison(DecisionLogSink(DecisionLogWriter(engine)))
    scorer = Scorer(
        journal,
        lambda: [LeastLoaded()],
        sink,
        ScorerMetrics(metrics),
        DEFAULT_FEATURES,
        ScorerConfig(max_batch=64, retry_initial_s=0.01, poison_attempts=3),
        dead_letters=box,
    )
    payloads = {}
    for i, request in enumerate(requests_sample[:20]):
        msg = mirror_request_to_pb(request)
        msg.request_id = f"poison-{i}" if i in (3, 11) else f"fine-{i}"
        payloads[msg.request_id] = msg.SerializeToString()
        journal.append(RecordKind.MIRROR, payloads[msg.request_id])
    try:
        assert scorer.step() == 20
        assert journal.depth_records("scorer") == 0, "the checkpoint moved past the batch"
        assert count_requests(engine) == 18
        letters = box.letters()
        assert [letter["request_id"] for letter in letters] == ["poison-3", "poison-11"]
        for letter in letters:
            stored = (box.directory / f"{letter['seq']:020d}.pb").read_bytes()
            assert stored == payloads[str(letter["request_id"])], "the raw request is kept"
        value = metrics.registry.get_sample_value
        assert value("understudy_dead_letters_total", {"kind": "mirror"}) == 2
        assert sink.refusals >= 3
    finally:
        journal.close()
        engine.dispose()
