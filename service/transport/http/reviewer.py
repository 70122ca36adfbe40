"""The safety reviewer's read surface: ``/v1/reviewer/...`` (reviewer and admin roles only).

A thin adapter over `ReviewerAccess`, which runs every read as the read-only
``understudy_reviewer`` database role and writes it to the access log in the
same transaction. Query values are read raw and checked by
`service.storage.reviewer.query` (an unknown status, a malformed time, a bad
cursor or a limit out of range is a 400 naming the parameter, never a
database error; a crafted cursor too). Every query, answered or refused
(400, 403, 404, 500, 503, a timeout), is a row of the access log and a count
of ``understudy_reviewer_queries_total``; only calls without a valid token
(401) have no principal to log and are only counted. Listings answer JSON,
or CSV with ``?format=csv`` or ``Accept: text/csv``; the decision listing's
next cursor is also in the ``X-Next-Cursor`` header.

=======  ===============================================  ================================
method   path                                             what
=======  ===============================================  ================================
GET      /v1/reviewer/decisions                           decisions by filter, keyset pages
GET      /v1/reviewer/requests/{request_id}               one request in full
GET      /v1/reviewer/requests/{request_id}/feasibility   its options' logged masks (JSON/CSV)
GET      /v1/reviewer/experiments                         recorded protocol versions
GET      /v1/reviewer/experiments/{id}/versions/{v}/events  a version's events
=======  ===============================================  ================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from service.auth import Role, TokenAuthority
from service.contract.errors import (
    AuthError,
    InvalidInput,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from service.metrics import ServiceMetrics
from service.storage.reviewer.audit import Reviewer, ReviewerAccess, ReviewerTimeout
from service.transport.http.models import ErrorModel
from service.transport.http.protocols import EventModel, event_model
from service.transport.http.reviewer_models import (
    DecisionModel,
    DecisionPageModel,
    ExperimentModel,
    LoggedFeasibilityModel,
    OptionMaskRowModel,
    RequestInFullModel,
    decision_model,
    experiment_model,
    logged_feasibility_model,
    option_mask_rows,
    request_model,
    to_csv,
)

T = TypeVar("T")
FORMATS = ("json", "csv")
CSV = "text/csv; charset=utf-8"
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorModel} for code in (400, 401, 403, 404, 503)
}
_CSV_TOO: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/csv": {"schema": {"type": "string"}}}}
}

DECISION_PARAMETER_DOCS: dict[str, str] = {
    "since": "Requests at or after this time (Runtime's request_time): Unix seconds or "
    "ISO 8601 with an offset, e.g. `2026-05-01T00:00:00Z`.",
    "until": "Requests before this time (same forms as `since`); must be later than `since`.",
    "policy": "Policy name as registered, e.g. `gavel-scorer`.",
    "policy_version": "Policy version, e.g. `1.0.0`.",
    "experiment": "Protocol id: the candidate's decisions on requests received while it ran.",
    "experiment_version": "Protocol version (integer >= 1); default: the latest.",
    "workload_kind": "One of `train`, `finetune`, `infer`, `batch`.",
    "hardware_class": "Hardware class name of a node of the chosen option, e.g. `A100`. "
    "Applied after decoding the stored request, within a bounded scan: a page may be short "
    "and still carry a cursor.",
    "disagreement": "`true`: only decisions that differ from production's; `false`: only "
    "those that agree.",
    "status": "One of `ok`, `all_infeasible`, `infeasible_choice`, `error`, `timeout`.",
    "order": "`asc` (default, oldest request first) or `desc`.",
    "limit": "Page size, 1..1000 (default 100).",
    "cursor": "`next_cursor` of the previous page (opaque; only valid with the same filters "
    "and order).",
    "format": "`json` (default) or `csv`; `Accept: text/csv` also selects CSV.",
}


def _query_docs(docs: Mapping[str, str]) -> dict[str, Any]:
    return {
        "parameters": [
            {
                "name": name,
                "in": "query",
                "required": False,
                "schema": {"type": "string"},
                "description": text,
            }
            for name, text in docs.items()
        ]
    }


def _single(request: Request) -> dict[str, str]:
    """Query parameters by name; a name given twice is refused (which one would count?)."""
    params: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name in params:
            raise InvalidInput(name[:40], "is given more than once")
        params[name] = value
    return params


def _wants_csv(request: Request, params: dict[str, str]) -> bool:
    fmt = params.pop("format", None)
    if fmt is None:
        return "text/csv" in request.headers.get("accept", "")
    if fmt not in FORMATS:
        raise InvalidInput("format", f"must be one of {', '.join(FORMATS)}, got {fmt[:40]!r}")
    return fmt == "csv"


def reviewer_router(
    access: ReviewerAccess, authority: TokenAuthority, metrics: ServiceMetrics
) -> APIRouter:
    """The ``/v1/reviewer`` routes over `access`; only reviewer and admin tokens pass."""
    router = APIRouter(prefix="/v1/reviewer", tags=["reviewer"], responses=_ERRORS)
    counted = metrics.reviewer_queries

    async def caller(request: Request, endpoint: str, params: Mapping[str, str]) -> Reviewer:
        header = request.headers.get("authorization")
        try:
            authority.require(header, Role.REVIEWER)
        except AuthError as exc:
            metrics.auth_failures.labels("http", type(exc).__name__).inc()
            counted.labels(endpoint, "denied").inc()
            if isinstance(exc, PermissionDenied):  # known caller: worth an access-log row
                who = authority.identify(header)
                await run_in_threadpool(
                    access.record_refusal,
                    Reviewer(who.principal, who.role.value),
                    endpoint,
                    params,
                    "denied",
                    str(exc),
                )
            raise
        who = authority.identify(header)
        return Reviewer(who.principal, who.role.value)

    async def serve(endpoint: str, call: Callable[[], T]) -> T:
        try:
            result = await run_in_threadpool(call)
        except InvalidInput:
            counted.labels(endpoint, "rejected").inc()
            raise
        except NotFound:
            counted.labels(endpoint, "not_found").inc()
            raise
        except ReviewerTimeout:
            counted.labels(endpoint, "timeout").inc()
            raise
        except Unavailable:
            counted.labels(endpoint, "unavailable").inc()
            raise
        except Exception:  # answered 500 by the framework; logged as `failed` by `access`
            counted.labels(endpoint, "failed").inc()
            raise
        counted.labels(endpoint, "ok").inc()
        return result

    async def checked(
        request: Request,
        endpoint: str,
        fixed: Mapping[str, str] | None = None,
        allowed: tuple[str, ...] | None = None,
    ) -> tuple[Reviewer, dict[str, str], bool]:
        """The caller, the query parameters (plus `fixed` path values), and whether CSV
        was asked for; a bad parameter is logged and counted. With `allowed`, any other
        query parameter is refused (the decision listing checks its own)."""
        sent = dict(fixed or {}) | dict(request.query_params)
        who = await caller(request, endpoint, sent)
        try:
            given = _single(request)
            csv = _wants_csv(request, given)
            unknown = sorted(set(given) - set(allowed)) if allowed is not None else []
            if allowed is not None and unknown:
                names = ", ".join(f"`{a}`" for a in (*allowed, "format"))
                raise InvalidInput(unknown[0][:40], f"is not a parameter; use {names}")
            return who, dict(fixed or {}) | given, csv
        except InvalidInput as exc:
            counted.labels(endpoint, "rejected").inc()
            await run_in_threadpool(
                access.record_refusal, who, endpoint, sent, "rejected", str(exc)
            )
            raise

    def listing(rows: list[BaseModel], model: type[BaseModel], csv: bool) -> Response:
        if csv:
            return Response(to_csv(rows, model), media_type=CSV)
        return JSONResponse([r.model_dump(mode="json") for r in rows])

    @router.get(
        "/decisions",
        response_model=DecisionPageModel,
        responses=_CSV_TOO,
        openapi_extra=_query_docs(DECISION_PARAMETER_DOCS),
        summary="Decisions by filter: time, policy, experiment, workload kind, hardware class, "
        "disagreement with production, status (keyset pages; JSON or CSV)",
    )
    async def decisions(request: Request) -> Response:
        who, params, csv = await checked(request, "decisions")
        result = await serve("decisions", lambda: access.decisions(who, params))
        headers = {"X-Next-Cursor": result.next_cursor} if result.next_cursor else {}
        items = [decision_model(i) for i in result.page.items]
        if csv:
            return Response(to_csv(items, DecisionModel), media_type=CSV, headers=headers)
        body = DecisionPageModel(
            items=items, next_cursor=result.next_cursor, scanned=result.page.scanned
        )
        return JSONResponse(body.model_dump(mode="json"), headers=headers)

    @router.get(
        "/requests/{request_id}",
        response_model=RequestInFullModel,
        summary="One request in full: as received, options with feasibility, replayed "
        "features, every policy's decision with scores and probabilities, outcome, protocols "
        "in force",
    )
    async def one_request(request: Request, request_id: str) -> JSONResponse:
        params = {"request_id": request_id}
        who = await caller(request, "request", params)
        full = await serve("request", lambda: access.request(who, request_id))
        return JSONResponse(request_model(full).model_dump(mode="json"))

    @router.get(
        "/requests/{request_id}/feasibility",
        response_model=LoggedFeasibilityModel,
        responses=_CSV_TOO,
        openapi_extra=_query_docs({"format": DECISION_PARAMETER_DOCS["format"]}),
        summary="One request's options with the signals that masked each, as the scorer "
        "logged them (JSON, or CSV one row per option with `;`-joined nodes and signals)",
    )
    async def request_feasibility(request: Request, request_id: str) -> Response:
        endpoint = "request_feasibility"
        who, _, csv = await checked(request, endpoint, {"request_id": request_id}, allowed=())
        full = await serve(endpoint, lambda: access.request(who, request_id, endpoint))
        if csv:
            return Response(to_csv(option_mask_rows(full), OptionMaskRowModel), media_type=CSV)
        return JSONResponse(logged_feasibility_model(full).model_dump(mode="json"))

    @router.get(
        "/experiments",
        response_model=list[ExperimentModel],
        responses=_CSV_TOO,
        openapi_extra=_query_docs(
            {
                "protocol_id": "Only this protocol's versions.",
                "format": DECISION_PARAMETER_DOCS["format"],
            }
        ),
        summary="Recorded protocol versions with their window and approval (JSON or CSV)",
    )
    async def experiments(request: Request) -> Response:
        who, params, csv = await checked(request, "experiments", allowed=("protocol_id",))
        found = await serve(
            "experiments", lambda: access.experiments(who, params.get("protocol_id"))
        )
        return listing([experiment_model(e) for e in found], ExperimentModel, csv)

    @router.get(
        "/experiments/{protocol_id}/versions/{version}/events",
        response_model=list[EventModel],
        responses=_CSV_TOO,
        openapi_extra=_query_docs({"format": DECISION_PARAMETER_DOCS["format"]}),
        summary="Every event of a protocol version: who, when, why, evidence (JSON or CSV)",
    )
    async def events(request: Request, protocol_id: str, version: str) -> Response:
        fixed = {"protocol_id": protocol_id, "version": version}
        who, _, csv = await checked(request, "events", fixed, allowed=())
        found = await serve("events", lambda: access.events(who, protocol_id, version))
        return listing([event_model(e) for e in found], EventModel, csv)

    return router
