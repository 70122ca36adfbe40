"""POST /v1/mirror and POST /v1/outcomes as plain ASGI: the ingest hot path.

Runtime mirrors every placement request, so this path is paid per request:
FastAPI's routing, dependency solving, request object and middleware cost
~40 us of a budget of a few hundred (measured, benchmarks/results). Here a
request is served straight from the ASGI scope: check the token, read the
body with a hard limit, decode (`service.transport.http.decode`), hand it to
`Ingest`, and send a pre-encoded JSON ack. `app.py` still declares the two
routes to FastAPI, with the same handlers, so the OpenAPI document describes
them and an app built with ``fast_ingest=False`` serves them the slow way
(tests compare the two replies byte for byte).

Refusals are the FastAPI app's: the status from `errors.STATUS_BY_ERROR`, the
body `{"error", "field", "message"}`, every one counted (auth failures by
reason, rejected bodies by field through `Ingest`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import orjson
from fastapi.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from service.auth import Role, TokenAuthority
from service.contract import MirrorRequest, Outcome
from service.contract.errors import AuthError, InvalidInput, PayloadTooLarge, UnderstudyError
from service.metrics import ServiceMetrics
from service.pipeline.ingest import Ingest, IngestResult
from service.transport.http.decode import mirror_from_json, outcome_from_json
from service.transport.http.errors import error_body, error_headers, status_for

Endpoint = Callable[[Scope, Receive, Send], Awaitable[None]]
_JSON = (b"content-type", b"application/json")


@dataclass(frozen=True, slots=True)
class Reply:
    """A whole HTTP reply: status, JSON body and any extra headers."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def error(cls, exc: UnderstudyError) -> Reply:
        """The refusal for `exc`, as every route of the app words it."""
        return cls(status_for(exc), error_body(exc), tuple(error_headers(exc).items()))

    async def send(self, send: Send) -> None:
        """Send this reply over ASGI."""
        headers = [_JSON, (b"content-length", str(len(self.body)).encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in self.headers]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})


@dataclass(frozen=True, slots=True)
class _Body:
    """What was read of a request body, and why reading stopped early, if it did."""

    data: bytes
    too_large: bool = False
    cut_short: bool = False


async def read_limited(chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> _Body:
    """Read at most `limit + 1` bytes: enough to know the body is too large."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return _Body(b"", too_large=True)
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in chunks:
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                return _Body(b"", too_large=True)
    except ClientDisconnect:  # went away, or cut off by the read deadline (slow_clients.py)
        return _Body(b"".join(parts), cut_short=True)
    return _Body(parts[0] if len(parts) == 1 else b"".join(parts))


async def asgi_chunks(receive: Receive) -> AsyncIterator[bytes]:
    """The body's chunks from ASGI `receive`; a disconnect raises as Starlette's does."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


class IngestRoutes:
    """The two ingest endpoints, callable from FastAPI or straight from ASGI."""

    def __init__(
        self,
        ingest: Ingest,
        authority: TokenAuthority,
        metrics: ServiceMetrics,
        max_request_bytes: int,
        offload_appends: bool = False,
    ) -> None:
        """`offload_appends` runs ingest in the thread pool: needed when every append
        fsyncs (journal_fsync=always), which would otherwise stall the event loop."""
        self._ingest = ingest
        self._authority = authority
        self._metrics = metrics
        self._limit = max_request_bytes
        self._offload = offload_appends
        self.asgi: dict[str, Endpoint] = {
            "/v1/mirror": self._asgi(self.mirror),
            "/v1/outcomes": self._asgi(self.outcomes),
        }

    async def mirror(
        self, authorization: str | None, length: str | None, chunks: AsyncIterator[bytes]
    ) -> Reply:
        """Authorise, read, decode, journal and ack one mirrored request."""
        try:
            self._authorise(authorization)
            body = await read_limited(chunks, length, self._limit)

            def decode() -> tuple[MirrorRequest, bytes]:
                return mirror_from_json(self._checked(body))

            if self._offload:
                result = await run_in_threadpool(
                    self._ingest.mirror, "http", decode, canonical=True
                )
            else:
                result = self._ingest.mirror("http", decode, canonical=True)
        except UnderstudyError as exc:
            return Reply.error(exc)
        return _ack(result)

    async def outcomes(
        self, authorization: str | None, length: str | None, chunks: AsyncIterator[bytes]
    ) -> Reply:
        """Authorise, read, decode, journal and ack one outcome report."""
        try:
            self._authorise(authorization)
            body = await read_limited(chunks, length, self._limit)

            def decode() -> tuple[Outcome, bytes]:
                return outcome_from_json(self._checked(body))

            if self._offload:
                result = await run_in_threadpool(self._ingest.outcome, "http", decode)
            else:
                result = self._ingest.outcome("http", decode)
        except UnderstudyError as exc:
            return Reply.error(exc)
        return _ack(result)

    def _asgi(
        self,
        handler: Callable[[str | None, str | None, AsyncIterator[bytes]], Awaitable[Reply]],
    ) -> Endpoint:
        async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
            reply = await handler(
                _header(scope, b"authorization"),
                _header(scope, b"content-length"),
                asgi_chunks(receive),
            )
            await reply.send(send)

        return endpoint

    def _authorise(self, authorization: str | None) -> None:
        try:
            self._authority.require(authorization, Role.RUNTIME)
        except AuthError as exc:
            self._metrics.auth_failures.labels("http", type(exc).__name__).inc()
            raise

    def _checked(self, body: _Body) -> bytes:
        if body.too_large:
            raise PayloadTooLarge("body", f"exceeds the limit of {self._limit} bytes")
        if body.cut_short:
            raise InvalidInput(
                "body", f"ended after {len(body.data)} bytes: the client went away or was too slow"
            )
        return body.data


def _ack(result: IngestResult) -> Reply:
    body = {"status": result.status.value, "request_id": result.request_id}
    return Reply(202, orjson.dumps(body))
