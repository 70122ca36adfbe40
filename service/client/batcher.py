"""One batching lane: requests in, sequenced batches out, per-batch acks, resend by batch.

The caller's `offer` costs a lock and a deque append, as in `Lane`: everything
that costs more (reading a protobuf request into a contract object, building
the columns, encoding the `MirrorBatch`) runs on the lane's sender thread, in
`next_batch`. A batch is cut when it holds `max_requests` requests, when its
encoded message would pass `max_bytes`, or `linger_s` after its first request
was offered, whichever comes first (`hurry` cuts at once: `flush` uses it).

The buffer is bounded in *requests*: offered requests wait in `pending`, then
travel in a built batch until the ack that covers it retires them; while
`capacity` requests are held an `offer` returns False and counts a drop.

A batch is one sequence number and one unit of resend. Sequence numbers are
given when a batch goes onto a stream (strictly increasing over the lane's
life, so a resend gets a new, higher number: the service tracks sequences per
stream only, docs/client.md); after a broken stream every sent-but-unretired
batch goes out again, whole and first, on the next stream, and nothing a
cumulative ack retired is ever sent again. A batch's first resend counts it
(and its requests) as resent; the ones after it, on further reconnects, do not.

Acks (`BatchAck`, shadow.proto): ACCEPTED with no rejections is cumulative and
retires every batch up to its sequence; a batch with shed or rejected requests
gets its own ack first, carrying its counts and its rejections by index, which
the cumulative ack then applies. `REPEATED_SEQUENCE`, and `REJECTED` under
sequence 0 (a message the server could not read at all), concern no batch this
lane can name: they are `protocol_errors`, never a change to a batch's fate.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.client.guarded import Guarded
from service.client.lane import ACCEPTED, LaneStats, names_no_message

CUT_REASONS = ("requests", "bytes", "linger", "flush")
"""Why a batch was cut: full by count, full by encoded size, linger elapsed, flush asked."""


def size_bucket(n: int) -> int:
    """Histogram bucket of a batch of `n` requests: the smallest power of two >= n."""
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class Built:
    """A batch ready to send: the message, its request count and ids (for refusal logs)."""

    message: Any
    n: int
    nbytes: int
    ids: Sequence[str]


@dataclass(frozen=True)
class BatchStats:
    """How a lane batched: sizes, linger and cut reasons, over first sends of batches.

    `batches_resent` counts the batches that went out again after a broken stream, each
    once however many reconnects it took before its ack (a failed attempt hands the
    batch to its stream too); the requests in them are `LaneStats.resent`.
    """

    batches_sent: int = 0
    batches_resent: int = 0
    requests_batched: int = 0
    max_requests: int = 0
    size_histogram: dict[int, int] = field(default_factory=dict)
    linger_waited_total_s: float = 0.0
    linger_waited_max_s: float = 0.0
    cut_by: dict[str, int] = field(default_factory=dict)
    diverted: int = 0  # requests sent on the single stream instead (could not be batched)

    @property
    def mean_requests(self) -> float:
        """Mean requests per batch (0 before the first batch)."""
        return self.requests_batched / self.batches_sent if self.batches_sent else 0.0

    @property
    def mean_linger_s(self) -> float:
        """Mean seconds a batch's first request waited before the batch was cut."""
        return self.linger_waited_total_s / self.batches_sent if self.batches_sent else 0.0


@dataclass
class _Batch:
    built: Built
    seq: int = 0
    sent_at: float = 0.0
    sends: int = 0


@dataclass
class _Fate:
    accepted: int
    shed: int
    rejected: int
    reasons: Counter[str]


class Batcher(Guarded):
    """Bounded, batching, sequenced, resendable lane of one kind of request.

    `convert(item)` turns an offered item into what `encode` takes, on the sender
    thread; if it raises, `divert(item, exc)` gets the item (the client sends it on
    the single stream, where the service gives its own verdict) and it leaves this
    lane. `encode(items)` builds the batch message and returns `(message, nbytes)`.
    """

    def __init__(
        self,
        capacity: int,
        *,
        convert: Callable[[Any], Any],
        encode: Callable[[list[Any]], tuple[Any, int]],
        ids: Callable[[list[Any]], Sequence[str]],
        divert: Callable[[Any, Exception], None],
        max_requests: int = 256,
        max_bytes: int = 1 << 20,
        linger_s: float = 0.005,
    ) -> None:
        if max_requests < 1 or max_bytes < 1 or linger_s < 0:
            raise ValueError("max_requests and max_bytes must be >= 1, linger_s >= 0")
        super().__init__()
        self._capacity = capacity
        self._convert, self._encode, self._ids, self._divert = convert, encode, ids, divert
        self.max_requests, self.max_bytes, self.linger_s = max_requests, max_bytes, linger_s
        # pending: (item, converted?, offered_at); ready: built, not on a live stream yet
        self._pending: deque[tuple[Any, bool, float]] = deque()
        self._ready: deque[_Batch] = deque()
        self._sent: deque[_Batch] = deque()
        self._fates: dict[int, _Fate] = {}
        self._held = 0  # requests offered and not yet retired, diverted or abandoned
        self._building = 0  # sender threads between taking requests and queueing the batch
        self._hurry = 0
        self._next_seq = 1
        self._offered = self._accepted = self._shed = self._rejected = 0
        self._dropped = self._resent = self._protocol_errors = self._diverted = 0
        self._reasons: Counter[str] = Counter()
        self._batches = self._batches_resent = self._batched = self._max_n = 0
        self._hist: Counter[int] = Counter()
        self._cuts: Counter[str] = Counter()
        self._linger_total = self._linger_max = 0.0

    # -- the caller's side -------------------------------------------------------------

    def offer(self, item: Any) -> bool:
        """Buffer `item`; False (and counted as dropped) when `capacity` requests are held."""
        with self._cond:
            self._offered += 1
            if self._held >= self._capacity:
                self._dropped += 1
                return False
            self._held += 1
            self._pending.append((item, False, time.monotonic()))
            self._cond.notify_all()
            return True

    # -- the sender's side -------------------------------------------------------------

    def next_batch(
        self, timeout: float, live: Callable[[], bool] | None = None
    ) -> tuple[int, Any] | None:
        """The next batch to send as `(sequence, message)`, or None if none is due by
        `timeout`. A batch waiting to be (re)sent goes first; otherwise the pending
        requests are cut into a batch once a limit is reached.

        `live` says whether the asking stream is still open; it is asked under the
        lock after any wait and after the build, so a stream that broke meanwhile
        leaves the batch queued for the next stream (tests/client/test_lane_broken_stream.py).
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            if not self._ready and not self._pending:
                self._cond.wait(timeout)
            if live is not None and not live():
                return None
            if self._ready:
                return self._put_on_stream(self._ready.popleft())
            if not self._pending:
                return None
            cut = self._wait_for_cut(deadline)
            if cut is None:
                return None
            waited = time.monotonic() - self._pending[0][2]
            taken = [
                self._pending.popleft() for _ in range(min(len(self._pending), self.max_requests))
            ]
            self._building += 1
        try:
            batch, cut = self._build(taken, cut)
        finally:
            with self._cond:
                self._building -= 1
                self._cond.notify_all()
        if batch is None:
            return None
        with self._cond:
            self._batches += 1
            self._batched += batch.built.n
            self._max_n = max(self._max_n, batch.built.n)
            self._hist[size_bucket(batch.built.n)] += 1
            self._cuts[cut] += 1
            self._linger_total += waited
            self._linger_max = max(self._linger_max, waited)
            if live is not None and not live():
                self._ready.append(batch)
                return None
            return self._put_on_stream(batch)

    def _wait_for_cut(self, deadline: float) -> str | None:
        """Under the lock: wait until a limit is reached; the reason, or None at `deadline`."""
        while True:
            if not self._pending:  # abandoned while waiting
                return None
            if len(self._pending) >= self.max_requests:
                return "requests"
            if self._hurry:
                return "flush"
            now = time.monotonic()
            due = self._pending[0][2] + self.linger_s
            if now >= due:
                return "linger"
            if now >= deadline:
                return None
            self._cond.wait(min(due, deadline) - now)

    def _build(self, taken: list[tuple[Any, bool, float]], cut: str) -> tuple[_Batch | None, str]:
        """Off the lock: convert, encode, and shrink to `max_bytes`; leftovers go back first."""
        items: list[tuple[Any, Any, float]] = []  # (original, converted, offered_at)
        for item, converted, at in taken:
            if converted:  # a leftover of an earlier byte cut
                items.append((item, item, at))
                continue
            try:
                items.append((item, self._convert(item), at))
            except Exception as exc:  # the request cannot be batched: the single stream judges it
                self._leave(item, exc)
        message: Any = None
        while items:
            try:
                message, nbytes = self._encode([c for _, c, _ in items])
            except Exception as exc:  # never lose requests to an encoder fault: send them singly
                for original, _, _ in items:
                    self._leave(original, exc)
                return None, cut
            if nbytes <= self.max_bytes or len(items) == 1:
                break
            keep = max(1, min(len(items) - 1, len(items) * self.max_bytes // nbytes))
            back, items = items[keep:], items[:keep]
            with self._cond:
                self._pending.extendleft((entry, True, at) for entry, at in _reversed_back(back))
            cut = "bytes"
        if not items:
            return None, cut
        ids = self._ids([c for _, c, _ in items])
        return _Batch(Built(message, len(items), nbytes, ids)), cut

    def _leave(self, item: Any, exc: Exception) -> None:
        # `divert` runs under this lock (it only offers to a `Lane`, which never calls
        # back), so `locked` can read both counters at one instant
        with self._cond:
            self._held -= 1
            self._diverted += 1
            self._divert(item, exc)
            self._cond.notify_all()

    def _put_on_stream(self, batch: _Batch) -> tuple[int, Any]:
        """Under the lock: number the batch for this stream and hold it until acked."""
        batch.seq = self._next_seq
        self._next_seq += 1
        batch.sent_at = time.monotonic()
        if batch.sends == 1:  # its first resend; later ones (reconnects that failed) are not
            self._batches_resent += 1  # counted again: `resent` <= offered, per request
            self._resent += batch.built.n
        batch.sends += 1
        self._sent.append(batch)
        return batch.seq, batch.built.message

    def hurry(self, on: bool) -> None:
        """While on (nested), cut batches without waiting for the linger (flush, close)."""
        with self._cond:
            self._hurry += 1 if on else -1
            self._cond.notify_all()

    # -- acks --------------------------------------------------------------------------

    def ids_of(self, sequence: int) -> Sequence[str] | None:
        """Request ids of the sent batch numbered `sequence` (None if none is held)."""
        with self._cond:
            for batch in self._sent:
                if batch.seq == sequence:
                    return batch.built.ids
        return None

    def acknowledge(self, ack: Any) -> None:
        """Apply one `BatchAck`: an individual fate, or a cumulative ack retiring batches."""
        status, sequence = ack.status, ack.sequence
        with self._cond:
            if names_no_message(status, sequence):
                self._protocol_errors += 1
                return
            if status != ACCEPTED or ack.rejections or ack.shed or ack.rejected:
                fate = self._fate_of(ack, sequence)
                if fate is not None:
                    self._fates[sequence] = fate
                return
            while self._sent and self._sent[0].seq <= sequence:
                batch = self._sent.popleft()
                n = batch.built.n
                fate = self._fates.pop(batch.seq, None)
                if fate is None:
                    self._accepted += n
                else:
                    self._accepted += fate.accepted
                    self._shed += fate.shed
                    self._rejected += fate.rejected
                    self._reasons.update(fate.reasons)
                self._held -= n
            self._cond.notify_all()

    def _fate_of(self, ack: Any, sequence: int) -> _Fate | None:
        """Under the lock: the per-request fate an individual ack gives its batch."""
        n = next((b.built.n for b in self._sent if b.seq == sequence), None)
        if n is None:  # an ack about a batch this stream did not send
            self._protocol_errors += 1
            return None
        if ack.whole_batch:
            why = ack.rejections[0].reason if ack.rejections else "unspecified"
            return _Fate(0, 0, n, Counter({why or "unspecified": n}))
        reasons = Counter(r.reason or "unspecified" for r in ack.rejections)
        accepted, shed, rejected = int(ack.accepted), int(ack.shed), int(ack.rejected)
        if accepted + shed + rejected != n:  # the server's counts must cover the batch
            self._protocol_errors += 1
            accepted = min(accepted, n)
            shed = min(shed, n - accepted)
            rejected = n - accepted - shed
            reasons = Counter({"unaccounted": rejected}) if rejected else Counter()
        return _Fate(accepted, shed, rejected, reasons)

    def requeue_unacked(self) -> None:
        """After a broken stream: every unretired batch goes out again, whole and first."""
        with self._cond:
            self._ready.extendleft(reversed(self._sent))
            self._sent.clear()
            self._fates.clear()
            self._cond.notify_all()

    def oldest_unacked_age(self) -> float:
        """Seconds the oldest sent-but-unacked batch has waited (0 if none)."""
        with self._cond:
            return time.monotonic() - self._sent[0].sent_at if self._sent else 0.0

    def has_work(self) -> bool:
        """Whether any request is held (pending, built or in flight)."""
        with self._cond:
            return self._held > 0

    def _busy(self) -> bool:
        # a request is held until retired, diverted or dropped; a batch being built is
        # busy too, so `flush` waits for what it may divert to the single lane
        return bool(self._held or self._building)

    def abandon(self) -> None:
        """At close: count every request still held as dropped."""
        with self._cond:
            self._dropped += self._held
            self._held = 0
            self._pending.clear()
            self._ready.clear()
            self._sent.clear()
            self._fates.clear()
            self._cond.notify_all()

    # -- counters ----------------------------------------------------------------------

    def stats(self) -> LaneStats:
        """Per-request counters; offered == delivered + dropped + in_flight + diverted."""
        with self._cond:
            return LaneStats(
                offered=self._offered,
                accepted=self._accepted,
                shed=self._shed,
                rejected=self._rejected,
                dropped=self._dropped,
                in_flight=self._held,
                resent=self._resent,
                protocol_errors=self._protocol_errors,
                rejected_by_reason=dict(self._reasons),
            )

    def batch_stats(self) -> BatchStats:
        """How this lane batched so far."""
        with self._cond:
            return BatchStats(
                batches_sent=self._batches,
                batches_resent=self._batches_resent,
                requests_batched=self._batched,
                max_requests=self._max_n,
                size_histogram=dict(sorted(self._hist.items())),
                linger_waited_total_s=self._linger_total,
                linger_waited_max_s=self._linger_max,
                cut_by={k: self._cuts[k] for k in CUT_REASONS if self._cuts[k]},
                diverted=self._diverted,
            )


def _reversed_back(back: list[tuple[Any, Any, float]]) -> list[tuple[Any, float]]:
    """Leftovers of a byte cut, reversed for `extendleft`, keeping their converted form."""
    return [(converted, at) for _, converted, at in reversed(back)]
