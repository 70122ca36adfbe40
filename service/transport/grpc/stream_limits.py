"""Admission for long-lived gRPC streams: bounded per connection, per principal, in total.

Why: the sync gRPC server runs a stream's handler on a thread of its pool for the
stream's whole life. With one fixed pool, sixteen streams that send nothing held
every thread, and unary calls and new clients got nothing, uncounted (issue 20
item 2). Here every streaming RPC (mirror, outcome, health watch, reflection) is
admitted only while its connection, its principal and the server are under their
limits, and the pool is sized to hold every admitted stream *plus* the unary
workers (see `server.build_grpc_server`), so a client reaches a limit, counted
and answered RESOURCE_EXHAUSTED naming it, never the end of the pool.

Admission runs inside the handler (on a pool thread), never in the interceptor
call itself: that runs on gRPC's single polling thread, which must not hash tokens.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from service.metrics import ServiceMetrics

REASONS = ("connection", "principal", "total")


@dataclass(frozen=True)
class StreamLimits:
    """Bounds on open streams and the idle timeout of mirror/outcome streams."""

    total: int = 64
    per_principal: int = 32
    per_connection: int = 8
    idle_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("total", "per_principal", "per_connection"):
            if getattr(self, name) < 1:
                raise ValueError(f"stream limit `{name}` must be at least 1")
        if self.idle_timeout_s <= 0:
            raise ValueError("`idle_timeout_s` must be positive")


class StreamRefused(Exception):
    """A stream over one of the limits; `reason` is one of `REASONS`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class StreamAdmission:
    """Counts open streams per connection and per principal; refuses over the limits."""

    def __init__(self, limits: StreamLimits, metrics: ServiceMetrics) -> None:
        self.limits = limits
        self._metrics = metrics
        self._lock = threading.Lock()
        self._open = 0
        self._by_connection: Counter[str] = Counter()
        self._by_principal: Counter[str] = Counter()
        for reason in REASONS:  # every series exists from the start, at 0
            metrics.grpc_streams_refused.labels(reason)

    @property
    def open(self) -> int:
        """Streams admitted and not yet ended."""
        return self._open

    def _refusal(self, connection: str, principal: str) -> StreamRefused | None:
        limits = self.limits
        if self._by_connection[connection] >= limits.per_connection:
            return StreamRefused(
                "connection",
                f"too many open streams on this connection: the limit is "
                f"{limits.per_connection} (UNDERSTUDY_GRPC_MAX_STREAMS_PER_CONNECTION)",
            )
        if self._by_principal[principal] >= limits.per_principal:
            return StreamRefused(
                "principal",
                f"too many open streams for principal `{principal}`: the limit is "
                f"{limits.per_principal} (UNDERSTUDY_GRPC_MAX_STREAMS_PER_PRINCIPAL)",
            )
        if self._open >= limits.total:
            return StreamRefused(
                "total",
                f"too many open streams on this server: the limit is {limits.total} "
                "(UNDERSTUDY_GRPC_MAX_STREAMS); retry later",
            )
        return None

    def admit(self, connection: str, principal: str) -> None:
        """Count one more open stream, or raise `StreamRefused` (counted) over a limit.

        Every admit that returns is matched by one `release` with the same keys.
        """
        with self._lock:
            refused = self._refusal(connection, principal)
            if refused is None:
                self._open += 1
                self._by_connection[connection] += 1
                self._by_principal[principal] += 1
        if refused is not None:
            self._metrics.grpc_streams_refused.labels(refused.reason).inc()
            raise refused
        self._metrics.grpc_streams_open.inc()

    def release(self, connection: str, principal: str) -> None:
        """The stream admitted for these keys has ended."""
        with self._lock:
            self._open -= 1
            _release(self._by_connection, connection)
            _release(self._by_principal, principal)
        self._metrics.grpc_streams_open.dec()


def _release(counts: Counter[str], key: str) -> None:
    """Decrement, dropping keys at zero so memory stays bounded by what is open."""
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]


class StreamAdmissionInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Wraps every streaming handler of the server in `StreamAdmission` admit/release.

    `principal_of(context)` names who is calling (a token's principal, or a fixed
    name for callers without a valid token, who then share one principal's limit).
    """

    def __init__(
        self,
        admission: StreamAdmission,
        principal_of: Callable[[grpc.ServicerContext], str],
    ) -> None:
        self._admission = admission
        self._principal_of = principal_of
        self._lock = threading.Lock()
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        """Unary handlers pass unchanged; streaming ones are wrapped (cached per method)."""
        handler = continuation(handler_call_details)
        if handler is None or not (handler.request_streaming or handler.response_streaming):
            return handler
        method = handler_call_details.method
        with self._lock:
            cached = self._wrapped.get(method)
            if cached is None or cached[0] is not handler:
                cached = (handler, self._wrap(handler))
                self._wrapped[method] = cached  # known methods only: bounded
        return cached[1]

    def _wrap(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if handler.request_streaming and handler.response_streaming:
            behavior, factory = handler.stream_stream, grpc.stream_stream_rpc_method_handler
        elif handler.response_streaming:
            behavior, factory = handler.unary_stream, grpc.unary_stream_rpc_method_handler
        else:
            return grpc.stream_unary_rpc_method_handler(
                self._admitted_unary_response(handler.stream_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return factory(
            self._admitted_stream(behavior),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _admitted_stream(self, behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """A generator: admitted on the first pull, released when it ends however it ends."""

        def admitted(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            connection, principal = context.peer(), self._principal_of(context)
            try:
                self._admission.admit(connection, principal)
            except StreamRefused as exc:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            try:
                yield from behavior(request, context)
            finally:
                self._admission.release(connection, principal)

        return admitted

    def _admitted_unary_response(
        self, behavior: Callable[[Any, Any], Any]
    ) -> Callable[[Any, Any], Any]:
        """Client-streaming calls hold a thread while they read: admitted the same way."""

        def admitted(requests: Any, context: grpc.ServicerContext) -> Any:
            connection, principal = context.peer(), self._principal_of(context)
            try:
                self._admission.admit(connection, principal)
            except StreamRefused as exc:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            try:
                return behavior(requests, context)
            finally:
                self._admission.release(connection, principal)

        return admitted
