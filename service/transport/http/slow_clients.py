"""Slow-client protection for uvicorn: a deadline for receiving each request.

uvicorn times out a connection only while it sits idle between requests
(`timeout_keep_alive`). A client that dribbles its headers a byte at a time,
stops half-way through a body, or connects and never speaks holds its
connection — and, mid-body, a handler waiting on it — for as long as it
likes (slow-loris). uvicorn has no option for this, so this protocol adds one
timer: from a connection's first byte of a request (or from its opening) to
the request's last byte, the client has `timeout_keep_alive` seconds — the
same budget uvicorn gives an idle client. When it expires the connection is
closed; a handler reading the body sees the client disconnect (the HTTP app
counts that as a rejected body).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


class RequestDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, plus a deadline on receiving each request in full."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._arm()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE and self.conn.their_state is not h11.SEND_BODY:
            self._disarm()  # received in full (or the connection is failing anyway)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._read_deadline is None:
            self._read_deadline = self.loop.call_later(self.timeout_keep_alive, self._expired)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _expired(self) -> None:
        self._read_deadline = None
        if not self.transport.is_closing():
            log.info(
                "closing an HTTP connection that did not send its request within %s s",
                self.timeout_keep_alive,
            )
            self.transport.close()
