"""Outcome join edge cases, each asserted on the database rows (docs/storage.md)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine, text

from service.contract import MirrorRequest, ProductionDecision
from service.storage import (
    DecisionLogWriter,
    LogBatch,
    OutcomeCounts,
    conflicts,
    count_dangling_outcomes,
    joined_outcomes,
    outcome_row,
    pending_outcomes,
    rejoin_pending,
)
from tests.storage.storage_helpers import outcome_for, request_batch

RID = "sample-3-0"
P1, P2 = ProductionDecision(1, 0.25), ProductionDecision(2, 0.5)


@dataclass(frozen=True)
class Step:
    """One write: the request (with this production decision), an outcome, or both at once."""

    mirror: bool = False
    production: ProductionDecision | None = None  # on the mirror
    outcome: bool = False
    throughput: float = 1.5
    outcome_production: ProductionDecision | None = None


@dataclass(frozen=True)
class Expect:
    """Where the outcome ends up and what the request's production decision becomes."""

    state: str  # after_request | before_request | pending
    throughput: float = 1.5
    conflicts: tuple[str, ...] = ()
    production: tuple[int, float | None, str] | None = None


MIRROR, OUTCOME = Step(mirror=True), Step(outcome=True)
CASES = [
    ("after its request", [MIRROR, OUTCOME], Expect("after_request")),
    ("before its request", [OUTCOME, MIRROR], Expect("before_request")),
    ("with its request in one batch", [Step(mirror=True, outcome=True)], Expect("after_request")),
    ("twice, same content", [MIRROR, OUTCOME, OUTCOME], Expect("after_request")),
    (
        "twice, different content: first wins, conflict kept",
        [MIRROR, OUTCOME, Step(outcome=True, throughput=9.0)],
        Expect("after_request", conflicts=("outcome",)),
    ),
    (
        "twice before its request, different content",
        [OUTCOME, Step(outcome=True, throughput=9.0), MIRROR],
        Expect("before_request", conflicts=("outcome",)),
    ),
    (
        "a conflicting duplicate replayed is recorded once",
        [MIRROR, OUTCOME, Step(outcome=True, throughput=9.0), Step(outcome=True, throughput=9.0)],
        Expect("after_request", conflicts=("outcome",)),
    ),
    ("for a request never seen", [OUTCOME], Expect("pending")),
    (
        "production arrives with the outcome",
        [MIRROR, Step(outcome=True, outcome_production=P1)],
        Expect("after_request", production=(1, 0.25, "outcome")),
    ),
    (
        "production with an outcome that precedes its request",
        [Step(outcome=True, outcome_production=P1), MIRROR],
        Expect("before_request", production=(1, 0.25, "outcome")),
    ),
    (
        "production contradicting the mirrored one is recorded, not applied",
        [Step(mirror=True, production=P1), Step(outcome=True, outcome_production=P2)],
        Expect("after_request", conflicts=("production_decision",), production=(1, 0.25, "mirror")),
    ),
    (
        "production agreeing with the mirrored one fills a missing propensity",
        [
            Step(mirror=True, production=ProductionDecision(1, None)),
            Step(outcome=True, outcome_production=P1),
        ],
        Expect("after_request", production=(1, 0.25, "mirror")),
    ),
    (
        "a replayed request after the join changes nothing",
        [OUTCOME, MIRROR, MIRROR, OUTCOME],
        Expect("before_request"),
    ),
]


def _request(base: MirrorRequest, production: ProductionDecision | None) -> MirrorRequest:
    return dataclasses.replace(base, request_id=RID, production=production)


def _stored(engine: Engine) -> tuple[str | None, float | None]:
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT join_state, throughput FROM outcome_log WHERE request_id = :r"),
            {"r": RID},
        ).all()
    assert len(row) <= 1, f"outcome stored {len(row)} times"
    return (row[0][0], row[0][1]) if row else (None, None)


def _production(engine: Engine) -> tuple[int, float | None, str] | None:
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT production_option, production_propensity, production_source "
                "FROM requests WHERE request_id = :r"
            ),
            {"r": RID},
        ).one_or_none()
    return None if row is None or row[0] is None else (row[0], row[1], row[2])


@pytest.mark.parametrize(("case", "steps", "expect"), CASES, ids=[c[0] for c in CASES])
def test_outcome_edge_cases(
    engine: Engine,
    requests_sample: list[MirrorRequest],
    case: str,
    steps: list[Step],
    expect: Expect,
) -> None:
    writer = DecisionLogWriter(engine)
    for i, step in enumerate(steps):
        batch = (
            request_batch([_request(requests_sample[0], step.production)])
            if step.mirror
            else LogBatch()
        )
        if step.outcome:
            outcome = outcome_for(
                RID, throughput=step.throughput, production=step.outcome_production
            )
            batch = dataclasses.replace(batch, outcomes=[outcome_row(outcome, 1_700_000_600.0 + i)])
        writer.write(batch)

    assert _stored(engine) == (expect.state, expect.throughput), case
    assert tuple(c.kind for c in conflicts(engine, request_id=RID)) == expect.conflicts
    if any(s.mirror for s in steps):
        assert _production(engine) == expect.production
    dangling = count_dangling_outcomes(engine)
    assert dangling == (1 if expect.state == "pending" else 0)
    if expect.state != "pending":
        [joined] = joined_outcomes(engine, request_ids=[RID])
        assert joined.join_state == expect.state
        assert joined.observed_at == pytest.approx(1_700_000_500.0)


def test_counts_say_what_happened(engine: Engine, requests_sample: list[MirrorRequest]) -> None:
    writer = DecisionLogWriter(engine)
    a, b, c = requests_sample[0], requests_sample[1], requests_sample[2]
    writer.write(request_batch([a]))
    now = time.time()
    rows = [
        outcome_row(outcome_for(a.request_id, production=P1), now),  # joins; conflicts with mirror
        outcome_row(outcome_for(a.request_id, throughput=7.0), now),  # duplicate, differs
        outcome_row(outcome_for(b.request_id), now),  # early
        outcome_row(outcome_for("ghost"), now),  # never seen
    ]
    result = writer.write(LogBatch(outcomes=rows))
    assert result.outcomes == OutcomeCounts(
        joined=1,
        pending=2,
        duplicates=1,
        conflicting=1,
        production_conflicts=1,
        outcome_delays_s=(pytest.approx(1_700_000_500.0 - a.request_time),),  # type: ignore[arg-type]
    )
    late = writer.write(request_batch([b, c]))
    assert late.outcomes.joined_from_pending == 1
    assert [p.request_id for p in pending_outcomes(engine)] == ["ghost"]
    assert count_dangling_outcomes(engine, older_than_s=3600) == 0  # received just now
    assert count_dangling_outcomes(engine) == 1


def test_rejoin_closes_the_two_writer_gap(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    # Simulate a second writer: the request committed after the outcome went to pending,
    # without seeing it (the request row is inserted behind the writer's back).
    writer = DecisionLogWriter(engine)
    writer.write(LogBatch(outcomes=[outcome_row(outcome_for(RID, production=P1), 1.0)]))
    writer.write(request_batch([_request(requests_sample[0], None)]))
    with engine.begin() as conn:  # put it back to pending, as the race would have left it
        conn.execute(
            text(
                "INSERT INTO pending_outcomes SELECT request_id, observed_at, now(), "
                "queue_delay_s, throughput, completion_time_s, slo_met, failure, "
                "production_option, production_propensity, journal_seq FROM outcomes"
            )
        )
        conn.execute(text("DELETE FROM outcomes"))
        conn.execute(
            text(
                "UPDATE requests SET production_option = NULL, "
                "production_propensity = NULL, production_source = NULL"
            )
        )
    assert count_dangling_outcomes(engine) == 1
    assert rejoin_pending(engine) == 1
    assert count_dangling_outcomes(engine) == 0
    assert _stored(engine) == ("before_request", 1.5)
    assert _production(engine) == (1, 0.25, "outcome")


def test_rejoin_treats_a_raced_second_outcome_as_a_duplicate(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    writer = DecisionLogWriter(engine)
    writer.write(request_batch([_request(requests_sample[0], None)]))
    writer.write(LogBatch(outcomes=[outcome_row(outcome_for(RID), 1.0)]))
    with engine.begin() as conn:  # another writer's outcome, committed as pending in the race
        conn.execute(
            text(
                "INSERT INTO pending_outcomes (request_id, observed_at, received_at, "
                "throughput, failure) VALUES (:r, to_timestamp(1700000500), now(), 9.0, 'none')"
            ),
            {"r": RID},
        )
    assert rejoin_pending(engine) == 0
    assert count_dangling_outcomes(engine) == 0
    assert _stored(engine) == ("after_request", 1.5)  # first wins
    [conflict] = conflicts(engine, request_id=RID)
    assert (conflict.existing["throughput"], conflict.incoming["throughput"]) == (1.5, 9.0)
