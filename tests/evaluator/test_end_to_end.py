"""End to end: a harmful candidate under its protocol is stopped by the real service.

The real service (gRPC + HTTP on loopback, journal, scorer, the committed
ONNX policies, PostgreSQL) with the evaluator wired by `wire_evaluator`. A
simulated Runtime (the simulator's production emulator on the ``train``
scenario) mirrors requests and reports outcomes through the real client. The
candidate is `SlowestThroughput` (tests/evaluator/harmful.py: the learned
throughput predictor turned against its purpose). The protocol is started
over HTTP by its owner. Then:

- the evaluator stops it on ``reward-harm``; the API's event, the metrics
  and the stored evaluation agree on the criterion's value and bound;
- the evidence snapshot of the stop is stored (protocol hash, timeline, plot);
- the candidate's decisions stop while the other policies go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from service.app import Service
from service.auth import token_digest
from service.contract import MirrorRequest
from service.demo import simulated_runtime
from service.evaluator_wiring import wire_evaluator
from service.pipeline.candidate_gate import CandidateGate
from service.pipeline.evaluator import Evaluator, EvaluatorConfig
from service.policies.registry import load_registry
from service.settings import Settings
from service.storage import count_decisions
from service.storage.evaluation_store import EvaluationStore
from tests.evaluator.conftest import protocol_doc
from tests.evaluator.harmful import NAME, VERSION, SlowestThroughput, gated_registry
from tests.live_traffic import send_events

REPO = Path(__file__).resolve().parents[2]
PROTOCOL = "slowest-throughput-shadow"
DOC = protocol_doc(
    id=PROTOCOL,
    title="Slowest-throughput placement vs production, shadow",
    hypothesis="Placing on the predicted-slowest option meets fewer SLOs (it must be stopped).",
    candidate={"policy": NAME, "version": VERSION},
    cost={"signal_weights": {"capacity": 1.0}, "failure_weights": {"oom": 5.0}},
    guardrails=[
        {"metric": "reward", "margin": 0.05},
        {"metric": "cost", "margin": 0.05},
        {"metric": "infeasible_favourite_rate", "margin": 0.01},
    ],
    stop=[
        {"name": "reward-harm", "metric": "reward", "worse_than_baseline_by": 0.0},
        {"name": "error-spike", "metric": "policy_error_rate", "worse_than": 0.05},
    ],
    data_quality=[{"metric": "missing_propensity_rate", "worse_than": 0.5}],
    minimum_samples=300,
)
ADMIN_TOKEN, REVIEWER_TOKEN = "alice-admin-token", "r-tok"


def _drained(service: Service, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while service.journal.depth_records("scorer") > 0:
        assert time.monotonic() < deadline, "the scorer did not drain the journal"
        time.sleep(0.1)


def _latest(service: Service) -> str:
    assert service.engine is not None
    rows = EvaluationStore(service.engine).latest(PROTOCOL, 1)
    return "not stopped; latest evaluations:\n" + "\n".join(
        str(s.evaluation.summary()) for s in rows
    )


@pytest.fixture()
def wired(
    make_service: Callable[..., Service], runtime_token: str
) -> Iterator[tuple[Service, Evaluator]]:
    store: list[EvaluationStore] = []
    gate = CandidateGate(lambda: store[0].halted_candidates() if store else set(), refresh_s=0.5)
    loaded = load_registry(REPO / "policies")
    harmful = SlowestThroughput(loaded.predictors["gavel-throughput"])
    # Once the composition root wires its own evaluator, this test still wires its own
    # (faster ticks), so it turns the built-in one off.
    own = {"evaluator_enabled": False} if "evaluator_enabled" in Settings.model_fields else {}
    service = make_service(
        policies=gated_registry(loaded, harmful, gate),
        **own,
        auth_tokens={
            token_digest(runtime_token): "runtime",
            token_digest(ADMIN_TOKEN): "admin:alice",
            token_digest(REVIEWER_TOKEN): "reviewer:rita",
        },
    )
    assert service.engine is not None
    store.append(EvaluationStore(service.engine))
    config = EvaluatorConfig(interval_s=0.5, lease_ttl_s=10.0, overlap_s=5.0)
    evaluator = wire_evaluator(service, config, gate=gate)
    evaluator.start()
    yield service, evaluator
    evaluator.stop()


def test_a_harmful_candidate_is_stopped_and_stops_being_scored(
    wired: tuple[Service, Evaluator], runtime_token: str
) -> None:
    service, _ = wired
    assert service.engine is not None
    base = f"http://127.0.0.1:{service.http_port}"
    started = httpx.post(
        f"{base}/v1/protocols/{PROTOCOL}/versions/1/start",
        json={"reason": "harm check", "document": DOC},
        headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=10,
    )
    assert started.status_code == 200, started.text

    events = simulated_runtime(episodes=12, seed=0)
    send_events(service, runtime_token, events)
    reviewer = {"authorization": f"Bearer {REVIEWER_TOKEN}"}
    deadline = time.monotonic() + 60
    while True:
        status = httpx.get(f"{base}/v1/protocols/{PROTOCOL}/versions/1", headers=reviewer)
        assert status.status_code == 200, status.text
        if status.json()["record"]["state"] != "running":
            break
        assert time.monotonic() < deadline, _latest(service)
        time.sleep(0.5)

    # API: the stop event names the criterion, with value, bound and threshold.
    body = status.json()
    assert body["record"]["state"] == "stopped"
    stop = body["events"][-1]
    assert (stop["action"], stop["criterion"], stop["actor"]) == (
        "stop",
        "reward-harm",
        "understudy-evaluator",
    )
    judged = stop["evidence"]["criterion"]
    assert judged["status"] == "fired" and judged["bound"] < judged["threshold"] == 0.0
    assert judged["value"] < 0 and judged["n"] >= 300
    print(
        f"\n[evaluator] e2e: stopped `{NAME}` on reward-harm after {judged['n']} joined rounds:"
        f" DR difference vs production {judged['value']:.3f}, bound {judged['bound']:.3f}"
        f" < threshold 0 (alpha {judged['alpha']})"
    )

    # Metrics show the same criterion.
    labels = {"experiment": f"{PROTOCOL}@1", "criterion": "reward-harm"}
    sample = service.metrics.registry.get_sample_value
    assert sample("understudy_experiment_criterion_value", labels) == pytest.approx(judged["value"])
    assert sample("understudy_experiment_criterion_bound", labels) == pytest.approx(judged["bound"])
    assert sample("understudy_experiment_criterion_status", {**labels, "status": "fired"}) == 1
    assert (
        sample(
            "understudy_experiment_transitions_total",
            {"experiment": f"{PROTOCOL}@1", "action": "stop", "criterion": "reward-harm"},
        )
        == 1
    )

    # The evidence snapshot of the stop is stored.
    store = EvaluationStore(service.engine)
    deadline = time.monotonic() + 20
    while (snapshot := store.evidence(PROTOCOL, 1)) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert snapshot is not None and snapshot.seq == body["record"]["seq"]
    assert body["record"]["content_sha256"] in snapshot.markdown
    assert "figures/reward-harm.png" in snapshot.markdown
    assert "data:image/png;base64," in snapshot.html
    assert snapshot.summary["verdict"]["criterion"] == "reward-harm"

    # Its decisions stop; the other policies are still scored.
    _drained(service)
    before = count_decisions(service.engine, NAME)
    others = count_decisions(service.engine, "least-loaded")
    more = simulated_runtime(episodes=14, seed=0)[len(events) :]
    more_requests = [e for e in more if isinstance(e, MirrorRequest)]
    assert more_requests
    send_events(service, runtime_token, more_requests)
    _drained(service)
    assert count_decisions(service.engine, NAME) == before
    assert count_decisions(service.engine, "least-loaded") == others + len(more_requests)
