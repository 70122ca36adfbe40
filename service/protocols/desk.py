"""The protocol desk: submit, approve, start, stop and verdicts, one event per transition.

HTTP, the CLI and the evaluator all go through `ProtocolDesk`, so the rules
(`service.protocols.lifecycle`), the lock (`service.protocols.lock`) and the
checks (`check_protocol`) hold whichever door a caller uses. Storage is
plugged in through `ProtocolRecords`, which `service.storage.stores.protocol`
implements on PostgreSQL; the desk never imports it.

Every transition is one call to `ProtocolRecords.transition`, which moves the
state only if it is still the state (and sequence number) the desk read, and
writes exactly one event in the same transaction — so two racing callers
cannot both stop, and a paused evaluator cannot apply a stale verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass
from typing import Any
from typing import Protocol as Interface

from service.contract.errors import InvalidInput, NotFound
from service.protocols.check import LoggingProfile, Validation, check_protocol, validate_document
from service.protocols.lifecycle import (
    EVALUATOR,
    Action,
    Identity,
    State,
    authorize,
    authorize_read,
    authorize_role,
    next_state,
)
from service.protocols.lock import content_hash, ensure_unchanged, to_document
from service.protocols.parse import parse_protocol
from service.protocols.schema import Mode, PolicyRef, Protocol

VERDICTS = frozenset(
    {Action.COMPLETE, Action.DECLARE_INCONCLUSIVE, Action.SIGNAL_ROLLBACK, Action.STOP}
)
"""What the evaluator may apply."""


@dataclass(frozen=True, slots=True)
class NewEvent:
    """A transition about to be recorded (the store adds sequence number and time)."""

    action: Action
    from_state: State | None
    to_state: State
    actor: Identity
    reason: str
    evidence: Mapping[str, Any]
    criterion: str | None = None


@dataclass(frozen=True, slots=True)
class ProtocolEvent:
    """One recorded transition: who, when (Unix seconds), why, and the evidence then."""

    protocol_id: str
    version: int
    seq: int
    action: Action
    from_state: State | None
    to_state: State
    actor: str
    actor_role: str
    reason: str
    evidence: Mapping[str, Any]
    criterion: str | None
    content_sha256: str
    at: float


@dataclass(frozen=True)
class RecordedProtocol:
    """A protocol version as recorded: its locked document, hash and current state.

    `seq` counts the transitions so far (the sequence number of the latest event).
    """

    protocol_id: str
    version: int
    content_sha256: str
    document: Mapping[str, Any]
    mode: Mode
    owners: tuple[str, ...]
    submitted_by: str
    state: State
    seq: int
    recorded_at: float
    updated_at: float
    started_at: float | None

    def protocol(self) -> Protocol:
        """The parsed protocol (the recorded document always parses)."""
        return parse_protocol(self.document)


class ProtocolRecords(Interface):
    """Where recorded protocols and their events live (PostgreSQL in the service)."""

    def find(self, protocol_id: str, version: int) -> RecordedProtocol | None:
        """The recorded version, or None."""
        ...

    def create(
        self, protocol: Protocol, document: Mapping[str, Any], content_sha256: str, event: NewEvent
    ) -> RecordedProtocol:
        """Record a new version in `event.to_state` with its first event; `Conflict` if taken."""
        ...

    def transition(
        self, protocol_id: str, version: int, expected_seq: int, event: NewEvent
    ) -> RecordedProtocol:
        """Move from `event.from_state` at `expected_seq`, write the event; else `Conflict`."""
        ...

    def events(self, protocol_id: str, version: int) -> list[ProtocolEvent]:
        """Every event of a version, oldest first."""
        ...

    def recorded(self, states: Collection[State] | None = None) -> list[RecordedProtocol]:
        """Recorded versions, optionally only those in `states`."""
        ...


@dataclass(frozen=True)
class ProtocolStatus:
    """A recorded version and its full event timeline."""

    record: RecordedProtocol
    events: tuple[ProtocolEvent, ...]


def _reason(reason: str) -> str:
    if not reason.strip():
        raise InvalidInput("reason", "must say why, got an empty string")
    return reason.strip()


class ProtocolDesk:
    """The one engine behind every way of moving a protocol.

    Args:
        records: the store.
        policies: returns the registered policies now (None: unknown).
        logging: returns production's logging profile now (None: unknown).
    """

    def __init__(
        self,
        records: ProtocolRecords,
        *,
        policies: Callable[[], Mapping[str, PolicyRef] | None],
        logging: Callable[[], LoggingProfile | None],
    ) -> None:
        self.records = records
        self._policies = policies
        self._logging = logging

    def _check(self, protocol: Protocol) -> dict[str, Any]:
        """Run `check_protocol` now; the evidence snapshot recorded with the event."""
        policies = self._policies()
        logging = self._logging()
        warnings = check_protocol(protocol, policies=policies, logging=logging)
        registered = None if policies is None else policies.get(protocol.candidate.name)
        return {
            "warnings": [str(w) for w in warnings],
            "candidate_registered": None if registered is None else asdict(registered),
            "logging_profile": None if logging is None else asdict(logging),
        }

    def _get(self, protocol_id: str, version: int) -> RecordedProtocol:
        record = self.records.find(protocol_id, version)
        if record is None:
            raise NotFound(f"protocol `{protocol_id}` version {version} is not recorded")
        return record

    def _move(
        self,
        record: RecordedProtocol,
        action: Action,
        who: Identity,
        reason: str,
        evidence: Mapping[str, Any],
        criterion: str | None = None,
        expected_seq: int | None = None,
    ) -> RecordedProtocol:
        authorize(action, who, record.owners, record.submitted_by)
        target = next_state(action, record.state, record.mode)
        event = NewEvent(action, record.state, target, who, reason, dict(evidence), criterion)
        seq = record.seq if expected_seq is None else expected_seq
        return self.records.transition(record.protocol_id, record.version, seq, event)

    def validate(self, document: object, who: Identity) -> Validation:
        """Parse, check and hash; records nothing."""
        authorize_read(who)
        return validate_document(document, policies=self._policies(), logging=self._logging())

    def submit(self, document: object, who: Identity, reason: str = "") -> RecordedProtocol:
        """Record a new draft: its content is locked from now on (raises `Conflict` if taken)."""
        protocol = parse_protocol(document)
        authorize(Action.SUBMIT, who, protocol.owners, None)
        return self._create(protocol, who, reason.strip() or "submitted for review")

    def _create(self, protocol: Protocol, who: Identity, reason: str) -> RecordedProtocol:
        existing = self.records.find(*protocol.key)
        if existing is not None:  # a changed document is the more useful refusal
            ensure_unchanged(*protocol.key, existing.document, existing.content_sha256, protocol)
        evidence = self._check(protocol)
        doc = to_document(protocol)
        target = next_state(Action.SUBMIT, None, protocol.mode)
        event = NewEvent(Action.SUBMIT, None, target, who, reason, evidence)
        return self.records.create(protocol, doc, content_hash(protocol), event)

    def approve(
        self, protocol_id: str, version: int, content_sha256: str, who: Identity, reason: str
    ) -> RecordedProtocol:
        """Record an independent approval of exactly the content hashed `content_sha256`."""
        why = _reason(reason)
        authorize_role(Action.APPROVE, who)  # before the lookup: a 404 would tell what exists
        record = self._get(protocol_id, version)
        authorize(Action.APPROVE, who, record.owners, record.submitted_by)
        if content_sha256 != record.content_sha256:
            raise InvalidInput(
                "content_sha256",
                f"must be the recorded hash {record.content_sha256} (what is approved is exactly"
                f" what was recorded), got {content_sha256!r}",
            )
        evidence = {"content_sha256": record.content_sha256, **self._check(record.protocol())}
        return self._move(record, Action.APPROVE, who, why, evidence)

    def start(
        self,
        protocol_id: str,
        version: int,
        who: Identity,
        reason: str,
        document: object | None = None,
    ) -> RecordedProtocol:
        """Start a recorded version; with `document`, it must be the locked content.

        A shadow protocol not yet recorded is submitted first (two events);
        an online-bounded one must have been submitted and approved.
        """
        why = _reason(reason)
        authorize_role(Action.START, who)
        record = self.records.find(protocol_id, version)
        if document is not None:
            protocol = parse_protocol(document)
            if protocol.key != (protocol_id, version):
                raise InvalidInput(
                    "document.id",
                    f"must name {protocol_id} version {version}, got {protocol.id}"
                    f" version {protocol.version}",
                )
            if record is not None:
                ensure_unchanged(
                    protocol_id, version, record.document, record.content_sha256, protocol
                )
            elif protocol.mode is Mode.ONLINE_BOUNDED:
                next_state(Action.START, None, protocol.mode)  # raises: needs approval
            else:
                authorize(Action.START, who, protocol.owners, None)
                authorize(Action.SUBMIT, who, protocol.owners, None)
                record = self._create(protocol, who, "submitted at start")
        if record is None:
            raise NotFound(f"protocol `{protocol_id}` version {version} is not recorded")
        authorize(Action.START, who, record.owners, record.submitted_by)
        next_state(Action.START, record.state, record.mode)
        evidence = {"content_sha256": record.content_sha256, **self._check(record.protocol())}
        return self._move(record, Action.START, who, why, evidence)

    def stop(
        self,
        protocol_id: str,
        version: int,
        who: Identity,
        reason: str,
        evidence: Mapping[str, Any] | None = None,
    ) -> RecordedProtocol:
        """Stop (or withdraw) a version; always allowed to admin and safety."""
        why = _reason(reason)
        authorize_role(Action.STOP, who)
        record = self._get(protocol_id, version)
        return self._move(record, Action.STOP, who, why, evidence or {})

    def signal_rollback(
        self, protocol_id: str, version: int, who: Identity, reason: str
    ) -> RecordedProtocol:
        """Safety signals Runtime to roll back an online experiment (never an action by us)."""
        why = _reason(reason)
        authorize_role(Action.SIGNAL_ROLLBACK, who)
        record = self._get(protocol_id, version)
        return self._move(record, Action.SIGNAL_ROLLBACK, who, why, {})

    def apply_verdict(
        self,
        protocol_id: str,
        version: int,
        action: Action,
        *,
        reason: str,
        evidence: Mapping[str, Any],
        criterion: str | None,
        expected_seq: int,
    ) -> RecordedProtocol:
        """The evaluator's transition, fenced by the sequence number it evaluated at."""
        if action not in VERDICTS:
            raise InvalidInput("action", f"must be a verdict ({', '.join(VERDICTS)}), got {action}")
        why = _reason(reason)
        record = self._get(protocol_id, version)
        return self._move(record, action, EVALUATOR, why, evidence, criterion, expected_seq)

    def status(self, protocol_id: str, version: int, who: Identity) -> ProtocolStatus:
        """A version and its events."""
        authorize_read(who)
        record = self._get(protocol_id, version)
        return ProtocolStatus(record, tuple(self.records.events(protocol_id, version)))

    def recorded(
        self, who: Identity, states: Collection[State] | None = None
    ) -> list[RecordedProtocol]:
        """Recorded versions, optionally filtered by state."""
        authorize_read(who)
        return self.records.recorded(states)

    def evaluated(self) -> list[RecordedProtocol]:
        """What the evaluator watches: running or rollback-signalled versions."""
        return self.records.recorded([s for s in State if s.is_evaluated])
