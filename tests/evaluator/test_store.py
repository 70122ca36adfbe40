"""The evaluator's tables on real PostgreSQL: lease generations, fencing, append-only, halts."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, create_engine, exc, pool, text

from service.contract.errors import Conflict
from service.protocols import Action, ActorRole, Identity, ProtocolDesk, State
from service.protocols.criteria import Evaluation, Role, Status
from service.storage import ProtocolStore, make_engine
from service.storage.chain.tables import chain_retirements
from service.storage.log.tables import metadata
from service.storage.reviewer.tables import reviewer_access_log
from service.storage.stores.evaluation import (
    EvaluationStore,
    EvidenceSnapshot,
    FencedProtocolRecords,
    LeaseGrant,
)
from tests.evaluator.conftest import protocol_doc

ADMIN = Identity("alice", ActorRole.ADMIN)


@pytest.fixture()
def engine(db_url: str) -> Iterator[Engine]:
    e = make_engine(db_url)
    yield e
    e.dispose()


def _desk(engine: Engine) -> ProtocolDesk:
    return ProtocolDesk(
        FencedProtocolRecords(ProtocolStore(engine)), policies=lambda: None, logging=lambda: None
    )


def _running(desk: ProtocolDesk, pid: str = "exp", **changes: Any) -> None:
    desk.start(pid, 1, ADMIN, "go", document=protocol_doc(id=pid, **changes))


def _evaluation(name: str = "reward-harm") -> Evaluation:
    return Evaluation(name, Role.STOP, "reward", Status.FIRED, -0.2, -0.1, 0.0, -0.3, -0.1, 500,
                      0.05, "asymptotic-cs")  # fmt: skip


def _is_partition(obj: object, name: str | None, type_: str, reflected: bool, _: object) -> bool:
    if type_ == "table" and name is not None:
        return not (name.endswith("_default") or "_p2" in name or name == "alembic_version")
    return True


def test_core_tables_match_migration_0003(db_url: str) -> None:
    engine = create_engine(db_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*expression.*", category=UserWarning)
            ctx = MigrationContext.configure(
                conn, opts={"include_object": _is_partition, "compare_type": True}
            )
            diff = compare_metadata(ctx, metadata)
    finally:
        engine.dispose()
    assert diff == []
    assert {"evaluator_leases", "evaluations", "evidence_snapshots"} <= set(metadata.tables)
    # The chain and reviewer tables join `metadata` when their modules are imported (done
    # above): without them this test passed only after some other test imported them.
    assert {chain_retirements.name, reviewer_access_log.name} <= set(metadata.tables)


LONG_S = 600.0
"""A lease that cannot expire during a test, however long the machine stalls it."""
SHORT_S = 0.2
"""A lease the test waits out: by polling until it can be taken, never by sleeping."""


def _taken_after_expiry(store: EvaluationStore, holder: str) -> LeaseGrant:
    """Poll until `holder` takes the lease (the current one expires by the database's clock)."""
    deadline = time.monotonic() + 60.0  # a hang guard: an expired lease is takeable at once
    while (grant := store.acquire("evaluator", holder, LONG_S)) is None:
        lease = store.lease("evaluator")
        assert time.monotonic() < deadline, f"lease never became takeable: {lease}"
        time.sleep(0.02)  # poll interval of a condition wait
    return grant


@pytest.mark.live
def test_lease_renewal_keeps_the_generation_takeover_increments_it(engine: Engine) -> None:
    store = EvaluationStore(engine)
    a = store.acquire("evaluator", "a", LONG_S)
    assert a is not None and (a.holder, a.generation) == ("a", 1)
    renewed = store.acquire("evaluator", "a", LONG_S)
    assert renewed is not None and renewed.generation == 1
    assert store.acquire("evaluator", "b", LONG_S) is None  # unexpired: not takeable
    short = store.acquire("evaluator", "a", SHORT_S)  # a renewal that shortens the term
    assert short is not None and short.generation == 1
    b = _taken_after_expiry(store, "b")
    assert (b.holder, b.generation) == ("b", 2)
    assert store.acquire("evaluator", "a", LONG_S) is None  # the old holder cannot renew
    store.release("evaluator", "b", 2)
    back = store.acquire("evaluator", "a", 5.0)
    assert back is not None and back.generation == 3


def test_evaluations_are_fenced_and_append_only(engine: Engine) -> None:
    desk, store = _desk(engine), EvaluationStore(engine)
    _running(desk)
    grant = store.acquire("evaluator", "a", 5.0)
    assert grant is not None
    with pytest.raises(Conflict, match="evaluator fenced"):
        store.record_evaluations("exp", 1, [_evaluation()], "a", grant.generation + 1)
    with pytest.raises(Conflict, match="evaluator fenced"):
        store.record_evaluations("exp", 1, [_evaluation()], "b", grant.generation)
    store.record_evaluations("exp", 1, [_evaluation()], "a", grant.generation)
    [stored] = store.history("exp", 1)
    assert stored.evaluation == _evaluation() and stored.generation == grant.generation
    assert [s.evaluation.name for s in store.latest("exp", 1)] == ["reward-harm"]
    with engine.begin() as conn, pytest.raises(exc.DatabaseError, match="append-only"):
        conn.execute(text("UPDATE evaluations SET status = 'pending'"))


@pytest.mark.live
def test_a_verdict_from_an_old_generation_is_refused_and_writes_nothing(engine: Engine) -> None:
    desk, store = _desk(engine), EvaluationStore(engine)
    _running(desk)
    record = desk.records.find("exp", 1)
    assert record is not None and record.state is State.RUNNING
    old = store.acquire("evaluator", "a", SHORT_S)
    assert old is not None
    new = _taken_after_expiry(store, "b")
    assert new.generation == old.generation + 1

    def verdict(holder: str, generation: int) -> None:
        desk.apply_verdict(
            "exp",
            1,
            Action.STOP,
            reason="reward-harm fired",
            evidence={"lease": {"holder": holder, "generation": generation}},
            criterion="reward-harm",
            expected_seq=record.seq,  # the sequence number is still current
        )

    with pytest.raises(Conflict, match="evaluator fenced"):
        verdict("a", old.generation)
    assert len(desk.records.events("exp", 1)) == record.seq
    verdict("b", new.generation)
    events = desk.records.events("exp", 1)
    assert [e.action for e in events][-1] is Action.STOP
    assert events[-1].evidence["lease"] == {"holder": "b", "generation": new.generation}


def test_verdicts_are_not_fenced_before_any_evaluator_ran(engine: Engine) -> None:
    desk = _desk(engine)
    _running(desk)
    desk.apply_verdict(
        "exp", 1, Action.COMPLETE, reason="r", evidence={}, criterion="p", expected_seq=2
    )
    record = desk.records.find("exp", 1)
    assert record is not None and record.state is State.COMPLETED


def test_halted_candidates_and_a_restart_under_a_new_version(engine: Engine) -> None:
    desk, store = _desk(engine), EvaluationStore(engine)
    _running(desk, "first")
    grant = store.acquire("evaluator", "a", 5.0)
    assert grant is not None
    assert store.halted_candidates() == set()
    desk.stop("first", 1, ADMIN, "a human stop does not halt scoring")
    assert store.halted_candidates() == set()
    _running(desk, "second")
    desk.apply_verdict(
        "second",
        1,
        Action.STOP,
        reason="harm",
        evidence={"lease": {"holder": "a", "generation": grant.generation}},
        criterion="reward-harm",
        expected_seq=2,
    )
    assert store.halted_candidates() == {("candidate", "1")}
    _wait_for_database_clock_past(engine, desk.records.events("second", 1)[-1].at)
    _running(desk, "third")  # started strictly after the stop: it lifts the halt
    assert store.halted_candidates() == set()


def _wait_for_database_clock_past(engine: Engine, at: float) -> None:
    """Until PostgreSQL's clock is past `at` (a later start must have a later time)."""
    query = text("SELECT extract(epoch FROM clock_timestamp())::float8")
    with engine.connect() as conn:
        while float(conn.execute(query).scalar_one()) <= at:
            pass  # microseconds at most: the clock only has to tick once


def test_evidence_snapshots_are_fenced_and_kept_once(engine: Engine) -> None:
    desk, store = _desk(engine), EvaluationStore(engine)
    _running(desk)
    record = desk.records.find("exp", 1)
    assert record is not None
    grant = store.acquire("evaluator", "a", 5.0)
    assert grant is not None

    def snap(generation: int) -> EvidenceSnapshot:
        return EvidenceSnapshot("exp", 1, record.seq, record.content_sha256, "running",
                                {"k": 1}, "# md", "<p>", 0.0, "a", generation)  # fmt: skip

    with pytest.raises(Conflict, match="fenced"):
        store.store_evidence(snap(grant.generation + 7))
    store.store_evidence(snap(grant.generation))
    with pytest.raises(Conflict, match="already stored"):
        store.store_evidence(snap(grant.generation))
    got = store.evidence("exp", 1)
    assert got is not None and (got.seq, got.markdown, got.summary) == (
        record.seq,
        "# md",
        {"k": 1},
    )
    assert store.evidence("exp", 1, seq=99) is None
