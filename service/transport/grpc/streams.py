"""Cumulative acks for long-lived client streams.

A sync gRPC bidirectional handler is a generator: it can only yield an ack
when it runs. To ack promptly while messages keep arriving, a reader thread
consumes the request iterator and records progress here; the handler's
generator wakes on each change and yields what is new. Under load several
accepted messages collapse into one cumulative ack (fewer ack messages, same
guarantee); shed and rejected messages are announced one by one first.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator

from service.wire.understudy.v1 import shadow_pb2


class StreamProgress:
    """Shared state between a stream's reader thread and its ack generator."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._individual: deque[shadow_pb2.StreamAck] = deque()
        self._through = 0
        self._announced_through = 0
        self.accepted = 0
        self.shed = 0
        self.rejected = 0
        self._finished = False
        self.last_sequence = 0

    def record(self, status: int, sequence: int) -> None:
        """Record the fate of message `sequence` (status: a shadow_pb2.AckStatus value)."""
        with self._cond:
            if status == shadow_pb2.ACK_STATUS_ACCEPTED:
                self.accepted += 1
            elif status == shadow_pb2.ACK_STATUS_SHED:
                self.shed += 1
            else:
                self.rejected += 1
            if status != shadow_pb2.ACK_STATUS_ACCEPTED:
                self._individual.append(self._ack(status, sequence))
            self._through = max(self._through, sequence)
            self._cond.notify()

    def finish(self) -> None:
        """Mark the client's half of the stream as done (or broken)."""
        with self._cond:
            self._finished = True
            self._cond.notify()

    def _ack(self, status: int, sequence: int) -> shadow_pb2.StreamAck:
        return shadow_pb2.StreamAck(
            status=status,  # type: ignore[arg-type]
            sequence=sequence,
            accepted=self.accepted,
            shed=self.shed,
            rejected=self.rejected,
        )

    def acks(self, idle_timeout: float = 1.0) -> Iterator[shadow_pb2.StreamAck]:
        """Yield acks as progress is made, until the reader finishes and all is acked."""
        while True:
            with self._cond:
                while (
                    not self._individual
                    and self._through == self._announced_through
                    and not self._finished
                ):
                    self._cond.wait(idle_timeout)
                pending = list(self._individual)
                self._individual.clear()
                cumulative = None
                if self._through > self._announced_through:
                    cumulative = self._ack(shadow_pb2.ACK_STATUS_ACCEPTED, self._through)
                    self._announced_through = self._through
                finished = self._finished
            yield from pending
            if cumulative is not None:
                yield cumulative
            if finished:
                with self._cond:
                    if not self._individual and self._through == self._announced_through:
                        return
