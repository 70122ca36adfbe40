"""The protocol store on real PostgreSQL: one event row per transition, append-only, locked."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest
from sqlalchemy import Engine, exc, text

from service.contract import MirrorRequest, ProductionDecision
from service.contract.errors import Conflict, NotFound, PermissionDenied
from service.protocols import (
    Action,
    ActorRole,
    Identity,
    NewEvent,
    PolicyRef,
    ProtocolDesk,
    ProtocolInvalid,
    ProtocolLocked,
    State,
)
from service.storage import DecisionLogWriter, LogBatch, rows_from
from service.storage.stores.protocol import ProtocolStore
from service.wire.convert import mirror_request_to_pb
from tests.protocols.conftest import DETERMINISTIC, TOKENS, make_desk, unique

ALICE = TOKENS["alice-admin"]
ROOT = TOKENS["root-admin"]
DAVE = TOKENS["dave-safety"]
ALICE_SAFETY = TOKENS["alice-safety"]
RITA = TOKENS["rita-reviewer"]


def event_rows(engine: Engine, protocol_id: str) -> list[tuple[Any, ...]]:
    """The raw event rows, as a reviewer's SQL would see them."""
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT seq, action, from_state, to_state, actor, actor_role, reason"
                    " FROM protocol_events WHERE protocol_id = :p ORDER BY seq"
                ),
                {"p": protocol_id},
            )
        ]


def state_row(engine: Engine, protocol_id: str) -> tuple[Any, ...]:
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT state, seq FROM protocol_versions WHERE protocol_id = :p"),
            {"p": protocol_id},
        ).one()
    return tuple(row)


def _step(desk: ProtocolDesk, store: ProtocolStore, pid: str, step: str) -> None:
    """One transition of the walks below, by whoever may take it."""
    record = store.find(pid, 1)
    if step == "approve":
        assert record is not None
        desk.approve(pid, 1, record.content_sha256, DAVE, "reviewed the bounds")
    elif step == "start":
        desk.start(pid, 1, ALICE, "go")
    elif step == "stop":
        desk.stop(pid, 1, DAVE, "enough")
    elif step == "signal-rollback":
        desk.signal_rollback(pid, 1, DAVE, "breach seen")
    else:
        assert record is not None
        desk.apply_verdict(
            pid,
            1,
            Action(step),
            reason=f"criterion fired: {step}",
            evidence={"value": 0.1, "bound": 0.05},
            criterion="reward-harm",
            expected_seq=record.seq,
        )


WALKS = [
    ("online", ["approve", "start", "signal-rollback", "stop"], State.STOPPED),
    ("online", ["approve", "start", "inconclusive"], State.INCONCLUSIVE),
    ("shadow", ["start", "complete"], State.COMPLETED),
    ("shadow", ["start", "stop"], State.STOPPED),
    ("shadow", ["approve", "start", "inconclusive"], State.INCONCLUSIVE),
    ("shadow", ["stop"], State.STOPPED),  # a withdrawn draft
]


@pytest.mark.parametrize(("mode", "steps", "final"), WALKS, ids=lambda v: str(v))
def test_every_transition_writes_exactly_one_event_row(
    mode: str,
    steps: list[str],
    final: State,
    desk: ProtocolDesk,
    store: ProtocolStore,
    shadow_doc: dict[str, Any],
    online_doc: dict[str, Any],
) -> None:
    doc = unique(online_doc if mode == "online" else shadow_doc)
    pid = doc["id"]
    desk.submit(doc, ALICE, "for review")
    assert event_rows(store.engine, pid) == [
        (1, "submit", None, "draft", "alice", "admin", "for review")
    ]
    for n, step in enumerate(steps, start=2):
        before = state_row(store.engine, pid)[0]
        _step(desk, store, pid, step)
        rows = event_rows(store.engine, pid)
        assert len(rows) == n, step  # exactly one new row per transition
        seq, action, from_state, to_state, *_ = rows[-1]
        assert (seq, action, from_state) == (n, step, before)
        assert state_row(store.engine, pid) == (to_state, n)
    assert state_row(store.engine, pid)[0] == final.value


def test_events_carry_who_when_why_and_the_evidence(
    desk: ProtocolDesk, store: ProtocolStore, online_doc: dict[str, Any]
) -> None:
    doc = unique(online_doc)
    t0 = time.time()
    record = desk.submit(doc, ALICE)
    desk.approve(doc["id"], 1, record.content_sha256, DAVE, "bounds are tight")
    desk.start(doc["id"], 1, ALICE, "go")
    events = store.events(doc["id"], 1)
    approve, started = events[1], events[2]
    assert (approve.actor, approve.actor_role, approve.reason) == (
        "dave",
        "safety",
        "bounds are tight",
    )
    assert approve.evidence["content_sha256"] == record.content_sha256
    assert started.evidence["logging_profile"]["with_propensity"] == 500
    assert started.evidence["candidate_registered"]["sha256"] == doc["candidate"]["sha256"]
    assert all(e.content_sha256 == record.content_sha256 for e in events)
    assert t0 - 5 <= events[0].at <= started.at <= time.time() + 5
    now = store.find(doc["id"], 1)
    assert now is not None and now.started_at is not None and now.state is State.RUNNING


@pytest.mark.parametrize(
    ("who", "error"),
    [(ALICE_SAFETY, PermissionDenied), (ROOT, PermissionDenied), (RITA, PermissionDenied)],
    ids=["owner-with-safety", "admin", "reviewer"],
)
def test_refused_approvals_write_nothing(
    who: Identity,
    error: type[Exception],
    desk: ProtocolDesk,
    store: ProtocolStore,
    online_doc: dict[str, Any],
) -> None:
    doc = unique(online_doc)
    record = desk.submit(doc, ALICE)
    with pytest.raises(error):
        desk.approve(doc["id"], 1, record.content_sha256, who, "looks fine")
    with pytest.raises(Conflict, match="only after approval"):
        desk.start(doc["id"], 1, ALICE, "go")  # an unapproved online protocol cannot start
    assert len(event_rows(store.engine, doc["id"])) == 1
    assert state_row(store.engine, doc["id"]) == ("draft", 1)


def test_approval_names_the_exact_content(
    desk: ProtocolDesk, store: ProtocolStore, online_doc: dict[str, Any]
) -> None:
    doc = unique(online_doc)
    desk.submit(doc, ALICE)
    with pytest.raises(Exception, match="`content_sha256` must be the recorded hash"):
        desk.approve(doc["id"], 1, "f" * 64, DAVE, "ok")
    with pytest.raises(NotFound):
        desk.approve(doc["id"], 2, "f" * 64, DAVE, "ok")


def test_an_online_protocol_never_recorded_cannot_start(
    desk: ProtocolDesk, store: ProtocolStore, online_doc: dict[str, Any]
) -> None:
    doc = unique(online_doc)
    with pytest.raises(Conflict, match="only after approval"):
        desk.start(doc["id"], 1, ALICE, "go", document=doc)
    assert store.find(doc["id"], 1) is None


def test_a_changed_running_protocol_is_refused_naming_the_changed_field(
    desk: ProtocolDesk, store: ProtocolStore, shadow_doc: dict[str, Any]
) -> None:
    doc = unique(shadow_doc)
    desk.start(doc["id"], 1, ALICE, "go", document=doc)  # submits, then starts
    assert [r[1] for r in event_rows(store.engine, doc["id"])] == ["submit", "start"]
    changed = {**doc, "guardrails": [dict(g) for g in doc["guardrails"]]}
    changed["guardrails"][0]["margin"] = 0.5
    changed["alpha"] = 0.1
    for attempt in (
        lambda: desk.submit(changed, ALICE),
        lambda: desk.start(doc["id"], 1, ALICE, "again", document=changed),
    ):
        with pytest.raises(ProtocolLocked) as caught:
            attempt()
        assert caught.value.fields == ("alpha", "guardrails[0].margin")
        assert "`guardrails[0].margin`" in str(caught.value)
    # A new version is a new experiment.
    desk.start(doc["id"], 2, ALICE, "v2", document={**changed, "version": 2})
    assert len(event_rows(store.engine, doc["id"])) == 4


def test_start_rechecks_the_environment(
    store: ProtocolStore, refs: dict[str, PolicyRef], shadow_doc: dict[str, Any]
) -> None:
    doc = unique(shadow_doc)
    make_desk(store, refs).submit(doc, ALICE)
    strict = make_desk(store, refs, logging=DETERMINISTIC)  # production turned deterministic
    with pytest.raises(ProtocolInvalid, match="deterministic") as caught:
        strict.start(doc["id"], 1, ALICE, "go")
    assert caught.value.field == "primary.metric"
    assert len(event_rows(store.engine, doc["id"])) == 1


def test_a_stale_verdict_applies_nothing(
    desk: ProtocolDesk, store: ProtocolStore, shadow_doc: dict[str, Any]
) -> None:
    doc = unique(shadow_doc)
    running = desk.start(doc["id"], 1, ALICE, "go", document=doc)
    desk.stop(doc["id"], 1, DAVE, "stopped by safety")
    with pytest.raises(Conflict):
        desk.apply_verdict(
            doc["id"],
            1,
            Action.COMPLETE,
            reason="success",
            evidence={},
            criterion=None,
            expected_seq=running.seq,
        )
    assert [r[1] for r in event_rows(store.engine, doc["id"])] == ["submit", "start", "stop"]


def test_racing_transitions_write_one_event(
    desk: ProtocolDesk, store: ProtocolStore, shadow_doc: dict[str, Any]
) -> None:
    doc = unique(shadow_doc)
    running = desk.start(doc["id"], 1, ALICE, "go", document=doc)
    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def stop(n: int) -> None:
        event = NewEvent(Action.STOP, State.RUNNING, State.STOPPED, DAVE, f"stop {n}", {})
        barrier.wait()
        try:
            store.transition(doc["id"], 1, running.seq, event)
            outcomes.append("stopped")
        except Conflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=stop, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(outcomes) == ["conflict"] * 3 + ["stopped"]
    assert [r[1] for r in event_rows(store.engine, doc["id"])] == ["submit", "start", "stop"]


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE protocol_events SET reason = 'edited' WHERE protocol_id = :p",
        "DELETE FROM protocol_events WHERE protocol_id = :p",
        "TRUNCATE protocol_events CASCADE",
        "UPDATE protocol_versions SET document = '{}' WHERE protocol_id = :p",
        "UPDATE protocol_versions SET owners = '{mallory}' WHERE protocol_id = :p",
        "UPDATE protocol_versions SET state = 'running', seq = seq + 1 WHERE protocol_id = :p",
        "UPDATE protocol_versions SET state = 'completed' WHERE protocol_id = :p",
        "DELETE FROM protocol_versions WHERE protocol_id = :p",
        "UPDATE protocols SET first_recorded_by = 'mallory' WHERE protocol_id = :p",
    ],
)
def test_the_database_refuses_edits_to_the_record(
    sql: str, desk: ProtocolDesk, store: ProtocolStore, online_doc: dict[str, Any]
) -> None:
    doc = unique(online_doc)
    desk.submit(doc, ALICE)
    with pytest.raises(exc.DBAPIError), store.engine.begin() as conn:
        conn.execute(text(sql), {"p": doc["id"]})
    assert event_rows(store.engine, doc["id"]) == [
        (1, "submit", None, "draft", "alice", "admin", "submitted for review")
    ]


def _raw_event(conn: Any, pid: str, seq: int, action: str, role: str, to: str) -> None:
    conn.execute(
        text(
            "INSERT INTO protocol_events (protocol_id, version, seq, action, from_state,"
            " to_state, actor, actor_role, reason, evidence, content_sha256)"
            " SELECT :p, 1, :s, :a, state, :t, 'mallory', :r, 'sneaky', '{}', content_sha256"
            " FROM protocol_versions WHERE protocol_id = :p"
        ),
        {"p": pid, "s": seq, "a": action, "r": role, "t": to},
    )


def test_the_database_itself_refuses_an_unapproved_online_start(
    desk: ProtocolDesk, store: ProtocolStore, online_doc: dict[str, Any]
) -> None:
    doc = unique(online_doc)
    desk.submit(doc, ALICE)
    with pytest.raises(exc.DBAPIError, match="not approved"), store.engine.begin() as conn:
        _raw_event(conn, doc["id"], 2, "start", "admin", "running")
        conn.execute(
            text("UPDATE protocol_versions SET state = 'running', seq = 2 WHERE protocol_id = :p"),
            {"p": doc["id"]},
        )
    with pytest.raises(exc.IntegrityError, match="approval_by_safety"), store.engine.begin() as c:
        _raw_event(c, doc["id"], 2, "approve", "admin", "approved")
    assert state_row(store.engine, doc["id"]) == ("draft", 1)


def _requests_with(requests: list[MirrorRequest], propensities: list[float | None]) -> LogBatch:
    now = time.time()
    rows = []
    for i, (r, p) in enumerate(zip(requests, propensities, strict=False)):
        fresh = dataclasses.replace(
            r, request_time=now - 60 - i, production=ProductionDecision(0, p)
        )
        payload = bytes(mirror_request_to_pb(fresh).SerializeToString())
        rows.append(rows_from(fresh, payload, i + 1, now, "features-v1", "f" * 64))
    return LogBatch(requests=[a for a, _ in rows], snapshots=[b for _, b in rows if b])


def test_logging_profile_reads_production_propensities(
    store: ProtocolStore, requests_sample: list[MirrorRequest]
) -> None:
    assert store.logging_profile().decisions == 0
    propensities: list[float | None] = [1.0] * 10 + [0.4] * 5 + [None] * 5
    DecisionLogWriter(store.engine).write(_requests_with(requests_sample[:20], propensities))
    profile = store.logging_profile()
    assert (profile.decisions, profile.with_propensity, profile.deterministic) == (20, 15, 10)
    assert profile.unidentifiable_reason() is None
    capped = store.logging_profile(limit=10)  # newest 10: all deterministic
    assert (capped.decisions, capped.deterministic) == (10, 10)
    assert capped.unidentifiable_reason() is not None


def test_listing_filters_by_state(
    desk: ProtocolDesk, store: ProtocolStore, shadow_doc: dict[str, Any]
) -> None:
    a, b = unique(shadow_doc), unique(shadow_doc)
    desk.submit(a, ALICE)
    desk.start(b["id"], 1, ALICE, "go", document=b)
    running = [r.protocol_id for r in desk.recorded(RITA, [State.RUNNING])]
    assert running == [b["id"]]
    assert [r.protocol_id for r in desk.evaluated()] == [b["id"]]
    assert {r.protocol_id for r in desk.recorded(RITA)} == {a["id"], b["id"]}
    with pytest.raises(PermissionDenied):
        desk.recorded(TOKENS["rt-runtime"])
    assert Identity("x", ActorRole.SYSTEM).role is ActorRole.SYSTEM


def test_the_same_document_twice_is_recorded_once(
    desk: ProtocolDesk, store: ProtocolStore, shadow_doc: dict[str, Any]
) -> None:
    doc = unique(shadow_doc)
    desk.submit(doc, ALICE)
    with pytest.raises(Conflict, match="already recorded"):
        desk.submit(doc, ALICE)
    assert len(event_rows(store.engine, doc["id"])) == 1


def test_an_unreachable_database_is_unavailable(tmp_path: Any) -> None:
    from service.contract.errors import Unavailable
    from service.storage import make_engine

    engine = make_engine(f"postgresql+psycopg://nobody@/none?host={tmp_path}")
    try:
        with pytest.raises(Unavailable, match="database unavailable while reading a protocol"):
            ProtocolStore(engine).find("p", 1)
    finally:
        engine.dispose()
