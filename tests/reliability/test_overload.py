"""Overload: offered load >= 3x capacity, made by cutting capacity with a slow policy."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from service.app import Service
from service.contract import MirrorRequest
from service.policies.base import PolicyDecisions, ScoringBatch
from service.policies.baselines import FirstFit
from service.policies.registry import Registry
from service.storage import count_requests
from tests.reliability.load import rss_mb, steady_load
from tests.transport.test_decision_log_e2e import wait_until

SECONDS_PER_REQUEST = 0.02  # scorer capacity: ~50 requests/s


class ThrottledPolicy:
    """First-fit that costs 20 ms per request: the scorer's capacity becomes ~50/s."""

    name, version = "throttled", "test"

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        time.sleep(SECONDS_PER_REQUEST * batch.n_requests)
        return FirstFit().decide(batch, rng)


def test_overload_sheds_and_every_message_is_accounted_for(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    service = make_service(
        policies=Registry(policies={"throttled": ThrottledPolicy()}, predictors={}),
        journal_max_bytes=200_000,  # ~30 requests of the sample's size
        journal_segment_bytes=64_000,
        policy_time_budget_ms=10_000,
        scorer_max_batch=16,
    )
    capacity = 1 / SECONDS_PER_REQUEST
    normal = steady_load(
        service.grpc_port, runtime_token, requests_sample, capacity / 3, 3.0, "normal"
    )
    rss_normal = rss_mb()
    wait_until(lambda: service.journal.depth_records("scorer") == 0)
    offered = capacity * 4
    over = steady_load(
        service.grpc_port, runtime_token, requests_sample, offered, 5.0, "over", invalid_every=20
    )
    rss_over = rss_mb()
    depth_peak = service.journal.depth_bytes
    print(
        f"\n[overload] capacity ~{capacity:.0f}/s, offered {offered:.0f}/s: sent {over.sent}, "
        f"accepted {len(over.accepted)}, shed {over.shed}, rejected {over.rejected}; "
        f"ack p99 {over.p99_ms():.2f} ms (normal load {normal.p99_ms():.2f} ms); "
        f"RSS {rss_over:.0f} MB (normal {rss_normal:.0f} MB); journal {depth_peak} B of 200000"
    )
    assert over.sent >= 3 * capacity * 5.0 * 0.8, "the generator could not offer 3x capacity"
    assert over.shed > 0 and over.rejected > 0
    assert len(over.accepted) + over.shed + over.rejected == over.sent

    value = service.metrics.registry.get_sample_value

    def counted(result: str) -> float:
        labels = {"transport": "grpc", "kind": "mirror", "result": result}
        return value("understudy_ingest_total", labels) or 0.0

    assert counted("accepted") == len(normal.accepted) + len(over.accepted)
    assert counted("shed") == normal.shed + over.shed
    assert counted("rejected") == normal.rejected + over.rejected
    assert service.journal.depth_bytes <= 200_000
    assert service.engine is not None
    wait_until(lambda: service.journal.depth_records("scorer") == 0, timeout=120)
    assert count_requests(service.engine) == len(normal.accepted) + len(over.accepted)
