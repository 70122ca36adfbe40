"""Metric updates recorded in the scorer process and replayed here equal updates made here."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from service.contract import DEFAULT_FEATURES, MirrorRequest
from service.metrics import ServiceMetrics
from service.pipeline.metric_relay import MetricRelay, replay
from service.pipeline.quarantine import QuarantineEvent
from service.pipeline.scorer import SinkResult
from service.pipeline.scorer_metrics import ScorerMetrics
from service.pipeline.scoring import score_requests
from service.policies.baselines import FirstFit, LeastLoaded, RandomFeasible


def samples(metrics: ServiceMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")  # creation timestamps differ by construction
    }


def test_replayed_scorer_metrics_equal_direct_ones(requests_sample: list[MirrorRequest]) -> None:
    policies = [LeastLoaded(), FirstFit(), RandomFeasible()]
    _, decisions, runs = score_requests(requests_sample, policies, DEFAULT_FEATURES)
    direct = ServiceMetrics(CollectorRegistry())
    replayed = ServiceMetrics(CollectorRegistry())
    relay = MetricRelay()

    def feed(observer: ScorerMetrics) -> None:
        observer.on_batch(len(requests_sample), runs, decisions)
        observer.on_write(0.012, SinkResult(30, 90, 2, 1, 0, 0, (3.5, 7.0)), None)
        observer.on_write(0.5, None, "connection refused")
        observer.on_dead_letter("mirror")
        observer.on_quarantine(QuarantineEvent("first-fit", "quarantined", 1.0, "boom"))

    feed(ScorerMetrics(direct))
    feed(ScorerMetrics(relay.as_metrics()))
    ops = relay.take()
    assert ops and relay.take() == [], "take hands each update over once"
    replay(ops, replayed)
    want = samples(direct)
    assert want[("understudy_decisions_total", (("policy", "first-fit"), ("status", "ok")))] > 0
    assert samples(replayed) == want


def test_replay_refuses_an_unknown_method() -> None:
    with pytest.raises(ValueError, match="`clear` on `decisions`"):
        replay([("decisions", ("p", "ok"), "clear", 0.0)], ServiceMetrics(CollectorRegistry()))
