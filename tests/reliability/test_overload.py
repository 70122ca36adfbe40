"""Overload: the scorer stalls while Runtime keeps mirroring; the bounded journal sheds.

Capacity is cut to zero by a policy that blocks until the test lets it go
(not by a slow one): then the journal fills and sheds after the same number
of requests on any machine, busy or idle, and every message is accounted for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

from service.contract import MirrorRequest
from service.policies.base import PolicyDecisions, ScoringBatch
from service.policies.baselines import FirstFit
from service.policies.registry import Registry
from service.server.app import Service
from service.storage import count_requests
from tests.reliability.load import rss_mb, steady_load
from tests.transport.test_decision_log_e2e import wait_until

JOURNAL_BYTES = 200_000
"""~30 requests of the sample's size."""
OFFERED = 300
"""Requests mirrored while the scorer is stalled: ten times what the journal holds."""


class GatedPolicy:
    """First-fit that scores only while `open` is set (the test's stall)."""

    name, version = "gated", "test"

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        assert self.open.wait(600), "never let go"  # a hang bound; the test sets it
        return FirstFit().decide(batch, rng)


@pytest.mark.live
def test_overload_sheds_and_every_message_is_accounted_for(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    gated = GatedPolicy()
    service = make_service(
        policies=Registry(policies={"gated": gated}, predictors={}),
        journal_max_bytes=JOURNAL_BYTES,
        journal_segment_bytes=64_000,
        policy_time_budget_ms=600_000,
        scorer_max_batch=16,
    )
    normal = steady_load(
        service.grpc_port, runtime_token, requests_sample, 20.0, 60.0, "normal", max_sent=40
    )
    rss_normal = rss_mb()
    wait_until(lambda: service.journal.depth_records("scorer") == 0)
    assert normal.shed == 0 and len(normal.accepted) == normal.sent == 40

    gated.open.clear()  # the stall: the scorer's next batch waits, the journal fills
    over = steady_load(
        service.grpc_port,
        runtime_token,
        requests_sample,
        200.0,
        600.0,
        "over",
        invalid_every=20,
        max_sent=OFFERED,
    )
    rss_over = rss_mb()
    depth_peak = service.journal.depth_bytes
    print(
        f"\n[overload] scorer stalled, {over.sent} offered: accepted {len(over.accepted)},"
        f" shed {over.shed}, rejected {over.rejected}; ack p99 {over.p99_ms():.2f} ms"
        f" (normal load {normal.p99_ms():.2f} ms); RSS {rss_over:.0f} MB"
        f" (normal {rss_normal:.0f} MB); journal {depth_peak} B of {JOURNAL_BYTES}"
    )
    assert over.sent == OFFERED
    assert over.shed > 0 and over.rejected > 0
    assert len(over.accepted) + over.shed + over.rejected == over.sent
    assert len(over.accepted) < OFFERED / 2, "the journal's bound, not the scorer, took them"

    value = service.metrics.registry.get_sample_value

    def counted(result: str) -> float:
        labels = {"transport": "grpc", "kind": "mirror", "result": result}
        return value("understudy_ingest_total", labels) or 0.0

    assert counted("accepted") == len(normal.accepted) + len(over.accepted)
    assert counted("shed") == normal.shed + over.shed
    assert counted("rejected") == normal.rejected + over.rejected
    assert service.journal.depth_bytes <= JOURNAL_BYTES
    assert service.engine is not None
    gated.open.set()
    wait_until(lambda: service.journal.depth_records("scorer") == 0)
    assert count_requests(service.engine) == len(normal.accepted) + len(over.accepted)
