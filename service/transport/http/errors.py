"""Domain errors as HTTP replies: the status table and the one error body.

The core's error tree carries no status codes (STYLE.md); this table maps it
at the edge, as `service.transport.grpc.errors` does for gRPC. The body is
``{"error", "field", "message"}`` (`ErrorModel` documents it), built here
once so the ingest fast path and FastAPI's exception handler send the same
bytes.
"""

from __future__ import annotations

import orjson

from service.contract.errors import (
    Conflict,
    ConflictingRequest,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    UnderstudyError,
)

STATUS_BY_ERROR: tuple[tuple[type[UnderstudyError], int], ...] = (
    (PayloadTooLarge, 413),
    (InvalidInput, 400),
    (Unauthenticated, 401),
    (PermissionDenied, 403),
    (NotFound, 404),
    (Conflict, 409),
    (Unavailable, 503),
)


def status_for(exc: UnderstudyError) -> int:
    """The HTTP status of an error: the first table row it is an instance of."""
    for cls, code in STATUS_BY_ERROR:
        if isinstance(exc, cls):
            return code
    return 500


def error_body(exc: UnderstudyError) -> bytes:
    """The JSON error body: which field was wrong (when one was) and the message."""
    field = exc.field if isinstance(exc, InvalidInput | ConflictingRequest) else None
    return orjson.dumps({"error": type(exc).__name__, "field": field, "message": str(exc)})


def error_headers(exc: UnderstudyError) -> dict[str, str]:
    """Headers an error reply needs beyond its content type (RFC 6750 for a missing token)."""
    return {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthenticated) else {}
