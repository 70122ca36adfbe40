"""The evaluator's tables in PostgreSQL: the lease, evaluations, evidence snapshots.

Implements the storage interfaces of ``service.evaluator.loop`` and
``service.evaluator.leader``. The tables come from migration 0003 (the source
of truth, with the triggers that fence writes by the lease's generation and
keep evaluations and evidence append-only); `service.storage.stores.evaluation_tables`
mirrors it on the decision log's `metadata`, so the schema comparison covers it.

Fencing, in one place: every evaluation row and evidence snapshot carries the
writer's ``(holder, generation)``, and every verdict carries it in its
evidence under ``"lease"``; PostgreSQL refuses any of them unless that is the
lease as it is now, unexpired (SQLSTATE ``UF001``). `FencedProtocolRecords`
turns that refusal into `Conflict`, so the evaluator treats "the lease moved"
like "the protocol moved": it applies nothing.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Engine,
    Row,
    and_,
    exc,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import distinct_on

from service.contract.errors import Conflict
from service.protocols import (
    NewEvent,
    Protocol,
    ProtocolEvent,
    ProtocolRecords,
    RecordedProtocol,
    State,
)
from service.protocols.criteria import Evaluation, Role, Status
from service.storage.engine import unavailable_on_failure
from service.storage.stores.evaluation_tables import (
    evaluations,
    evaluator_leases,
    evidence_snapshots,
)
from service.storage.stores.protocol import protocol_events, protocol_versions

FENCE_SQLSTATE = "UF001"
"""What the fencing triggers of migration 0003 raise."""


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """Who holds a lease, in which generation, until when (Unix seconds, database clock)."""

    name: str
    holder: str
    generation: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class StoredEvaluation:
    """One stored evaluation: the criterion's judgement at `evaluated_at` (Unix seconds)."""

    evaluation: Evaluation
    evaluated_at: float
    holder: str
    generation: int


@dataclass(frozen=True, slots=True)
class EvidenceSnapshot:
    """An evidence package as stored for the event `seq` of a version."""

    protocol_id: str
    version: int
    seq: int
    content_sha256: str
    state: str
    summary: Mapping[str, Any]
    markdown: str
    html: str
    created_at: float
    holder: str
    generation: int


def _fenced(err: exc.DBAPIError) -> bool:
    return getattr(err.orig, "sqlstate", None) == FENCE_SQLSTATE


@contextmanager
def conflict_when_fenced(action: str) -> Iterator[None]:
    """Turn the fencing triggers' refusal into `Conflict` ("the lease moved")."""
    try:
        yield
    except exc.DBAPIError as err:
        if not _fenced(err):
            raise
        detail = str(err.orig).strip().splitlines()[0]
        raise Conflict(f"{action} refused: {detail}") from err


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


class EvaluationStore:
    """The lease, evaluations and evidence snapshots on PostgreSQL."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- the lease ---------------------------------------------------------------------------

    def acquire(self, name: str, holder: str, ttl_s: float) -> LeaseGrant | None:
        """Take or renew lease `name` for `ttl_s` seconds; None when another holder has it.

        Renewing an unexpired lease keeps its generation; taking an expired one
        (even back by the same holder) increments it, which fences everything
        the previous term started but had not written.
        """
        statement = text(
            """
            INSERT INTO evaluator_leases AS l
                   (name, holder, generation, acquired_at, renewed_at, expires_at)
            VALUES (:name, :holder, 1, clock_timestamp(), clock_timestamp(),
                    clock_timestamp() + make_interval(secs => :ttl))
            ON CONFLICT (name) DO UPDATE SET
                holder = EXCLUDED.holder,
                generation = CASE WHEN l.holder = EXCLUDED.holder
                                   AND l.expires_at > clock_timestamp()
                                  THEN l.generation ELSE l.generation + 1 END,
                acquired_at = CASE WHEN l.holder = EXCLUDED.holder
                                    AND l.expires_at > clock_timestamp()
                                   THEN l.acquired_at ELSE clock_timestamp() END,
                renewed_at = clock_timestamp(),
                expires_at = clock_timestamp() + make_interval(secs => :ttl)
            WHERE l.holder = EXCLUDED.holder OR l.expires_at <= clock_timestamp()
            RETURNING name, holder, generation, extract(epoch FROM expires_at)::float8
            """
        )
        with unavailable_on_failure("taking the evaluator lease"), self.engine.begin() as conn:
            row = conn.execute(statement, {"name": name, "holder": holder, "ttl": ttl_s}).first()
        return None if row is None else LeaseGrant(row[0], row[1], int(row[2]), float(row[3]))

    def release(self, name: str, holder: str, generation: int) -> None:
        """End our term now (a clean shutdown), so another replica takes over at once."""
        le = evaluator_leases.c
        statement = (
            update(evaluator_leases)
            .where(le.name == name, le.holder == holder, le.generation == generation)
            .values(expires_at=text("clock_timestamp()"))
        )
        with unavailable_on_failure("releasing the evaluator lease"), self.engine.begin() as conn:
            conn.execute(statement)

    def lease(self, name: str) -> LeaseGrant | None:
        """The lease as recorded now (it may have expired)."""
        le = evaluator_leases.c
        query = select(
            le.name, le.holder, le.generation, func.extract("epoch", le.expires_at)
        ).where(le.name == name)
        with unavailable_on_failure("reading the evaluator lease"), self.engine.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else LeaseGrant(row[0], row[1], int(row[2]), float(row[3]))

    # -- evaluations -------------------------------------------------------------------------

    def record_evaluations(
        self,
        protocol_id: str,
        version: int,
        judged: Sequence[Evaluation],
        holder: str,
        generation: int,
    ) -> None:
        """Append one row per evaluation, fenced by `(holder, generation)`.

        Raises:
            Conflict: the lease is no longer ours (nothing is written).
        """
        rows = [
            {
                "protocol_id": protocol_id,
                "version": version,
                "criterion": e.name,
                "role": e.role.value,
                "metric": e.metric,
                "status": e.status.value,
                "value": _finite_or_none(e.value),
                "bound": _finite_or_none(e.bound),
                "threshold": e.threshold,
                "lower_bound": _finite_or_none(e.lower),
                "upper_bound": _finite_or_none(e.upper),
                "n": e.n,
                "alpha": e.alpha,
                "method": e.method,
                "note": e.note,
                "holder": holder,
                "generation": generation,
            }
            for e in judged
        ]
        if not rows:
            return
        with (
            unavailable_on_failure("recording evaluations"),
            conflict_when_fenced("recording evaluations"),
            self.engine.begin() as conn,
        ):
            conn.execute(insert(evaluations), rows)

    def history(self, protocol_id: str, version: int) -> list[StoredEvaluation]:
        """Every stored evaluation of a version, oldest first."""
        e = evaluations.c
        query = (
            select(evaluations, func.extract("epoch", e.evaluated_at).label("at"))
            .where(e.protocol_id == protocol_id, e.version == version)
            .order_by(e.evaluated_at, e.evaluation_id)
        )
        with unavailable_on_failure("reading evaluations"), self.engine.connect() as conn:
            return [_stored(r) for r in conn.execute(query)]

    def latest(self, protocol_id: str, version: int) -> list[StoredEvaluation]:
        """The newest evaluation of each criterion of a version."""
        e = evaluations.c
        query = (
            select(evaluations, func.extract("epoch", e.evaluated_at).label("at"))
            .ext(distinct_on(e.criterion))
            .where(e.protocol_id == protocol_id, e.version == version)
            .order_by(e.criterion, e.evaluated_at.desc(), e.evaluation_id.desc())
        )
        with unavailable_on_failure("reading evaluations"), self.engine.connect() as conn:
            return [_stored(r) for r in conn.execute(query)]

    # -- evidence ----------------------------------------------------------------------------

    def store_evidence(self, snapshot: EvidenceSnapshot) -> None:
        """Keep the evidence package of event `snapshot.seq`, fenced like evaluations.

        Raises:
            Conflict: the lease is no longer ours, or a snapshot of that event exists.
        """
        values = {
            "protocol_id": snapshot.protocol_id,
            "version": snapshot.version,
            "seq": snapshot.seq,
            "content_sha256": snapshot.content_sha256,
            "state": snapshot.state,
            "summary": dict(snapshot.summary),
            "markdown": snapshot.markdown,
            "html": snapshot.html,
            "holder": snapshot.holder,
            "generation": snapshot.generation,
        }
        try:
            with (
                unavailable_on_failure("storing evidence"),
                conflict_when_fenced("storing evidence"),
                self.engine.begin() as conn,
            ):
                conn.execute(insert(evidence_snapshots).values(values))
        except exc.IntegrityError as err:
            raise Conflict(
                f"evidence of `{snapshot.protocol_id}` v{snapshot.version} event"
                f" {snapshot.seq} is already stored"
            ) from err

    def evidence(
        self, protocol_id: str, version: int, seq: int | None = None
    ) -> EvidenceSnapshot | None:
        """The snapshot of event `seq`, or the newest one; None when there is none."""
        s = evidence_snapshots.c
        query = (
            select(evidence_snapshots, func.extract("epoch", s.created_at).label("at"))
            .where(s.protocol_id == protocol_id, s.version == version)
            .order_by(s.seq.desc())
            .limit(1)
        )
        if seq is not None:
            query = query.where(s.seq == seq)
        with unavailable_on_failure("reading evidence"), self.engine.connect() as conn:
            row = conn.execute(query).first()
        if row is None:
            return None
        return EvidenceSnapshot(
            protocol_id=row.protocol_id,
            version=row.version,
            seq=row.seq,
            content_sha256=row.content_sha256,
            state=row.state,
            summary=row.summary,
            markdown=row.markdown,
            html=row.html,
            created_at=float(row.at),
            holder=row.holder,
            generation=int(row.generation),
        )

    # -- what the scorer must skip -----------------------------------------------------------

    def halted_candidates(self) -> set[tuple[str, str]]:
        """``(policy, version)`` of candidates the evaluator stopped, not since restarted.

        A candidate is halted when the latest event of a protocol naming it is a
        stop by the evaluator (role `system`), and no protocol naming it has
        started since.
        """
        v, e = protocol_versions.alias("v"), protocol_events.alias("e")
        later = protocol_versions.alias("later")
        restarted = (
            select(1)
            .where(
                later.c.candidate_policy == v.c.candidate_policy,
                later.c.candidate_version == v.c.candidate_version,
                later.c.state.in_([State.RUNNING.value, State.ROLLBACK_SIGNALLED.value]),
                later.c.started_at > e.c.at,
            )
            .exists()
        )
        query = (
            select(v.c.candidate_policy, v.c.candidate_version)
            .select_from(
                v.join(
                    e,
                    and_(
                        e.c.protocol_id == v.c.protocol_id,
                        e.c.version == v.c.version,
                        e.c.seq == v.c.seq,
                    ),
                )
            )
            .where(
                v.c.state == State.STOPPED.value,
                e.c.actor_role == "system",
                ~restarted,
            )
            .distinct()
        )
        with unavailable_on_failure("reading halted candidates"), self.engine.connect() as conn:
            return {(str(a), str(b)) for a, b in conn.execute(query)}


def _stored(row: Row[Any]) -> StoredEvaluation:
    return StoredEvaluation(
        evaluation=Evaluation(
            name=row.criterion,
            role=Role(row.role),
            metric=row.metric,
            status=Status(row.status),
            value=row.value,
            bound=row.bound,
            threshold=row.threshold,
            lower=row.lower_bound,
            upper=row.upper_bound,
            n=int(row.n),
            alpha=row.alpha,
            method=row.method,
            note=row.note,
        ),
        evaluated_at=float(row.at),
        holder=row.holder,
        generation=int(row.generation),
    )


class FencedProtocolRecords:
    """`ProtocolRecords` whose verdicts map the lease fence to `Conflict`.

    Wraps a `ProtocolStore`; only `transition` can meet the fence (the verdict
    trigger of migration 0003), every other call is passed through.
    """

    def __init__(self, inner: ProtocolRecords) -> None:
        self.inner = inner

    def find(self, protocol_id: str, version: int) -> RecordedProtocol | None:
        """As `ProtocolRecords.find`."""
        return self.inner.find(protocol_id, version)

    def create(
        self, protocol: Protocol, document: Mapping[str, Any], content_sha256: str, event: NewEvent
    ) -> RecordedProtocol:
        """As `ProtocolRecords.create`."""
        return self.inner.create(protocol, document, content_sha256, event)

    def transition(
        self, protocol_id: str, version: int, expected_seq: int, event: NewEvent
    ) -> RecordedProtocol:
        """As `ProtocolRecords.transition`; `Conflict` also when the lease has moved."""
        with conflict_when_fenced(f"{event.action.value} of `{protocol_id}` v{version}"):
            return self.inner.transition(protocol_id, version, expected_seq, event)

    def events(self, protocol_id: str, version: int) -> list[ProtocolEvent]:
        """As `ProtocolRecords.events`."""
        return self.inner.events(protocol_id, version)

    def recorded(self, states: Collection[State] | None = None) -> list[RecordedProtocol]:
        """As `ProtocolRecords.recorded`."""
        return self.inner.recorded(states)
