"""One stream lane: a bounded buffer of sequenced messages and their ack state.

Two lanes per client (mirrors, outcomes) share nothing but the channel. The
lane is pure bookkeeping under one lock, so the caller's `offer` costs a lock
and a deque append; the network lives in `MirrorClient`'s thread.

Sequence numbers are per lane and never reused. A message stays in the lane
from `offer` until a cumulative ack covers it; after a broken stream every
unacked message is sent again, in order, on the next stream (the service
deduplicates by request id downstream, so a resend never doubles a row).
`resent` counts a message once, when it first goes out again: a message that
takes several reconnects to be acked (each failed attempt takes it onto its
stream too) is still one resent message, so `resent` <= `offered`.

A refused message's ack names the field and a reason code (docs/ingest.md):
rejections are counted by reason when the cumulative ack retires them. Two acks
refer to no message this lane holds -- `REPEATED_SEQUENCE` (the stream saw a
sequence that did not increase) and `REJECTED` under sequence 0 (a message the
server could not read) -- so they never change a sent message's fate; they are
counted as `protocol_errors`, which this lane, numbering from 1 and never
reusing a number, should never see.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from service.client.guarded import Guarded

ACCEPTED, SHED, REJECTED, REPEATED_SEQUENCE = 1, 2, 3, 4  # understudy.v1.AckStatus values
NO_SEQUENCE = 0  # the ack sequence of a message the server could not read


def names_no_message(status: int, sequence: int) -> bool:
    """Whether an ack concerns no message a lane sent: a protocol error, never a fate."""
    return status == REPEATED_SEQUENCE or (status == REJECTED and sequence == NO_SEQUENCE)


@dataclass(frozen=True)
class LaneStats:
    """Counters of one lane; offered == delivered + dropped + in_flight at all times."""

    offered: int
    accepted: int
    shed: int
    rejected: int
    dropped: int
    in_flight: int
    resent: int  # requests that went out again after a broken stream, each counted once
    protocol_errors: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)

    @property
    def delivered(self) -> int:
        """Messages the service acknowledged, whatever it did with them."""
        return self.accepted + self.shed + self.rejected


class Lane(Guarded):
    """Bounded, sequenced, resendable buffer of one kind of message."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self._capacity = capacity
        self._unsent: deque[tuple[int, Any, float]] = deque()
        self._sent: deque[tuple[int, Any, float]] = deque()
        self._not_accepted: dict[int, tuple[int, str]] = {}
        self._next_seq = 1
        # messages through `_requeued_through` were on a broken stream; those through
        # `_resent_through` have been counted as resent (both in sequence order)
        self._requeued_through = self._resent_through = 0
        self._offered = self._accepted = self._shed = self._rejected = 0
        self._dropped = self._resent = self._protocol_errors = 0
        self._reasons: Counter[str] = Counter()

    def offer(self, message: Any) -> bool:
        """Buffer `message`; False (and counted as dropped) when the buffer is full."""
        with self._cond:
            self._offered += 1
            if len(self._unsent) + len(self._sent) >= self._capacity:
                self._dropped += 1
                return False
            self._unsent.append((self._next_seq, message, time.monotonic()))
            self._next_seq += 1
            self._cond.notify()
            return True

    def next_to_send(
        self, timeout: float, live: Callable[[], bool] | None = None
    ) -> tuple[int, Any] | None:
        """The oldest unsent message (moved to sent), or None after `timeout`.

        `live` says whether the stream asking is still open, and is asked under the
        lane's lock after any wait: a stream that broke while its sender waited here
        must not take a message into `sent` after `requeue_unacked` has run, or the
        message would sit there, unsent, until the ack timeout.
        """
        with self._cond:
            if not self._unsent:
                self._cond.wait(timeout)
            if not self._unsent or (live is not None and not live()):
                return None
            item = self._unsent.popleft()
            if self._resent_through < item[0] <= self._requeued_through:
                self._resent += 1
                self._resent_through = item[0]
            self._sent.append((item[0], item[1], time.monotonic()))
            return item[0], item[1]

    def acknowledge(self, status: int, sequence: int, reason: str = "") -> None:
        """Apply one StreamAck: individual non-accepted marks, or a cumulative ack.

        `reason` is the ack's reason code, kept for a rejected message until the
        cumulative ack retires it; acks about no message of this lane count as
        protocol errors and leave every sent message's fate alone.
        """
        with self._cond:
            if names_no_message(status, sequence):
                self._protocol_errors += 1
                return
            if status != ACCEPTED:
                self._not_accepted[sequence] = (status, reason)
                return
            while self._sent and self._sent[0][0] <= sequence:
                seq = self._sent.popleft()[0]
                fate, why = self._not_accepted.pop(seq, (ACCEPTED, ""))
                if fate == SHED:
                    self._shed += 1
                elif fate == REJECTED:
                    self._rejected += 1
                    self._reasons[why or "unspecified"] += 1
                else:
                    self._accepted += 1
            self._cond.notify_all()

    def requeue_unacked(self) -> None:
        """After a broken stream: everything sent but not acked goes out again first."""
        with self._cond:
            if self._sent:  # counted as resent when they go out again (`next_to_send`)
                self._requeued_through = max(self._requeued_through, self._sent[-1][0])
            self._unsent.extendleft(reversed(self._sent))
            self._sent.clear()
            self._not_accepted.clear()
            self._cond.notify_all()

    def _busy(self) -> bool:
        return bool(self._unsent or self._sent)

    def has_work(self) -> bool:
        """Whether any message is buffered or in flight (a lazy stream opens only then)."""
        with self._cond:
            return self._busy()

    def oldest_unacked_age(self) -> float:
        """Seconds the oldest sent-but-unacked message has waited (0 if none)."""
        with self._cond:
            return time.monotonic() - self._sent[0][2] if self._sent else 0.0

    def abandon(self) -> None:
        """At close: count what could not be delivered as dropped."""
        with self._cond:
            self._dropped += len(self._unsent) + len(self._sent)
            self._unsent.clear()
            self._sent.clear()
            self._cond.notify_all()

    def stats(self) -> LaneStats:
        """A consistent snapshot of the counters."""
        with self._cond:
            return LaneStats(
                offered=self._offered,
                accepted=self._accepted,
                shed=self._shed,
                rejected=self._rejected,
                dropped=self._dropped,
                in_flight=len(self._unsent) + len(self._sent),
                resent=self._resent,
                protocol_errors=self._protocol_errors,
                rejected_by_reason=dict(self._reasons),
            )
