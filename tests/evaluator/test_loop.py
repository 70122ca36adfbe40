"""The evaluator loop on real PostgreSQL with a scripted round source.

The source is a fake that implements the real `RoundSource` interface (the
decision-log source is exercised end to end in test_end_to_end.py); the
store, the desk, the lease, the fencing triggers and the metrics are real.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine

from service.evaluator.candidate_gate import CandidateGate
from service.evaluator.leader import Lease
from service.evaluator.loop import Cursor, Evaluator, EvaluatorConfig, Watched
from service.evaluator.metrics import EvaluatorMetrics
from service.metrics import ServiceMetrics
from service.protocols import (
    Action,
    ActorRole,
    Identity,
    PolicyRef,
    ProtocolDesk,
    RecordedProtocol,
    State,
)
from service.protocols.rounds import Decisions, JoinedRounds, QualityCounts
from service.protocols.verdicts import Verdict
from service.server.evaluator_wiring import StoredEvidence
from service.storage import ProtocolStore, make_engine
from service.storage.stores.evaluation import EvaluationStore, FencedProtocolRecords
from tests.evaluator.conftest import protocol_doc

ADMIN = Identity("alice", ActorRole.ADMIN)
SAFETY = Identity("dave", ActorRole.SAFETY)
RNG = np.random.default_rng(9)


def harmful(n: int) -> JoinedRounds:
    """Production uniform over two options; the candidate takes the worse one."""
    action = RNG.integers(0, 2, n)
    reward = (RNG.random(n) < np.where(action == 1, 0.3, 0.8)).astype(float)
    target = np.zeros((n, 3))
    target[:, 1] = 1.0
    return JoinedRounds(reward, np.zeros(n), action, np.full(n, 0.5), target)


@dataclass
class ScriptedSource:
    """`RoundSource` that hands out scripted batches, one per tick."""

    batches: list[JoinedRounds]
    breaches_next: list[str] = field(default_factory=list)
    n_features: int | None = None

    def joined(self, watched: Watched, cursor: Cursor) -> JoinedRounds | None:
        return self.batches.pop(0) if self.batches else None

    def decisions(self, watched: Watched, cursor: Cursor) -> tuple[Decisions, Decisions | None]:
        return Decisions.empty(), None

    def quality(self, watched: Watched) -> QualityCounts:
        return QualityCounts()

    def breaches(self, watched: Watched, cursor: Cursor) -> list[str]:
        out, self.breaches_next = self.breaches_next, []
        return out


@pytest.fixture()
def engine(db_url: str) -> Iterator[Engine]:
    e = make_engine(db_url)
    yield e
    e.dispose()


@dataclass
class Rig:
    engine: Engine
    desk: ProtocolDesk
    store: EvaluationStore
    registry: CollectorRegistry
    gate: CandidateGate

    def evaluator(
        self,
        holder: str,
        source: ScriptedSource,
        ttl_s: float = 5.0,
        lease_clock: Callable[[], float] = time.monotonic,
        **kw: object,
    ) -> Evaluator:
        records = FencedProtocolRecords(ProtocolStore(self.engine))
        desk = ProtocolDesk(records, policies=lambda: None, logging=lambda: None)
        return Evaluator(
            desk,
            self.store,
            source,
            Lease(self.store, "evaluator", holder, ttl_s, lease_clock),
            EvaluatorMetrics(self.metrics),
            StoredEvidence(self.store, records),
            EvaluatorConfig(interval_s=0.05),
            self.gate,
            **kw,  # type: ignore[arg-type]
        )

    @property
    def metrics(self) -> ServiceMetrics:
        if not hasattr(self, "_metrics"):
            self._metrics = ServiceMetrics(self.registry)
        return self._metrics

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


@pytest.fixture()
def rig(engine: Engine) -> Rig:
    store = EvaluationStore(engine)
    desk = ProtocolDesk(
        ProtocolStore(engine),
        policies=lambda: {
            "candidate": PolicyRef("candidate", "1"),
            "online-candidate": PolicyRef("online-candidate", "1", "a" * 64),
        },
        logging=lambda: None,
    )
    return Rig(engine, desk, store, CollectorRegistry(), CandidateGate(store.halted_candidates))


def test_a_harmful_candidate_is_stopped_with_evidence_metrics_and_a_halt(rig: Rig) -> None:
    rig.desk.start("exp", 1, ADMIN, "go", document=protocol_doc(id="exp"))
    source = ScriptedSource([harmful(100), harmful(100), harmful(400)])
    evaluator = rig.evaluator("a", source)
    assert evaluator.tick() == 1  # 100 rounds: insufficient
    assert rig.sample(
        "understudy_experiment_criterion_status",
        experiment="exp@1", criterion="reward-harm", status="insufficient",
    ) == 1  # fmt: skip
    evaluator.tick()
    evaluator.tick()
    record = rig.desk.records.find("exp", 1)
    assert record is not None and record.state is State.STOPPED
    last = rig.desk.records.events("exp", 1)[-1]
    assert (last.action, last.criterion, last.actor) == (
        Action.STOP, "reward-harm", "understudy-evaluator",
    )  # fmt: skip
    assert last.evidence["criterion"]["bound"] < 0.0 == last.evidence["criterion"]["threshold"]
    assert last.evidence["lease"] == {"holder": "a", "generation": 1}
    value = rig.sample(
        "understudy_experiment_criterion_value", experiment="exp@1", criterion="reward-harm"
    )
    assert value == pytest.approx(last.evidence["criterion"]["value"])
    assert rig.sample(
        "understudy_experiment_transitions_total",
        experiment="exp@1", action="stop", criterion="reward-harm",
    ) == 1  # fmt: skip
    assert ("candidate", "1") in rig.gate.halted()
    snapshot = rig.store.evidence("exp", 1)
    assert snapshot is not None and snapshot.seq == record.seq
    assert record.content_sha256 in snapshot.markdown and "reward-harm" in snapshot.html
    assert snapshot.summary["verdict"]["criterion"] == "reward-harm"
    assert evaluator.tick() == 0  # stopped: no longer evaluated


def test_only_the_lease_holder_evaluates(rig: Rig) -> None:
    rig.desk.start("exp", 1, ADMIN, "go", document=protocol_doc(id="exp"))
    leader = rig.evaluator("a", ScriptedSource([harmful(50)]))
    follower = rig.evaluator("b", ScriptedSource([harmful(50)]))
    assert leader.tick() == 1
    assert follower.tick() == 0
    holders = {s.holder for s in rig.store.history("exp", 1)}
    assert holders == {"a"}


@pytest.mark.live
def test_a_leader_paused_before_applying_applies_nothing(rig: Rig) -> None:
    """In-process version of the two-process test: the pause lands between decide and apply."""
    rig.desk.start("exp", 1, ADMIN, "go", document=protocol_doc(id="exp"))
    follower = rig.evaluator("b", ScriptedSource([harmful(600)]))

    def pause(record: RecordedProtocol, verdict: Verdict) -> None:
        # While "a" is paused its lease expires (PostgreSQL's clock) and "b" takes over and
        # stops the experiment: "b" ticks as a follower until then, however long that takes.
        deadline = time.monotonic() + 60.0  # a hang guard: the lease lasts 0.4 s
        while follower.tick() == 0:
            assert time.monotonic() < deadline, "b never took the expired lease (hang guard)"
            time.sleep(0.02)  # poll interval of a condition wait

    # A frozen local clock: "a" believes its lease, so only PostgreSQL's fence stops it.
    leader = rig.evaluator(
        "a", ScriptedSource([harmful(600)]), ttl_s=0.4, lease_clock=lambda: 0.0, before_apply=pause
    )
    leader.tick()
    events = rig.desk.records.events("exp", 1)
    stops = [e for e in events if e.action is Action.STOP]
    assert len(stops) == 1 and stops[0].evidence["lease"]["holder"] == "b"
    assert rig.sample("understudy_evaluator_refused_total", reason="conflict") == 1


def test_an_authority_breach_signals_rollback_and_monitoring_continues(rig: Rig) -> None:
    doc = protocol_doc(
        id="online",
        mode="online-bounded",
        candidate={"policy": "online-candidate", "version": "1", "sha256": "a" * 64},
        rollback=[{"name": "rollback-harm", "metric": "reward", "worse_than_baseline_by": 0.1}],
        authority={
            "traffic_fraction": 0.1,
            "pools": ["V100"],
            "workload_kinds": ["train"],
            "max_concurrent_placements": 2,
            "max_duration": "1d",
        },
    )
    record = rig.desk.submit(doc, ADMIN, "review please")
    rig.desk.approve("online", 1, record.content_sha256, SAFETY, "bounds are fine")
    rig.desk.start("online", 1, ADMIN, "approved, go")
    source = ScriptedSource([], breaches_next=["`pool` 'K80' is not in `authority.pools`"])
    evaluator = rig.evaluator("a", source)
    evaluator.tick()
    signalled = rig.desk.records.find("online", 1)
    assert signalled is not None and signalled.state is State.ROLLBACK_SIGNALLED
    assert rig.sample("understudy_experiment_rollback_signalled", experiment="online@1") == 1
    assert rig.desk.records.events("online", 1)[-1].criterion == "authority"
    assert evaluator.tick() == 1  # still evaluated: a rollback signal does not end monitoring
