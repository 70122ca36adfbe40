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

Nothing here races a clock: a bounded amount of traffic is sent, the test
waits until every outcome is joined and the evaluator has folded every
joined round (or stopped), then asserts. The hang guards only catch a hung
service and say what they saw.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine

from service.auth import token_digest
from service.contract import MirrorRequest, Outcome
from service.environment import World, load_scenario, log_episode
from service.evaluator.candidate_gate import CandidateGate
from service.evaluator.loop import Evaluator, EvaluatorConfig
from service.policies.registry import load_registry
from service.protocols.criteria import Evaluation, Status
from service.server.app import Service
from service.server.evaluator_wiring import wire_evaluator
from service.settings import Settings
from service.storage import count_decisions
from service.storage.log.outcomes import count_joined_outcomes
from service.storage.stores.evaluation import EvaluationStore
from tests.evaluator.conftest import protocol_doc
from tests.evaluator.harmful import NAME, VERSION, SlowestThroughput, gated_registry
from tests.live_traffic import GENEROUS_BUDGET_MS, generous, send_events, wait_drained, wait_for

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


EPISODES = 12
"""Traffic sent: 1,766 joined rounds (seed 0), in `STEPS` parts. An evaluator that folds
it in parts stops after ~300-610 rounds (DR difference -0.08 to -0.15, bound -0.02 to
-0.10). One that took all of it in one tick would have no outcome model yet: CI saw
DR -0.24 with the bound at +0.08 that way (no stop), which is why the parts are waited on."""
HANG_GUARD_S = 300.0
"""Only for a hung service: the waits below wait on conditions, never on this."""


def runtime_events(episodes: int, seed: int = 0) -> list[MirrorRequest | Outcome]:
    """What the simulated Runtime sends on the ``train`` scenario, episode after episode.

    Built here rather than taken from the demo, so a change to the demo's fleet
    does not change this test's statistics.
    """
    world = World(load_scenario("train"))
    events: list[MirrorRequest | Outcome] = []
    for episode in range(episodes):
        log = log_episode(world, seed=seed, episode=episode, mirror_before=episode % 4 == 3)
        events += log.events()
    return events


def _latest(service: Service) -> dict[str, Evaluation]:
    """The newest stored evaluation of each criterion (``max_duration``'s `n`: rounds folded)."""
    assert service.engine is not None
    rows = EvaluationStore(service.engine).latest(PROTOCOL, 1)
    return {s.evaluation.name: s.evaluation for s in rows}


def log_summary(service: Service, sent: int) -> str:
    """What the evaluator and the log hold now, for a failure message."""
    assert service.engine is not None
    statuses = {
        status: count_decisions(service.engine, NAME, status=status)
        for status in ("ok", "timeout", "all_infeasible", "infeasible_choice", "error")
    }
    return (
        f"{count_joined_outcomes(service.engine)} of {sent} outcomes joined;"
        f" candidate decisions by status {statuses}; latest evaluations:"
        f" {[e.summary() for e in _latest(service).values()]}"
    )


STEPS = 6
"""The traffic goes in this many parts, each sent once the evaluator has folded (or
fired on) every joined round before it. DR's outcome model learns from earlier
batches only, so an evaluator that takes all the traffic in one tick (it fell behind
on a loaded box) has no model yet and a far wider sequence: CI once saw the bound
at +0.08 after all 1,766 rounds that way, against stops after ~300-610 rounds when
the traffic is folded in parts. Waiting between parts makes the parts certain."""


def send_in_steps(
    service: Service, token: str, events: list[MirrorRequest | Outcome], steps: int = STEPS
) -> int:
    """Send `events` in `steps` parts, waiting on the evaluator between them; the
    number of outcomes sent (each refers to a request sent before it)."""
    size = -(-len(events) // steps)
    engine = service.engine
    assert engine is not None
    sent = 0
    for start in range(0, len(events), size):
        part = events[start : start + size]
        send_events(service, token, part)
        sent += sum(isinstance(e, Outcome) for e in part)
        _wait_folded(service, engine, sent)
    return sent


def _wait_folded(service: Service, engine: Engine, sent: int) -> None:
    """Until all `sent` outcomes are joined and the evaluator folded them (or fired)."""

    def summary() -> str:
        return log_summary(service, sent)

    wait_for(lambda: count_joined_outcomes(engine) >= sent, summary, HANG_GUARD_S)
    wait_for(lambda: folded_or_fired(service, sent), summary, HANG_GUARD_S)


def folded_or_fired(service: Service, sent: int) -> bool:
    """The evaluator fired `reward-harm`, or has folded all `sent` joined rounds without
    firing: what to wait on before asserting the stop, instead of a time."""
    latest = _latest(service)
    folded, harm = latest.get("max_duration"), latest.get("reward-harm")
    if harm is not None and harm.status is Status.FIRED:
        return True
    return folded is not None and folded.n >= sent


@pytest.fixture()
def wired(
    make_service: Callable[..., Service], runtime_token: str
) -> Iterator[tuple[Service, Evaluator]]:
    store: list[EvaluationStore] = []
    gate = CandidateGate(lambda: store[0].halted_candidates() if store else set(), refresh_s=0.5)
    loaded = load_registry(REPO / "policies")
    loaded = replace(loaded, manifests=generous(loaded.manifests))
    harmful = SlowestThroughput(loaded.predictors["gavel-throughput"])
    # Once the composition root wires its own evaluator, this test still wires its own
    # (faster ticks), so it turns the built-in one off.
    own = {"evaluator_enabled": False} if "evaluator_enabled" in Settings.model_fields else {}
    service = make_service(
        policies=gated_registry(loaded, harmful, gate),
        **own,
        # Under test is the evaluator, not the time budget: a loaded machine must not
        # time out (and quarantine) the candidate. tests/reliability covers quarantine.
        policy_time_budget_ms=GENEROUS_BUDGET_MS,
        auth_tokens={
            token_digest(runtime_token): "runtime",
            token_digest(ADMIN_TOKEN): "admin:alice",
            token_digest(REVIEWER_TOKEN): "reviewer:rita",
        },
    )
    assert service.engine is not None
    store.append(EvaluationStore(service.engine))
    # One replica: a tick slowed by a loaded machine must not cost it its own term, and
    # a row committed late must not fall out of the read window (1,766 rows < max_rows).
    config = EvaluatorConfig(interval_s=0.5, lease_ttl_s=120.0, overlap_s=120.0)
    evaluator = wire_evaluator(service, config, gate=gate)
    evaluator.start()
    yield service, evaluator
    evaluator.stop()


@pytest.mark.live
@pytest.mark.timeout(2 * HANG_GUARD_S)
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

    events = runtime_events(EPISODES)
    sent = send_in_steps(service, runtime_token, events)

    def seen() -> str:
        return log_summary(service, sent)

    assert service.engine is not None
    engine = service.engine
    wait_for(lambda: count_joined_outcomes(engine) == sent, seen, HANG_GUARD_S)

    reviewer = {"authorization": f"Bearer {REVIEWER_TOKEN}"}

    def protocol() -> httpx.Response:
        got = httpx.get(f"{base}/v1/protocols/{PROTOCOL}/versions/1", headers=reviewer)
        assert got.status_code == 200, got.text
        return got

    def settled() -> bool:
        """Stopped, or the evaluator has folded every joined round and fired nothing."""
        if protocol().json()["record"]["state"] != "running":
            return True
        latest = _latest(service)
        folded, harm = latest.get("max_duration"), latest.get("reward-harm")
        caught_up = folded is not None and folded.n >= sent
        return caught_up and (harm is None or harm.status is not Status.FIRED)

    wait_for(settled, seen, HANG_GUARD_S)
    status = protocol()
    assert status.json()["record"]["state"] == "stopped", seen()

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
    wait_for(lambda: store.evidence(PROTOCOL, 1) is not None, "no evidence snapshot stored")
    snapshot = store.evidence(PROTOCOL, 1)
    assert snapshot is not None and snapshot.seq == body["record"]["seq"]
    assert body["record"]["content_sha256"] in snapshot.markdown
    assert "figures/reward-harm.png" in snapshot.markdown
    assert "data:image/png;base64," in snapshot.html
    assert snapshot.summary["verdict"]["criterion"] == "reward-harm"

    # Its decisions stop; the other policies are still scored.
    wait_drained(service, HANG_GUARD_S)
    before = count_decisions(service.engine, NAME)
    others = count_decisions(service.engine, "least-loaded")
    more = runtime_events(EPISODES + 2)[len(events) :]
    more_requests = [e for e in more if isinstance(e, MirrorRequest)]
    assert more_requests
    send_events(service, runtime_token, more_requests)
    wait_drained(service, HANG_GUARD_S)
    assert count_decisions(service.engine, NAME) == before
    assert count_decisions(service.engine, "least-loaded") == others + len(more_requests)
