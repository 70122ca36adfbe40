"""The HTTP app: POST /v1/mirror, POST /v1/outcomes, /healthz, /readyz, /metrics.

The two ingest routes are served by `IngestRoutes` straight from ASGI, ahead
of FastAPI's routing (`HttpApp.__call__`): bodies are read with a hard size
limit and decoded by msgspec, with the pydantic models wording refusals
(`service.transport.http.decode`). FastAPI still declares both routes, with
the same handlers, so the OpenAPI document (``/openapi.json``) describes the
bodies from the same pydantic models. Refusals carry
`{"error", "field", "message"}` with a status from `STATUS_BY_ERROR`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import Receive, Scope, Send

from service import __version__
from service.auth import Role, TokenAuthority
from service.contract.errors import AuthError, UnderstudyError
from service.metrics import ServiceMetrics
from service.pipeline.ingest import Ingest
from service.readiness import Readiness
from service.transport.http.batch_routes import JSON, PROTOBUF, BatchAckModel, BatchRoutes
from service.transport.http.errors import (
    STATUS_BY_ERROR,
    error_body,
    error_headers,
    status_for,
)
from service.transport.http.ingest_routes import Endpoint, IngestRoutes, Reply
from service.transport.http.models import AckModel, ErrorModel, MirrorRequestModel, OutcomeModel

__all__ = ["STATUS_BY_ERROR", "HttpApp", "create_http_app", "status_for"]

_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorModel} for code in (400, 401, 403, 413)
}
_BATCH_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": BatchAckModel, "description": "every request rejected, or the batch whole"},
    413: {"model": BatchAckModel, "description": "over UNDERSTUDY_MAX_REQUEST_BYTES"},
    401: {"model": ErrorModel},
    403: {"model": ErrorModel},
    415: {"model": ErrorModel, "description": f"not {PROTOBUF} or {JSON}"},
}


class HttpApp(FastAPI):
    """FastAPI, except that `fast_routes` (POST, by exact path) are served before routing.

    They skip FastAPI's middleware stack as well: add no middleware that the
    ingest routes would need.
    """

    fast_routes: Mapping[str, Endpoint] = MappingProxyType({})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.fast_routes.get(scope["path"])
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


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


def _batch_body_schema(
    key: str, row: type[MirrorRequestModel] | type[OutcomeModel]
) -> dict[str, Any]:
    """A batch body: protobuf (MirrorBatch / OutcomeBatch) or JSON rows of the single body."""
    schema = row.model_json_schema()
    rows = _inline_refs(schema, schema.get("$defs", {}))
    message = "MirrorBatch" if key == "requests" else "OutcomeBatch"
    return {
        "requestBody": {
            "required": True,
            "content": {
                JSON: {
                    "schema": {
                        "type": "object",
                        "required": [key],
                        "properties": {key: {"type": "array", "items": rows}},
                        "additionalProperties": False,
                    }
                },
                PROTOBUF: {
                    "schema": {
                        "type": "string",
                        "format": "binary",
                        "description": f"understudy.v1.{message} (batch.proto)",
                    }
                },
            },
        }
    }


def create_http_app(
    ingest: Ingest,
    authority: TokenAuthority,
    metrics: ServiceMetrics,
    readiness: Readiness,
    max_request_bytes: int,
    offload_appends: bool = False,
    fast_ingest: bool = True,
) -> HttpApp:
    """Build the app around the shared ingest engine.

    `offload_appends` runs ingest in the thread pool: needed when every append
    fsyncs (journal_fsync=always), which would otherwise stall the event loop.
    `fast_ingest=False` leaves the ingest routes to FastAPI's routing (same
    handlers, same replies; slower): for tests that compare the two.
    """
    # The generated docs routes are replaced by token-checked ones below: every
    # endpoint but liveness and readiness needs a token.
    app = HttpApp(
        title="Understudy",
        version=__version__,
        description="Shadow evaluation of placement policies. Acks never carry a decision.",
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    routes = IngestRoutes(ingest, authority, metrics, max_request_bytes, offload_appends)
    batches = BatchRoutes(ingest, authority, metrics, max_request_bytes)
    if fast_ingest:
        app.fast_routes = MappingProxyType(routes.asgi | batches.asgi)

    @app.exception_handler(UnderstudyError)
    async def _on_error(_: Request, exc: UnderstudyError) -> Response:
        return Response(
            error_body(exc),
            status_code=status_for(exc),
            headers=error_headers(exc),
            media_type="application/json",
        )

    def respond(reply: Reply) -> Response:
        return Response(
            reply.body,
            status_code=reply.status,
            headers=dict(reply.headers),
            media_type="application/json",
        )

    @app.post(
        "/v1/mirror",
        response_model=AckModel,
        status_code=202,
        responses=_ERROR_RESPONSES,
        openapi_extra=_body_schema(MirrorRequestModel),
        summary="Mirror a placement request (acked once journaled; no decision returned)",
    )
    async def mirror(request: Request) -> Response:
        headers = request.headers
        return respond(
            await routes.mirror(
                headers.get("authorization"), headers.get("content-length"), request.stream()
            )
        )

    @app.post(
        "/v1/outcomes",
        response_model=AckModel,
        status_code=202,
        responses=_ERROR_RESPONSES,
        openapi_extra=_body_schema(OutcomeModel),
        summary="Report the delayed outcome of a mirrored request",
    )
    async def outcomes(request: Request) -> Response:
        headers = request.headers
        return respond(
            await routes.outcomes(
                headers.get("authorization"), headers.get("content-length"), request.stream()
            )
        )

    def batch_headers(request: Request) -> dict[str, str | None]:
        return {
            k: request.headers.get(k) for k in ("authorization", "content-type", "content-length")
        }

    @app.post(
        "/v1/mirror/batch",
        response_model=BatchAckModel,
        status_code=200,
        responses=_BATCH_RESPONSES,
        openapi_extra=_batch_body_schema("requests", MirrorRequestModel),
        summary="Mirror a batch of placement requests (each acked or refused by index)",
    )
    async def mirror_batch(request: Request) -> Response:
        return respond(await batches.mirror_batch(batch_headers(request), request.stream()))

    @app.post(
        "/v1/outcomes/batch",
        response_model=BatchAckModel,
        status_code=200,
        responses=_BATCH_RESPONSES,
        openapi_extra=_batch_body_schema("outcomes", OutcomeModel),
        summary="Report the outcomes of a batch of mirrored requests",
    )
    async def outcomes_batch(request: Request) -> Response:
        return respond(await batches.outcomes_batch(batch_headers(request), request.stream()))

    @app.get("/healthz", summary="Liveness: the process answers")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}  # touches nothing: no database, no disk, no lock

    @app.get("/readyz", summary="Readiness, with every dependency's state")
    async def readyz() -> JSONResponse:
        # The checks run on the readiness thread, never on this event loop (a check that
        # waited here on a frozen database stalled every ack). This awaits the next round,
        # so a change made before the request shows; a round ends within the checks'
        # bounds (the one in progress, then ours), and the hang guard falls back to the
        # latest round.
        try:
            results = await asyncio.wait_for(
                asyncio.wrap_future(readiness.next_round()), 2 * readiness.round_bound_s + 0.5
            )
        except TimeoutError:
            results = readiness.snapshot()
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
