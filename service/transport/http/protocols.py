"""HTTP endpoints for experiment protocols: validate, submit, approve, start, stop, status.

A thin adapter over `ProtocolDesk`: bodies are read with a size limit and
validated by pydantic models (which stop here), the caller's identity comes
from the ``Authorization`` header through `identify`, and every rule — roles,
owners, independent approval, the lock — is the desk's. Domain errors
propagate to the app's `UnderstudyError` handler (400 / 401 / 403 / 404 /
409 / 503), so the handlers carry no try/except except for validate, whose
answer *is* the findings.

=======  ====================================================  ==========================
method   path                                                  who
=======  ====================================================  ==========================
POST     /v1/protocols/validate                                reviewer, safety, admin
POST     /v1/protocols                       (submit a draft)  admin who is an owner
GET      /v1/protocols?state=running                           reviewer, safety, admin
GET      /v1/protocols/{id}/versions/{v}     (with events)     reviewer, safety, admin
POST     /v1/protocols/{id}/versions/{v}/approve               safety, not owner/submitter
POST     /v1/protocols/{id}/versions/{v}/start                 admin who is an owner
POST     /v1/protocols/{id}/versions/{v}/stop                  admin, safety
POST     /v1/protocols/{id}/versions/{v}/rollback-signal       safety
=======  ====================================================  ==========================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.contract.errors import InvalidInput, PayloadTooLarge
from service.protocols import (
    Action,
    Finding,
    Identity,
    ProtocolDesk,
    ProtocolEvent,
    ProtocolInvalid,
    RecordedProtocol,
    Severity,
    State,
    authorize_role,
)
from service.transport.http.models import ErrorModel

Identify = Callable[[str | None], Identity]
"""Resolves an ``Authorization`` header to an identity, or raises `Unauthenticated`."""

M = TypeVar("M", bound=BaseModel)
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorModel} for code in (400, 401, 403, 404, 409, 413, 503)
}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DocumentBody(_Body):
    """A protocol document (the YAML file as JSON) and why it is sent."""

    document: dict[str, Any]
    reason: str = ""


class ApproveBody(_Body):
    """An approval names the exact content hash the approver reviewed."""

    content_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    reason: str


class StartBody(_Body):
    """Start a recorded version; with `document`, it must be the locked content."""

    reason: str
    document: dict[str, Any] | None = None


class ReasonBody(_Body):
    """Why."""

    reason: str


class FindingModel(BaseModel):
    """One check result."""

    severity: str
    field: str
    message: str


class ValidationModel(BaseModel):
    """Whether a document would be accepted, its lock hash, and every finding."""

    valid: bool
    protocol_id: str | None = None
    version: int | None = None
    content_sha256: str | None = None
    findings: list[FindingModel]


class RecordModel(BaseModel):
    """A recorded protocol version (times: Unix seconds)."""

    protocol_id: str
    version: int
    state: str
    mode: str
    content_sha256: str
    owners: list[str]
    submitted_by: str
    seq: int
    recorded_at: float
    updated_at: float
    started_at: float | None
    document: dict[str, Any]


class EventModel(BaseModel):
    """One transition: who, when, why, and the evidence snapshot."""

    seq: int
    action: str
    from_state: str | None
    to_state: str
    actor: str
    actor_role: str
    reason: str
    criterion: str | None
    content_sha256: str
    at: float
    evidence: dict[str, Any]


class StatusModel(BaseModel):
    """A version and its event timeline."""

    record: RecordModel
    events: list[EventModel]


def record_model(r: RecordedProtocol) -> RecordModel:
    """Response form of a recorded version."""
    return RecordModel(
        protocol_id=r.protocol_id,
        version=r.version,
        state=r.state.value,
        mode=r.mode.value,
        content_sha256=r.content_sha256,
        owners=list(r.owners),
        submitted_by=r.submitted_by,
        seq=r.seq,
        recorded_at=r.recorded_at,
        updated_at=r.updated_at,
        started_at=r.started_at,
        document=dict(r.document),
    )


def event_model(e: ProtocolEvent) -> EventModel:
    """Response form of an event."""
    return EventModel(
        seq=e.seq,
        action=e.action.value,
        from_state=None if e.from_state is None else e.from_state.value,
        to_state=e.to_state.value,
        actor=e.actor,
        actor_role=e.actor_role,
        reason=e.reason,
        criterion=e.criterion,
        content_sha256=e.content_sha256,
        at=e.at,
        evidence=dict(e.evidence),
    )


def _finding(f: Finding) -> FindingModel:
    return FindingModel(severity=f.severity.value, field=f.field, message=f.message)


def _role_first(action: Action, who: Identity) -> Identity:
    """Refuse a caller whose role may never take `action` before the body is even read.

    The desk checks the role before it looks the version up; here it runs
    earlier still, so a bad body or version cannot tell a token without the
    role anything either: the same 403 whether or not the protocol exists.
    """
    authorize_role(action, who)
    return who


def _version(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise InvalidInput("version", f"must be a positive integer, got {value!r}")
    return int(value)


def protocol_router(
    desk: ProtocolDesk, identify: Identify, *, max_body_bytes: int = 1024 * 1024
) -> APIRouter:
    """The ``/v1/protocols`` routes over `desk`; `identify` resolves callers."""
    router = APIRouter(prefix="/v1/protocols", tags=["protocols"], responses=_ERRORS)

    async def body(request: Request, model: type[M]) -> M:
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():  # stop reading as soon as the limit is passed
            chunks.append(chunk)
            size += len(chunk)
            if size > max_body_bytes:
                raise PayloadTooLarge("body", f"exceeds the limit of {max_body_bytes} bytes")
        raw = b"".join(chunks)
        try:
            return model.model_validate_json(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise InvalidInput(where, first["msg"]) from exc

    def caller(request: Request) -> Identity:
        return identify(request.headers.get("authorization"))

    @router.post("/validate", response_model=ValidationModel, summary="Check a protocol")
    async def validate(request: Request) -> ValidationModel:
        who = caller(request)
        sent = await body(request, DocumentBody)
        try:
            v = await run_in_threadpool(desk.validate, sent.document, who)
        except ProtocolInvalid as exc:
            return ValidationModel(valid=False, findings=[_finding(f) for f in exc.findings])
        except InvalidInput as exc:
            found = FindingModel(severity=Severity.ERROR.value, field=exc.field, message=str(exc))
            return ValidationModel(valid=False, findings=[found])
        return ValidationModel(
            valid=True,
            protocol_id=v.protocol.id,
            version=v.protocol.version,
            content_sha256=v.content_sha256,
            findings=[_finding(f) for f in v.warnings],
        )

    @router.post("", response_model=RecordModel, status_code=201, summary="Submit a draft")
    async def submit(request: Request) -> RecordModel:
        who = _role_first(Action.SUBMIT, caller(request))
        sent = await body(request, DocumentBody)
        return record_model(await run_in_threadpool(desk.submit, sent.document, who, sent.reason))

    @router.get("", response_model=list[RecordModel], summary="List recorded protocols")
    async def listing(request: Request, state: str | None = None) -> list[RecordModel]:
        who = caller(request)
        states = None
        if state is not None:
            allowed = [s.value for s in State]
            if state not in allowed:
                raise InvalidInput("state", f"must be one of {', '.join(allowed)}, got {state!r}")
            states = [State(state)]
        records = await run_in_threadpool(desk.recorded, who, states)
        return [record_model(r) for r in records]

    @router.get("/{protocol_id}/versions/{version}", response_model=StatusModel)
    async def status(request: Request, protocol_id: str, version: str) -> StatusModel:
        """A version, its state and every event."""
        who = caller(request)
        s = await run_in_threadpool(desk.status, protocol_id, _version(version), who)
        return StatusModel(record=record_model(s.record), events=[event_model(e) for e in s.events])

    @router.post("/{protocol_id}/versions/{version}/approve", response_model=RecordModel)
    async def approve(request: Request, protocol_id: str, version: str) -> RecordModel:
        """Independent approval (safety role, not an owner) of an exact content hash."""
        who = _role_first(Action.APPROVE, caller(request))
        sent = await body(request, ApproveBody)
        return record_model(
            await run_in_threadpool(
                desk.approve, protocol_id, _version(version), sent.content_sha256, who, sent.reason
            )
        )

    @router.post("/{protocol_id}/versions/{version}/start", response_model=RecordModel)
    async def start(request: Request, protocol_id: str, version: str) -> RecordModel:
        """Start; online-bounded protocols must be approved first."""
        who = _role_first(Action.START, caller(request))
        sent = await body(request, StartBody)
        return record_model(
            await run_in_threadpool(
                desk.start, protocol_id, _version(version), who, sent.reason, sent.document
            )
        )

    @router.post("/{protocol_id}/versions/{version}/stop", response_model=RecordModel)
    async def stop(request: Request, protocol_id: str, version: str) -> RecordModel:
        """Stop, or withdraw a draft or approved version."""
        who = _role_first(Action.STOP, caller(request))
        sent = await body(request, ReasonBody)
        return record_model(
            await run_in_threadpool(desk.stop, protocol_id, _version(version), who, sent.reason)
        )

    @router.post("/{protocol_id}/versions/{version}/rollback-signal", response_model=RecordModel)
    async def rollback_signal(request: Request, protocol_id: str, version: str) -> RecordModel:
        """Signal Runtime to roll back an online experiment (a signal, never an action)."""
        who = _role_first(Action.SIGNAL_ROLLBACK, caller(request))
        sent = await body(request, ReasonBody)
        return record_model(
            await run_in_threadpool(
                desk.signal_rollback, protocol_id, _version(version), who, sent.reason
            )
        )

    return router
