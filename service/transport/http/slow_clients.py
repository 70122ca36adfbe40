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

It is built on uvicorn's httptools protocol (a C parser: ~60 us of CPU per
10-20 KB request against ~150 us for the pure-Python h11 one, measured on the
bare server). httptools buffers a request head without limit, so the bound
that h11 enforced is enforced here: a head still incomplete after
`h11_max_incomplete_event_size` bytes (16 KiB by default) is refused with 400
and the connection closed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024
"""h11's default bound on an incomplete request head, used when the config sets none."""


class RequestDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, plus a deadline on receiving each request in full
    and a bound on the size of a request head."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None
        self._max_head = self.config.h11_max_incomplete_event_size or MAX_HEAD_BYTES
        self._in_request = False  # a request has begun and its last byte has not come
        self._head_open = False  # ... and its head has not been parsed yet
        self._head_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        # A chunk counts toward the head when the head was open before it, or no request
        # was: a chunk that ends one body and starts the next head is not counted, so
        # the bound may be passed by one chunk, never missed.
        counts = self._head_open or not self._in_request
        super().data_received(data)  # the parser callbacks below run in here
        if counts and self._head_open:
            self._head_bytes += len(data)
            if self._head_bytes > self._max_head and not self.transport.is_closing():
                self._head_open = False
                log.info("refusing an HTTP request head over %s bytes", self._max_head)
                self.send_400_response("Request head too large.")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_request = self._head_open = True
        self._head_bytes = 0
        self._arm()  # the first bytes of the next request on a kept-alive connection

    def on_headers_complete(self) -> None:
        self._head_open = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_request = False
        self._disarm()  # received in full

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
