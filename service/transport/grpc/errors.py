"""Map the project's error tree to gRPC status codes, at the edge only."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import grpc

from service.contract.errors import (
    Conflict,
    ConflictingRequest,
    InvalidInput,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    UnderstudyError,
)

STATUS_BY_ERROR: tuple[tuple[type[UnderstudyError], grpc.StatusCode], ...] = (
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    # a request_id re-sent with other content: the id is taken (docs/ingest.md, "Identity")
    (ConflictingRequest, grpc.StatusCode.ALREADY_EXISTS),
    (Conflict, grpc.StatusCode.FAILED_PRECONDITION),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
)


def status_for(exc: UnderstudyError) -> grpc.StatusCode:
    """The gRPC status of an error: the first table row it is an instance of."""
    for cls, code in STATUS_BY_ERROR:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


def abort(context: grpc.ServicerContext, exc: UnderstudyError) -> NoReturn:
    """End the call with the mapped status and the error's message."""
    context.abort(status_for(exc), str(exc))
    raise AssertionError("context.abort returned")  # pragma: no cover - abort raises


F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(method: F) -> F:
    """Turn `UnderstudyError` into `context.abort`, so servicers carry no try/except."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except UnderstudyError as exc:
            abort(context, exc)

    return wrapper  # type: ignore[return-value]
