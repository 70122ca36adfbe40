"""Cumulative acks for long-lived client streams.

A sync gRPC bidirectional handler is a generator: it can only yield an ack
when it runs. To ack promptly while messages keep arriving, a reader thread
consumes the request iterator and records progress here; the handler's
generator wakes on each change and yields what is new. Under load several
accepted messages collapse into one cumulative ack (fewer ack messages, same
guarantee); shed and refused messages are announced one by one first, a
refused one with its field and reason code. `rejected` counts both REJECTED and
REPEATED_SEQUENCE acks, so accepted + shed + rejected is what was received.

The wake-up is a byte written to a pipe, not `threading.Condition.notify`: a
notify wakes the generator while the reader still holds the GIL, and when the
scheduler runs the woken thread first, the reader waits for its core back with
the GIL in hand and no Python runs (py-spy put 8-15% of the service's GIL
samples in that `notify`). `os.write` releases the GIL around the syscall, so
the woken generator runs at once. Two descriptors per stream, closed when the
ack generator ends (finished, cancelled or collected).

A stream whose client sends nothing for `idle_close_s` ends its ack generator
with `StreamIdle`, so a client cannot hold a stream (and the server thread
serving it) open for ever without sending (issue 20 item 2).

`AckPipe` is that machinery, whatever the ack message; `StreamProgress` acks
one message per sequence (`StreamAck`), `batch_streams.BatchStreamProgress`
one batch per sequence (`BatchStreamAck`).
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from typing import Any, Generic, Protocol, TypeVar

from service.wire.understudy.v1 import shadow_pb2

_ACCEPTED = shadow_pb2.ACK_STATUS_ACCEPTED
_SHED = shadow_pb2.ACK_STATUS_SHED

A = TypeVar("A")

Opened = tuple[int, int, Callable[[], Any]]
"""An opened stream message: its sequence, how many requests it holds (1, or a
batch's stated count; 0 where unknown) and the thunk that ingests it."""


class StreamIdle(Exception):
    """The client sent nothing for the stream's idle limit."""

    def __init__(self, idle_s: float, limit_s: float) -> None:
        super().__init__(f"stream idle for {idle_s:.1f} s (limit {limit_s:g} s)")
        self.idle_s = idle_s
        self.limit_s = limit_s


MAX_UNSENT_ACKS = 64
"""Individual (refusal) acks a stream may hold unsent before the server stops reading it."""


class AckPipe(Generic[A]):
    """Shared state between a stream's reader thread and its ack generator.

    Subclasses record each message's fate under `_lock` and hand it to
    `_advance_locked` (an individual ack, or None, and the sequence handled);
    `_cumulative_locked` builds the cumulative ack for everything up to
    `_through`. `idle_close_s`: end the ack generator with `StreamIdle` once
    nothing has arrived (or been recorded) for that long; None never closes.
    """

    def __init__(
        self, idle_close_s: float | None = None, max_unsent: int = MAX_UNSENT_ACKS
    ) -> None:
        self._lock = threading.Lock()
        self._individual: deque[A] = deque()
        self._max_unsent = max_unsent
        self._room = threading.Condition(self._lock)  # the reader waits here for acks to go
        self._reader_waiting = False
        self._through = 0
        self._announced_through = 0
        self._finished = False
        self._waiting = False  # the ack generator sleeps on the pipe: only then wake it
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poll = select.poll()  # not select(): no FD_SETSIZE limit on busy servers
        self._poll.register(self._wake_r, select.POLLIN)
        self._closed = False
        self.last_sequence = 0
        self._idle_close_s = idle_close_s
        self._last_activity = time.monotonic()

    def touch(self) -> None:
        """A message arrived: the stream is not idle (the reader calls it per message)."""
        self._last_activity = time.monotonic()

    def _advance_locked(self, individual: A | None, sequence: int) -> None:
        """Under `_lock`: queue `individual` (if any), move the cumulative mark, wake."""
        self._last_activity = time.monotonic()
        if individual is not None:
            self._individual.append(individual)
        if sequence > self._through:
            self._through = sequence
        # A generator that is busy sending looks at the new state before it sleeps
        # again (it checks under this lock), so only a sleeping one needs waking,
        # and only once: records that arrive before it runs ride on that wake-up.
        if self._waiting:
            self._waiting = False
            self._wake_locked()

    def _cumulative_locked(self) -> A:
        """Under `_lock`: the cumulative ack for every sequence <= `_through`."""
        raise NotImplementedError

    def wait_for_room(self, timeout_s: float) -> bool:
        """Before reading the next message: wait while `max_unsent` individual acks are
        queued and not taken by the ack generator. False when none was taken for
        `timeout_s` (the client sends but does not read its acks: the caller ends the
        stream).

        Why: an ack the client does not read stays in this queue, and a refused batch's
        ack names every refused request (~180 B each), so a client that only sends could
        grow the server without bound (found by tests/hostile/test_batch_slow_clients.py).
        Not reading holds the client back through gRPC's flow control instead.
        """
        with self._lock:
            deadline = time.monotonic() + timeout_s
            while len(self._individual) >= self._max_unsent and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._reader_waiting = True
                self._room.wait(left)
            self._reader_waiting = False
            return True

    def finish(self) -> None:
        """Mark the client's half of the stream as done (or broken)."""
        with self._lock:
            self._finished = True
            self._wake_locked()

    def _wake_locked(self) -> None:
        if not self._closed:  # under the lock: a closed descriptor's number may be reused
            with contextlib.suppress(BlockingIOError):  # full pipe: a wake-up is pending
                os.write(self._wake_w, b"\0")

    def _sleep(self, timeout: float) -> None:
        """Wait for a wake-up byte (or the timeout), then drain the pipe."""
        if self._poll.poll(timeout * 1000.0):
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 4096)

    def acks(self, poll_s: float = 1.0) -> Generator[A, None, None]:
        """Yield acks as progress is made, until the reader finishes and all is acked.

        `poll_s` bounds one sleep (a lost wake-up costs at most that); raises
        `StreamIdle` when the idle limit passes with nothing new.
        """
        try:
            yield from self._acks(poll_s)
        finally:
            self._close()

    def _sleep_budget(self, poll_s: float) -> float:
        """How long to sleep next; raises `StreamIdle` when the idle limit has passed."""
        if self._idle_close_s is None:
            return poll_s
        idle_s = time.monotonic() - self._last_activity
        if idle_s >= self._idle_close_s:
            raise StreamIdle(idle_s, self._idle_close_s)
        return min(poll_s, self._idle_close_s - idle_s)

    def _acks(self, poll_s: float) -> Iterator[A]:
        while True:
            self._lock.acquire()
            try:
                while (
                    not self._individual
                    and self._through == self._announced_through
                    and not self._finished
                ):
                    budget = self._sleep_budget(poll_s)  # raises under the lock: released below
                    self._waiting = True
                    self._lock.release()
                    try:
                        self._sleep(budget)
                    finally:
                        self._lock.acquire()
                        self._waiting = False
                pending = list(self._individual)
                self._individual.clear()
                if self._reader_waiting:  # rare: only a reader held back by unread acks
                    self._room.notify()
                cumulative = None
                if self._through > self._announced_through:
                    cumulative = self._cumulative_locked()
                    self._announced_through = self._through
                finished = self._finished
            finally:
                self._lock.release()
            yield from pending
            if cumulative is not None:
                yield cumulative
            if finished:
                with self._lock:
                    if not self._individual and self._through == self._announced_through:
                        return

    def _close(self) -> None:
        """Release the wake-up pipe once the generator is done; later records still count."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._room.notify_all()  # a reader held back has nobody left to wait for
            os.close(self._wake_r)
            os.close(self._wake_w)


class StreamProgress(AckPipe[shadow_pb2.StreamAck]):
    """Progress of a stream of single messages, acked by `StreamAck`."""

    def __init__(self, idle_close_s: float | None = None) -> None:
        super().__init__(idle_close_s)
        self.accepted = 0
        self.shed = 0
        self.rejected = 0

    def record(self, status: int, sequence: int, field: str = "", reason: str = "") -> None:
        """Record the fate of message `sequence` (status: a shadow_pb2.AckStatus value).

        `field` and `reason` go on the individual ack of a refused message (the
        caller bounds the field and takes the reason from the allow-list,
        service.contract.rejections); accepted and shed messages carry neither.
        """
        with self._lock:
            individual = None
            if status == _ACCEPTED:
                self.accepted += 1
            else:
                if status == _SHED:
                    self.shed += 1
                else:
                    self.rejected += 1
                individual = self._ack(status, sequence, field, reason)
            self._advance_locked(individual, sequence)

    def _cumulative_locked(self) -> shadow_pb2.StreamAck:
        return self._ack(_ACCEPTED, self._through)

    def _ack(
        self, status: int, sequence: int, field: str = "", reason: str = ""
    ) -> shadow_pb2.StreamAck:
        return shadow_pb2.StreamAck(
            status=status,  # type: ignore[arg-type]
            sequence=sequence,
            accepted=self.accepted,
            shed=self.shed,
            rejected=self.rejected,
            field=field,
            reason=reason,
        )


class Lane(Protocol[A]):
    """One kind of stream as the servicer's driver sees it (`servicer._consume_one`)."""

    @property
    def kind(self) -> str:
        """`mirror` or `outcome`: the `kind` label it is counted under."""
        ...

    @property
    def progress(self) -> AckPipe[A]:
        """The stream's ack state."""
        ...

    def open(self, raw: bytes) -> Opened:
        """Parse one message (raises `InvalidInput` when it cannot be read)."""
        ...

    def accept(self, sequence: int, result: Any) -> None:
        """Record what ingest made of message `sequence`."""
        ...

    def refuse(
        self,
        sequence: int,
        exc: Any,
        size: int,
        *,
        counted: bool,
        status: int = shadow_pb2.ACK_STATUS_REJECTED,
    ) -> None:
        """Ack message `sequence` (holding `size` requests) refused for `exc`; count it
        unless ingest already did (`counted`)."""
        ...
