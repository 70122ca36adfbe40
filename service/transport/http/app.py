"""The HTTP app: POST /v1/mirror, POST /v1/outcomes, /healthz, /readyz, /metrics.

Bodies are read with a hard size limit and parsed with pydantic's JSON
validator; refusals carry `{"error", "field", "message"}` with a status from
`STATUS_BY_ERROR`. The OpenAPI document (``/openapi.json``) describes the
bodies from the same pydantic models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect

from service import __version__
from service.auth import Role, TokenAuthority
from service.contract import MirrorRequest, Outcome
from service.contract.errors import (
    AuthError,
    Conflict,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    UnderstudyError,
)
from service.metrics import ServiceMetrics
from service.pipeline.ingest import Ingest, IngestResult
from service.readiness import Readiness
from service.transport.http.convert import mirror_from_json, outcome_from_json
from service.transport.http.models import AckModel, ErrorModel, MirrorRequestModel, OutcomeModel

STATUS_BY_ERROR: tuple[tuple[type[UnderstudyError], int], ...] = (
    (PayloadTooLarge, 413),
    (InvalidInput, 400),
    (Unauthenticated, 401),
    (PermissionDenied, 403),
    (NotFound, 404),
    (Conflict, 409),
    (Unavailable, 503),
)

_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorModel} for code in (400, 401, 403, 413)
}


def status_for(exc: UnderstudyError) -> int:
    """The HTTP status of an error: the first table row it is an instance of."""
    for cls, code in STATUS_BY_ERROR:
        if isinstance(exc, cls):
            return code
    return 500


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    """`node` with each `#/$defs/...` reference replaced by its definition.

    pydantic's `$defs` would be dangling once nested inside the OpenAPI document
    (a `$ref` resolves from the document's root); the models are not recursive.
    """
    if isinstance(node, list):
        return [_inline_refs(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _inline_refs(value, defs) for key, value in node.items() if key != "$defs"}
    ref = out.pop("$ref", None)
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return _inline_refs(defs[ref.removeprefix("#/$defs/")], defs) | out
    if ref is not None:
        out["$ref"] = ref
    return out


def _body_schema(model: type[MirrorRequestModel] | type[OutcomeModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": _inline_refs(schema, schema.get("$defs", {}))}
            },
        }
    }


@dataclass(frozen=True, slots=True)
class _Body:
    """What was read of a request body, and why reading stopped early, if it did."""

    data: bytes
    too_large: bool = False
    cut_short: bool = False


async def _read_limited(request: Request, limit: int) -> _Body:
    """Read at most `limit + 1` bytes: enough to know the body is too large."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return _Body(b"", too_large=True)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                return _Body(b"", too_large=True)
    except ClientDisconnect:  # went away, or cut off by the read deadline (slow_clients.py)
        return _Body(b"".join(chunks), cut_short=True)
    return _Body(b"".join(chunks))


def create_http_app(
    ingest: Ingest,
    authority: TokenAuthority,
    metrics: ServiceMetrics,
    readiness: Readiness,
    max_request_bytes: int,
    offload_appends: bool = False,
) -> FastAPI:
    """Build the FastAPI app around the shared ingest engine.

    `offload_appends` runs ingest in the thread pool: needed when every append
    fsyncs (journal_fsync=always), which would otherwise stall the event loop.
    """
    # The generated docs routes are replaced by token-checked ones below: every
    # endpoint but liveness and readiness needs a token.
    app = FastAPI(
        title="Understudy",
        version=__version__,
        description="Shadow evaluation of placement policies. Acks never carry a decision.",
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )

    @app.exception_handler(UnderstudyError)
    async def _on_error(_: Request, exc: UnderstudyError) -> JSONResponse:
        body = ErrorModel(
            error=type(exc).__name__,
            field=exc.field if isinstance(exc, InvalidInput) else None,
            message=str(exc),
        )
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthenticated) else None
        return JSONResponse(body.model_dump(), status_code=status_for(exc), headers=headers)

    def authorise(request: Request) -> None:
        try:
            authority.require(request.headers.get("authorization"), Role.RUNTIME)
        except AuthError as exc:
            metrics.auth_failures.labels("http", type(exc).__name__).inc()
            raise

    def checked(what: str, body: _Body) -> bytes:
        if body.too_large:
            raise PayloadTooLarge(what, f"exceeds the limit of {max_request_bytes} bytes")
        if body.cut_short:
            raise InvalidInput(
                what, f"ended after {len(body.data)} bytes: the client went away or was too slow"
            )
        return body.data

    def ack(result: IngestResult) -> JSONResponse:
        model = AckModel(status=result.status.value, request_id=result.request_id)
        return JSONResponse(model.model_dump(), status_code=202)

    @app.post(
        "/v1/mirror",
        response_model=AckModel,
        status_code=202,
        responses=_ERROR_RESPONSES,
        openapi_extra=_body_schema(MirrorRequestModel),
        summary="Mirror a placement request (acked once journaled; no decision returned)",
    )
    async def mirror(request: Request) -> JSONResponse:
        authorise(request)
        body = await _read_limited(request, max_request_bytes)

        def decode() -> tuple[MirrorRequest, bytes]:
            return mirror_from_json(checked("body", body))

        if offload_appends:
            return ack(await run_in_threadpool(ingest.mirror, "http", decode))
        return ack(ingest.mirror("http", decode))

    @app.post(
        "/v1/outcomes",
        response_model=AckModel,
        status_code=202,
        responses=_ERROR_RESPONSES,
        openapi_extra=_body_schema(OutcomeModel),
        summary="Report the delayed outcome of a mirrored request",
    )
    async def outcomes(request: Request) -> JSONResponse:
        authorise(request)
        body = await _read_limited(request, max_request_bytes)

        def decode() -> tuple[Outcome, bytes]:
            return outcome_from_json(checked("body", body))

        if offload_appends:
            return ack(await run_in_threadpool(ingest.outcome, "http", decode))
        return ack(ingest.outcome("http", decode))

    @app.get("/healthz", summary="Liveness: the process answers")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", summary="Readiness, with every dependency's state")
    async def readyz() -> JSONResponse:
        results = readiness.evaluate()
        ok = all(r.ok for r in results)
        body = {
            "ready": ok,
            "checks": [{"name": r.name, "ok": r.ok, "detail": r.detail} for r in results],
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    def any_role(request: Request) -> None:
        try:
            authority.require(request.headers.get("authorization"), *Role)
        except AuthError as exc:
            metrics.auth_failures.labels("http", type(exc).__name__).inc()
            raise

    @app.get("/metrics", summary="Prometheus metrics (any role)", include_in_schema=False)
    async def prometheus_metrics(request: Request) -> Response:
        any_role(request)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> JSONResponse:
        any_role(request)
        return JSONResponse(app.openapi())

    return app
