"""The walking skeleton end to end: mirror -> journal -> scorer -> PostgreSQL.

Real servers on loopback, the real embedded PostgreSQL, the committed ONNX
policies and the baselines. Replays recompute logged decisions from the stored
raw request with the same code.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc
import httpx
import numpy as np
import pytest

from service.cli.replay import replay_decision
from service.contract import MirrorRequest
from service.policies.base import Policy, PolicyDecisions, ScoringBatch
from service.policies.baselines import FirstFit, LeastLoaded
from service.policies.registry import Registry
from service.server.app import Service
from service.storage import (
    count_decisions,
    count_requests,
    policy_summaries,
)
from service.transport.http.convert import mirror_to_json
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import shadow_pb2, shadow_pb2_grpc

pytestmark = pytest.mark.live  # waits on a real service: run under load by make test-busy


def wait_until(condition: Callable[[], bool], timeout: float = 120.0) -> None:
    """Poll `condition` until true; `timeout` is a hang guard, never a speed requirement."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition still not met after {timeout:.0f} s (hang guard)")
        time.sleep(0.05)  # poll interval of a condition wait


def mirror_all(service: Service, token: str, requests: list[MirrorRequest], tag: str) -> list[str]:
    """Mirror each request over unary, stream and HTTP; return the accepted ids."""
    auth = (("authorization", f"Bearer {token}"),)
    ids: list[str] = []
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = shadow_pb2_grpc.ShadowEvaluationStub(channel)  # type: ignore[no-untyped-call]
        for i, r in enumerate(requests):
            msg = mirror_request_to_pb(r)
            msg.request_id = f"{tag}-u{i}"
            assert stub.Mirror(msg, metadata=auth).status == shadow_pb2.ACK_STATUS_ACCEPTED
            ids.append(msg.request_id)
        envelopes = []
        for i, r in enumerate(requests):
            msg = mirror_request_to_pb(r)
            msg.request_id = f"{tag}-s{i}"
            envelopes.append(shadow_pb2.MirrorStreamRequest(sequence=i + 1, request=msg))
        last = list(stub.MirrorStream(iter(envelopes), metadata=auth))[-1]
        assert last.accepted == len(requests)
        ids += [e.request.request_id for e in envelopes]
    with httpx.Client(
        base_url=f"http://127.0.0.1:{service.http_port}",
        headers={"authorization": f"Bearer {token}"},
    ) as http:
        for i, r in enumerate(requests):
            body = mirror_to_json(r).replace(r.request_id.encode(), f"{tag}-h{i}".encode())
            assert http.post("/v1/mirror", content=body).json()["status"] == "accepted"
            ids.append(f"{tag}-h{i}")
    return ids


def test_every_request_is_logged_once_with_every_policys_decision(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    service = make_service()
    assert service.engine is not None and service.policies is not None
    engine, policies = service.engine, service.policies.policies
    n_policies = len(policies)
    assert {"gavel-scorer", "throughput-greedy", "production-mirror"} <= set(policies)
    ids = mirror_all(service, runtime_token, requests_sample[:8], "e2e")
    wait_until(lambda: count_decisions(engine) == len(ids) * n_policies)
    assert count_requests(engine) == len(ids)

    value = service.metrics.registry.get_sample_value
    for name in policies:
        logged = count_decisions(engine, name)
        assert logged == len(ids), name
        counted = sum(
            value("understudy_decisions_total", {"policy": name, "status": s}) or 0.0
            for s in ("ok", "error", "timeout", "all_infeasible", "infeasible_choice")
        )
        assert counted == logged, name
        for status in ("ok", "error", "all_infeasible"):
            assert (
                value("understudy_decisions_total", {"policy": name, "status": status}) or 0
            ) == (count_decisions(engine, name, status=status)), (name, status)

    summaries = {s.policy: s for s in policy_summaries(engine)}
    assert set(summaries) == set(policies)
    for name, summary in summaries.items():
        assert summary.decisions == count_decisions(engine, name)
        by_status = summary.ok + summary.errors + summary.timeouts + summary.all_infeasible
        assert by_status + summary.infeasible_choices == len(ids)
        flagged = value("understudy_raw_favourite_infeasible_total", {"policy": name}) or 0.0
        assert summary.infeasible_favourites == flagged, name
    mirror = summaries["production-mirror"]
    assert mirror.compared > 0 and mirror.agreed == mirror.compared

    for request_id in ids[::5]:
        for policy in policies.values():
            result = replay_decision(engine, request_id, policy)
            assert result.matches, (request_id, policy.name, result)


class BlockingPolicy:
    """First-fit that blocks in `decide` until the test releases it."""

    name = "blocking"
    version = "test-1"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self._inner = FirstFit()

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        self.entered.set()
        assert self.release.wait(60), "the test never released the policy"
        return self._inner.decide(batch, rng)


def test_acks_never_wait_for_scoring(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    blocking = BlockingPolicy()
    policies: dict[str, Policy] = {"blocking": blocking, "least-loaded": LeastLoaded()}
    service = make_service(policies=Registry(policies=policies, predictors={}))
    assert service.engine is not None
    try:
        ids = mirror_all(service, runtime_token, requests_sample[:10], "blk")
        assert blocking.entered.wait(10)
        assert count_decisions(service.engine) == 0
        assert count_requests(service.engine) == 0
        assert service.journal.depth_records("scorer") == len(ids)
    finally:
        blocking.release.set()
    wait_until(lambda: count_decisions(service.engine) == len(ids) * 2)  # type: ignore[arg-type]
    assert count_requests(service.engine) == len(ids)


def test_outcomes_join_and_metrics_agree_with_the_log(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    from service.client import MirrorClient
    from service.storage import count_dangling_outcomes, count_joined_outcomes
    from service.wire.understudy.v1 import contract_pb2

    service = make_service(
        policies=Registry(policies={"least-loaded": LeastLoaded()}, predictors={})
    )
    engine = service.engine
    assert engine is not None
    client = MirrorClient(f"127.0.0.1:{service.grpc_port}", runtime_token)
    for r in requests_sample[:5]:
        client.mirror(mirror_request_to_pb(r))
    for k, r in enumerate([*requests_sample[:5], requests_sample[5]]):
        outcome = contract_pb2.Outcome(
            request_id=r.request_id if k < 5 else "never-mirrored",
            observed_at=r.request_time + 600.0 * (k + 1),
            completion_time_s=100.0,
            failure=contract_pb2.FAILURE_KIND_NONE,
        )
        client.report_outcome(outcome)
    assert client.flush(30)
    stats = client.close()
    assert stats.outcomes.accepted == 6 and stats.mirrors.accepted == 5
    wait_until(lambda: service.journal.depth_records("scorer") == 0)
    value = service.metrics.registry.get_sample_value

    def outcomes(state: str) -> float:
        return value("understudy_outcomes_total", {"state": state}) or 0.0

    joined = outcomes("joined_on_arrival") + outcomes("joined_from_parked")
    waiting = outcomes("parked") - outcomes("joined_from_parked")
    assert count_joined_outcomes(engine) == 5 == joined
    assert count_dangling_outcomes(engine) == 1 == waiting
    assert value("understudy_outcome_delay_seconds_count") == 5
    assert value("understudy_outcome_delay_seconds_sum") == pytest.approx(600.0 * 15)
