"""POST /v1/mirror/batch and POST /v1/outcomes/batch, on the plain-ASGI ingest path.

A batch body is a `MirrorBatch` / `OutcomeBatch` protobuf
(``Content-Type: application/x-protobuf``, journaled as received) or JSON
(``application/json``: ``{"requests": [<the body of POST /v1/mirror>, ...]}``,
``{"outcomes": [...]}``; `service.transport.http.batch_decode`, journaled as
the protobuf its columns encode to). Served as `ingest_routes` serves the
single routes: the token first (role runtime; 401/403), then the content type
(anything else is 415), the body read with the same hard limit (413) under the
same slow-client deadline (`slow_clients.py`), then `Ingest.mirror_batch`.

The reply (`BatchAckModel`) says what happened to every request: ``status``
(``accepted`` when all were, ``shed`` when some were shed and none rejected,
``rejected`` when any was rejected), ``accepted + shed + rejected`` = the
batch's size, and one ``{"index", "field", "reason", "message"}`` per rejected
request — the same field (bounded, indices dropped), reason code and message
the gRPC `BatchAck` gives. 200 when anything was accepted or shed (or the
batch was empty), 400 when every request was rejected or the batch was refused
whole (``whole_batch``: it could not be read into requests; its one rejection
names the field), 413 when the body is over the limit (also ``whole_batch``).
Every refusal is counted: by ingest per request (``understudy_ingest_total``,
``understudy_ingest_rejections_total``, transport ``http_batch``), a wrong
content type here as one rejection of ``content-type``.

Ingest runs on the thread pool: a 1,024-request batch takes milliseconds to
validate and must not stall the event loop (and every other connection's
slow-client deadline) meanwhile; one hop per batch is cheap next to it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import orjson
from fastapi.concurrency import run_in_threadpool
from google.protobuf.message import DecodeError
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from service.auth import Role, TokenAuthority
from service.contract.errors import (
    AuthError,
    InvalidInput,
    MalformedMessage,
    PayloadTooLarge,
    UnderstudyError,
)
from service.contract.rejections import Refusal, RejectionReason, refusal_of
from service.metrics import ServiceMetrics, field_label
from service.pipeline.ingest import BatchResult, Ingest
from service.transport.batches import (
    MAX_MESSAGE_CHARS,
    decoded_outcomes,
    decoded_requests,
    validator_text,
)
from service.transport.http.batch_decode import decode_json_batch, decode_json_outcomes
from service.transport.http.ingest_routes import Endpoint, Reply, _Body, asgi_chunks, read_limited
from service.wire.batch_codec import DecodedBatch, DecodedOutcomes, batch_to_pb, outcomes_to_pb
from service.wire.understudy.v1 import batch_pb2

HTTP_BATCH = "http_batch"
"""The `transport` label of the batch endpoints."""
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MEDIA_TYPES = (PROTOBUF, JSON)

BatchHandler = Callable[[dict[str, str | None], AsyncIterator[bytes]], Awaitable[Reply]]


class UnsupportedMediaType(InvalidInput):
    """A batch body in a content type the endpoint does not read (HTTP 415)."""


class BatchRejectionModel(BaseModel):
    """One refused request of a batch: its index in the batch, the field (indices
    dropped), a reason code of the allow-list and the validator's message."""

    index: int
    field: str
    reason: str
    message: str


class BatchAckModel(BaseModel):
    """What became of every request of one batch. Never a decision."""

    status: Literal["accepted", "shed", "rejected"]
    accepted: int
    shed: int
    rejected: int
    rejections: list[BatchRejectionModel]
    whole_batch: bool


def media_type(content_type: str | None) -> str | None:
    """The media type of a Content-Type header, lower-cased, parameters dropped."""
    if content_type is None:
        return None
    return content_type.split(";", 1)[0].strip().lower()


def _status(shed: int, rejected: int) -> str:
    if rejected:
        return "rejected"
    return "shed" if shed else "accepted"


def _rejection(index: int, field: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "index": index,
        "field": field_label(field),
        "reason": reason,
        "message": message[:MAX_MESSAGE_CHARS],
    }


def batch_reply(result: BatchResult) -> Reply:
    """200 with the batch's ack, or 400 when every request of it was rejected."""
    body = {
        "status": _status(result.shed, result.rejected),
        "accepted": result.accepted,
        "shed": result.shed,
        "rejected": result.rejected,
        "rejections": [
            _rejection(
                r.index,
                r.field,
                RejectionReason(r.reason).value,
                validator_text(r.field, r.message),
            )
            for r in result.rejections  # a loop over the refused requests only
        ],
        "whole_batch": False,
    }
    refused = result.rejected and not (result.accepted or result.shed)
    return Reply(400 if refused else 200, orjson.dumps(body))


def whole_batch_reply(exc: InvalidInput, status: int) -> Reply:
    """A batch refused whole: every request rejected, one rejection naming the field."""
    refusal = refusal_of(exc) or Refusal(exc.field, RejectionReason.INVALID_VALUE)
    n = getattr(exc, "n_sent", 0)  # set by the decoders where the count could be read
    body = {
        "status": "rejected",
        "accepted": 0,
        "shed": 0,
        "rejected": n if isinstance(n, int) and n > 0 else 0,
        "rejections": [
            _rejection(
                0, refusal.field, refusal.reason.value, validator_text(exc.field, exc.problem)
            )
        ],
        "whole_batch": True,
    }
    return Reply(status, orjson.dumps(body))


class BatchRoutes:
    """The two batch endpoints, callable from FastAPI or straight from ASGI."""

    def __init__(
        self,
        ingest: Ingest,
        authority: TokenAuthority,
        metrics: ServiceMetrics,
        max_request_bytes: int,
    ) -> None:
        self._ingest = ingest
        self._authority = authority
        self._metrics = metrics
        self._limit = max_request_bytes
        self.asgi: dict[str, Endpoint] = {
            "/v1/mirror/batch": _asgi(self.mirror_batch),
            "/v1/outcomes/batch": _asgi(self.outcomes_batch),
        }

    async def mirror_batch(
        self, headers: dict[str, str | None], chunks: AsyncIterator[bytes]
    ) -> Reply:
        """Authorise, read, decode, validate, journal and ack one batch of requests."""
        limits = self._ingest.limits

        def decode_protobuf(body: bytes) -> tuple[DecodedBatch, bytes]:
            msg = batch_pb2.MirrorBatch()
            _parse(msg, body)
            return decoded_requests(msg, limits), body

        def decode_json(body: bytes) -> tuple[DecodedBatch, bytes]:
            decoded = decode_json_batch(body, limits)
            return decoded, batch_to_pb(decoded.batch).SerializeToString()

        return await self._serve(
            "mirror", headers, chunks, decode_protobuf, decode_json, self._ingest.mirror_batch
        )

    async def outcomes_batch(
        self, headers: dict[str, str | None], chunks: AsyncIterator[bytes]
    ) -> Reply:
        """Authorise, read, decode, validate, journal and ack one batch of outcomes."""
        limits = self._ingest.limits

        def decode_protobuf(body: bytes) -> tuple[DecodedOutcomes, bytes]:
            msg = batch_pb2.OutcomeBatch()
            _parse(msg, body)
            return decoded_outcomes(msg, limits), body

        def decode_json(body: bytes) -> tuple[DecodedOutcomes, bytes]:
            decoded = decode_json_outcomes(body, limits)
            return decoded, outcomes_to_pb(decoded.outcomes).SerializeToString()

        return await self._serve(
            "outcome", headers, chunks, decode_protobuf, decode_json, self._ingest.outcome_batch
        )

    async def _serve(
        self,
        kind: str,
        headers: dict[str, str | None],
        chunks: AsyncIterator[bytes],
        decode_protobuf: Callable[[bytes], Any],
        decode_json: Callable[[bytes], Any],
        ingest: Callable[[str, Callable[[], Any]], BatchResult],
    ) -> Reply:
        try:
            self._authorise(headers.get("authorization"))
        except UnderstudyError as exc:
            return Reply.error(exc)
        media = media_type(headers.get("content-type"))
        if media not in MEDIA_TYPES:
            refused = UnsupportedMediaType(
                "content-type",
                f"must be {PROTOBUF} (a {'MirrorBatch' if kind == 'mirror' else 'OutcomeBatch'}) "
                f"or {JSON}, got {(headers.get('content-type') or 'none')[:80]!r}",
            )
            self._metrics.ingest.labels(HTTP_BATCH, kind, "rejected").inc()
            self._metrics.rejections.labels(HTTP_BATCH, kind, field_label(refused.field)).inc()
            return Reply(415, _error_body(refused))
        body = await read_limited(chunks, headers.get("content-length"), self._limit)
        decode_body = decode_protobuf if media == PROTOBUF else decode_json

        def decode() -> Any:
            return decode_body(self._checked(body))

        try:
            result = await run_in_threadpool(ingest, HTTP_BATCH, decode)
        except PayloadTooLarge as exc:  # counted by ingest, per request where known
            return whole_batch_reply(exc, 413)
        except InvalidInput as exc:
            return whole_batch_reply(exc, 400)
        except UnderstudyError as exc:
            return Reply.error(exc)
        return batch_reply(result)

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


def _parse(msg: Any, body: bytes) -> None:
    try:
        msg.ParseFromString(body)
    except DecodeError as exc:
        raise MalformedMessage("body", f"is not a valid protobuf message: {exc}") from exc


def _error_body(exc: InvalidInput) -> bytes:
    return orjson.dumps({"error": type(exc).__name__, "field": exc.field, "message": str(exc)})


_HEADERS = {b"authorization": "authorization", b"content-type": "content-type"}
_HEADERS[b"content-length"] = "content-length"


def _asgi(handler: BatchHandler) -> Endpoint:
    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        headers: dict[str, str | None] = dict.fromkeys(_HEADERS.values())
        for key, value in scope["headers"]:
            name = _HEADERS.get(key)
            if name is not None and headers[name] is None:  # the first one, as `_header`
                headers[name] = value.decode("latin-1")
        reply = await handler(headers, asgi_chunks(receive))
        await reply.send(send)

    return endpoint
