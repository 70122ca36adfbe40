"""Process mode: the real service scores in a child process, and loses nothing when it dies.

Real gRPC on loopback, the embedded PostgreSQL, the committed policies; the
child is started with ``spawn`` by the service itself and killed by its pid.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from sqlalchemy import text

from service.auth import token_digest
from service.contract import MirrorRequest
from service.pipeline.scorer import ScorerLoop
from service.pipeline.scorer_process import ProcessScorer
from service.policies.base import PolicyDecisions, ScoringBatch
from service.policies.baselines import FirstFit, LeastLoaded
from service.policies.registry import Registry
from service.server.app import Service, build_service
from service.settings import Settings
from service.storage import count_decisions, start_embedded, stop_embedded, upgrade
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import shadow_pb2, shadow_pb2_grpc
from tests.reliability.load import LoadResult, steady_load
from tests.transport.test_decision_log_e2e import wait_until

pytestmark = pytest.mark.live  # waits on a real service: run under load by make test-busy

WINDOW = 250  # the smallest drift window the settings allow
BASELINES = Registry(
    policies={"least-loaded": LeastLoaded(), "first-fit": FirstFit()}, predictors={}
)


def handler_of(service: Service) -> ProcessScorer:
    """The service's scorer process handle."""
    assert isinstance(service.scorer, ScorerLoop)
    handler = service.scorer.handler
    assert isinstance(handler, ProcessScorer)
    return handler


def stream(service: Service, token: str, requests: list[MirrorRequest], tag: str) -> list[str]:
    """Mirror `requests` over one gRPC client stream; the ids acked."""
    auth = (("authorization", f"Bearer {token}"),)
    envelopes, ids = [], []
    for i, r in enumerate(requests):
        msg = mirror_request_to_pb(r)
        msg.request_id = f"{tag}-{i}"
        ids.append(msg.request_id)
        envelopes.append(shadow_pb2.MirrorStreamRequest(sequence=i + 1, request=msg))
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = shadow_pb2_grpc.ShadowEvaluationStub(channel)  # type: ignore[no-untyped-call]
        acks = list(stub.MirrorStream(iter(envelopes), metadata=auth))
    assert acks[-1].accepted == len(requests)
    return ids


def logged_ids(service: Service) -> list[str]:
    assert service.engine is not None
    with service.engine.connect() as conn:
        return list(conn.execute(text("SELECT request_id FROM requests")).scalars())


def metric(service: Service, name: str, labels: dict[str, str] | None = None) -> float | None:
    return service.metrics.registry.get_sample_value(name, labels or {})


def test_process_mode_logs_every_decision_with_metrics_and_drift(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    service = make_service(scorer_mode="process", drift_window_requests=WINDOW)
    handler = handler_of(service)
    assert service.policies is not None
    policies = sorted(service.policies.policies)
    ids = stream(service, runtime_token, requests_sample * 9, "pm")  # 270: one drift window
    wait_until(lambda: service.journal.depth_records("scorer") == 0)
    assert service.engine is not None
    assert sorted(logged_ids(service)) == sorted(ids)
    for name in policies:
        assert count_decisions(service.engine, name) == len(ids), name
    assert handler.child_pid is not None and handler.child_pid != os.getpid()
    # the child's observers reached this process's metrics
    counted = sum(
        metric(service, "understudy_decisions_total", {"policy": p, "status": s}) or 0.0
        for p in policies
        for s in ("ok", "timeout", "error", "all_infeasible", "infeasible_choice")
    )
    assert counted == len(ids) * len(policies)
    assert metric(service, "understudy_db_write_batches_total", {"result": "ok"})
    assert metric(service, "understudy_db_rows_inserted_total", {"table": "requests"}) == len(ids)
    drifted = service.policies.training_summaries
    assert drifted, "the committed ONNX policies carry training summaries"
    for name in drifted:  # the drift monitor runs in the child; its windows count here
        closed = sum(
            metric(service, "understudy_drift_windows_total", {"policy": name, "flagged": f}) or 0.0
            for f in ("true", "false")
        )
        assert closed == len(ids) // WINDOW == 1, name
    ready = httpx.get(f"http://127.0.0.1:{service.http_port}/readyz", timeout=10)
    assert ready.status_code == 200
    checks = {c["name"]: c for c in ready.json()["checks"]}
    assert checks["scorer_process"]["ok"] and "ready" in checks["scorer_process"]["detail"]


@pytest.mark.slow
def test_a_killed_scorer_process_is_restarted_and_nothing_is_lost_or_doubled(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    service = make_service(scorer_mode="process", policies=BASELINES)
    handler = handler_of(service)
    results: list[LoadResult] = []
    load = threading.Thread(
        target=lambda: results.append(
            steady_load(service.grpc_port, runtime_token, requests_sample, 150.0, 8.0, "kill")
        )
    )
    load.start()
    assert service.engine is not None
    engine = service.engine
    wait_until(lambda: count_decisions(engine) > 0)
    first = handler.child_pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: handler.restarts >= 1 and handler.child_pid not in (None, first))
    load.join(60)
    result = results[0]
    assert result.shed == 0 and result.rejected == 0 and len(result.accepted) == result.sent
    wait_until(lambda: service.journal.depth_records("scorer") == 0)
    ids = logged_ids(service)
    assert len(ids) == len(set(ids)), "no request logged twice"
    assert sorted(ids) == sorted(result.accepted), "every acked request logged"
    with engine.connect() as conn:
        pairs = conn.execute(
            text("SELECT count(*), count(DISTINCT (request_id, policy_name)) FROM decisions")
        ).one()
    assert pairs[0] == pairs[1] == len(result.accepted) * len(BASELINES.policies)
    assert not Path(f"/proc/{first}").exists(), "the killed child was reaped"


class Raises:
    """A policy that fails every batch (module level, so it pickles to the scorer process)."""

    name, version = "raises", "test"

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        raise RuntimeError("broken on purpose")


def test_quarantine_in_the_scorer_process_shows_in_readiness_and_metrics(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    policies = Registry(policies={"least-loaded": LeastLoaded(), "raises": Raises()}, predictors={})
    service = make_service(scorer_mode="process", policies=policies, quarantine_failures=2)
    handler = handler_of(service)
    for i in range(3):  # separate batches: each one fails `raises` once
        stream(service, runtime_token, requests_sample[:5], f"q{i}")
        wait_until(lambda: service.journal.depth_records("scorer") == 0)
    assert set(handler.quarantine.quarantined()) == {"raises"}
    assert metric(service, "understudy_policy_quarantined", {"policy": "raises"}) == 1.0
    ready = httpx.get(f"http://127.0.0.1:{service.http_port}/readyz", timeout=10).json()
    detail = {c["name"]: c["detail"] for c in ready["checks"]}["policies"]
    assert "quarantined: raises (RuntimeError: broken on purpose)" in detail
    assert service.engine is not None
    assert count_decisions(service.engine, "least-loaded") == 15, "the other policy carried on"


def test_a_scorer_process_that_dies_while_idle_is_restarted_without_traffic(
    make_service: Callable[..., Service],
) -> None:
    service = make_service(scorer_mode="process", policies=BASELINES)
    handler = handler_of(service)
    first = handler.child_pid
    assert first is not None and handler.health()[0]
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: handler.restarts == 1 and handler.child_pid not in (None, first))
    wait_until(lambda: " ready;" in handler.health()[1])
    ready = httpx.get(f"http://127.0.0.1:{service.http_port}/readyz", timeout=10)
    assert ready.status_code == 200, ready.text
    assert service.journal.head_seq == 0, "nothing was mirrored: the restart needed no batch"
    restarts = service.metrics.registry.get_sample_value("understudy_scorer_process_restarts_total")
    assert restarts == 1.0  # on-call sees it on /metrics, not only in the readiness detail


def test_stop_drains_into_the_log_and_leaves_no_scorer_process(
    tmp_path: Path, db_url: str, runtime_token: str, requests_sample: list[MirrorRequest]
) -> None:
    settings = Settings(
        database_url=db_url,
        data_dir=tmp_path / "data",
        grpc_port=0,
        http_port=0,
        auth_tokens={token_digest(runtime_token): "runtime"},
        journal_fsync="never",
        scorer_mode="process",
        evaluator_enabled=False,
    )
    service = build_service(settings, policies=BASELINES)
    service.start()
    service.wait_started()
    handler = handler_of(service)
    engine = service.engine
    assert engine is not None
    stopped = False
    try:
        assert handler.health()[0] and " ready;" in handler.health()[1], "start() waited for it"
        pid = handler.child_pid
        assert pid is not None
        ids = stream(service, runtime_token, requests_sample * 4, "drain")
        started = time.monotonic()
        service.stop(grace=0.5, drain_timeout_s=60)
        stopped = True
        print(f"\n[stop] drained {len(ids)} requests in {time.monotonic() - started:.2f}s")
        with engine.connect() as conn:
            logged = list(conn.execute(text("SELECT request_id FROM requests")).scalars())
        assert sorted(logged) == sorted(ids), "stop() drained the journal into the log"
        assert not Path(f"/proc/{pid}").exists(), "the scorer process exited and was reaped"
        assert handler.child_pid is None
    finally:
        if not stopped:
            service.stop(grace=0.5)
        engine.dispose()


@pytest.mark.slow
def test_a_database_outage_is_reported_while_the_scorer_process_retries(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    pg_dir: Path,
) -> None:
    server = start_embedded(pg_dir, stop_at_exit=False)
    try:
        upgrade(server.url())
        service = make_service(database_url=server.url(), scorer_mode="process", policies=BASELINES)
        handler = handler_of(service)
        before = stream(service, runtime_token, requests_sample, "up")
        wait_until(lambda: service.journal.depth_records("scorer") == 0)
        assert stop_embedded(pg_dir)
        during = stream(service, runtime_token, requests_sample, "down")  # acks go on
        wait_until(lambda: not handler.sink_healthy)
        ready = httpx.get(f"http://127.0.0.1:{service.http_port}/readyz", timeout=10)
        assert ready.status_code == 503
        failing = {c["name"] for c in ready.json()["checks"] if not c["ok"]}
        assert "decision_log" in failing, failing
        assert metric(service, "understudy_db_write_batches_total", {"result": "error"})
        assert service.journal.depth_records("scorer") == len(during), "held in the journal"
        start_embedded(pg_dir, stop_at_exit=False)
        wait_until(lambda: service.journal.depth_records("scorer") == 0)
        assert handler.sink_healthy and handler.restarts == 0
        assert sorted(logged_ids(service)) == sorted(before + during)
    finally:
        stop_embedded(pg_dir)
