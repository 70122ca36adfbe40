"""Quarantine rules on a fake clock, then bad policies in the real service."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest

from service.contract import MirrorRequest
from service.pipeline.quarantine import Quarantine, QuarantineEvent
from service.policies.base import Policy, PolicyDecisions, ScoringBatch
from service.policies.baselines import FirstFit, LeastLoaded
from service.policies.registry import Registry
from service.server.app import Service
from service.storage import count_decisions
from tests.transport.test_decision_log_e2e import mirror_all, wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_k_failures_in_the_window_quarantine_then_retry_releases() -> None:
    clock = Clock()
    q = Quarantine(threshold=3, window_s=10, cooldown_s=30, clock=clock, wall_clock=clock)
    seen: list[QuarantineEvent] = []
    q.subscribe(seen.append)
    q.record("p", "boom")
    clock.now = 11  # the first failure leaves the window
    q.record("p", "boom")
    q.record("p", "boom")
    assert q.is_active("p") and not seen
    q.record("p", "boom")
    assert not q.is_active("p") and [e.event for e in seen] == ["quarantined"]
    assert q.quarantined() == {"p": "boom"}
    clock.now = 41
    assert q.is_active("p"), "retried after the cooldown"
    q.record("p", "still broken")
    assert not q.is_active("p") and seen[-1].event == "retry_failed"
    clock.now = 72
    assert q.is_active("p")
    q.record("p", None)
    assert seen[-1].event == "released" and q.quarantined() == {}
    q.record("p", "boom")
    assert q.is_active("p"), "a single failure after release does not re-quarantine"


class NaNPolicy:
    name, version = "nan-policy", "test"

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        d = FirstFit().decide(batch, rng)
        probabilities = d.probabilities.copy()
        probabilities[:] = np.nan
        return PolicyDecisions(
            scores=d.scores,
            probabilities=probabilities,
            defer_probability=d.defer_probability,
            chosen=d.chosen,
            raw_favourite_infeasible=d.raw_favourite_infeasible,
            status=d.status,
        )


class RaisingPolicy:
    name, version = "raising-policy", "test"

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        raise RuntimeError("model exploded")


BUDGET_MS = 200.0
"""The budget `_run` configures. Wide on purpose: the healthy policies (a few ms) and the
jittery one (1.5x, under the 3x strike) keep hundreds of ms of margin on a loaded machine;
the slow one (10x) is only slower there. The sleeps below are the policies' cost, not
synchronisation."""


class SlowPolicy:
    """Takes ten times the budget the test configures."""

    name, version = "slow-policy", "test"

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        time.sleep(10 * BUDGET_MS / 1e3)
        return FirstFit().decide(batch, rng)


def _run(
    make_service: Callable[..., Service],
    token: str,
    requests: list[MirrorRequest],
    policies: dict[str, Policy],
    tag: str,
    **overrides: object,
) -> tuple[Service, list[str], float]:
    service = make_service(
        **overrides,
        policies=Registry(policies=policies, predictors={}),
        policy_time_budget_ms=BUDGET_MS,
        quarantine_failures=2,
        quarantine_window_s=60.0,
        quarantine_cooldown_s=600.0,
        scorer_max_batch=8,
    )
    started = time.perf_counter()
    ids = []
    for round_ in range(4):  # several batches, so failures accumulate
        ids += mirror_all(service, token, requests[:4], f"{tag}{round_}")
        assert service.engine is not None
        wait_until(lambda: service.journal.depth_records("scorer") == 0)
    return service, ids, time.perf_counter() - started


@pytest.mark.live
def test_bad_policies_are_quarantined_and_the_others_carry_on(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    fresh_db: Callable[[bool], str],
) -> None:
    good: dict[str, Policy] = {"first-fit": FirstFit(), "least-loaded": LeastLoaded()}
    bad: dict[str, Policy] = {
        "nan-policy": NaNPolicy(),
        "raising-policy": RaisingPolicy(),
        "slow-policy": SlowPolicy(),
    }
    service, ids, elapsed = _run(make_service, runtime_token, requests_sample, good | bad, "bad")
    engine = service.engine
    assert engine is not None
    value = service.metrics.registry.get_sample_value
    for name in good:
        assert count_decisions(engine, name) == len(ids), name
        assert count_decisions(engine, name, status="ok") + count_decisions(
            engine, name, status="all_infeasible"
        ) == len(ids)
    for name in bad:
        assert value("understudy_policy_quarantined", {"policy": name}) == 1, name
        assert (
            value(
                "understudy_policy_quarantine_events_total",
                {"policy": name, "event": "quarantined"},
            )
            == 1
        )
        logged = count_decisions(engine, name)
        assert 0 < logged < len(ids), (name, logged)
        assert count_decisions(engine, name, status="ok") == 0
    assert count_decisions(engine, "slow-policy", status="timeout") > 0
    assert count_decisions(engine, "raising-policy", status="error") > 0
    ready = {c.name: c for c in service.readiness.evaluate()}
    assert "quarantined: nan-policy" in ready["policies"].detail
    good_latency = {
        name: (value("understudy_policy_batch_latency_seconds_sum", {"policy": name}) or 0)
        / (value("understudy_policy_batch_latency_seconds_count", {"policy": name}) or 1)
        for name in good
    }
    service.stop()

    baseline, base_ids, base_elapsed = _run(
        make_service, runtime_token, requests_sample, good, "ok", database_url=fresh_db(True)
    )
    base_value = baseline.metrics.registry.get_sample_value
    for name in good:
        assert count_decisions(baseline.engine, name) == len(base_ids)  # type: ignore[arg-type]
        base = (
            base_value("understudy_policy_batch_latency_seconds_sum", {"policy": name}) or 0
        ) / (base_value("understudy_policy_batch_latency_seconds_count", {"policy": name}) or 1)
        print(
            f"\n[quarantine] {name}: {len(ids)} decisions with bad neighbours, mean batch latency "
            f"{good_latency[name] * 1e3:.2f} ms vs {base * 1e3:.2f} ms alone"
        )
    print(f"[quarantine] wall time with bad policies {elapsed:.1f}s vs {base_elapsed:.1f}s without")


class JitteryPolicy:
    """Over its budget by half on every batch: flagged, never quarantined."""

    name, version = "jittery-policy", "test"

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        time.sleep(1.5 * BUDGET_MS / 1e3)
        return FirstFit().decide(batch, rng)


@pytest.mark.live
def test_budget_jitter_is_flagged_but_does_not_quarantine(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    policies: dict[str, Policy] = {"jittery-policy": JitteryPolicy(), "first-fit": FirstFit()}
    service, ids, _ = _run(make_service, runtime_token, requests_sample, policies, "jit")
    engine = service.engine
    assert engine is not None
    value = service.metrics.registry.get_sample_value
    assert count_decisions(engine, "jittery-policy") == len(ids), "never quarantined"
    assert count_decisions(engine, "jittery-policy", status="timeout") > 0, "but flagged"
    assert not value("understudy_policy_quarantined", {"policy": "jittery-policy"})
