"""Batch traffic for the reliability tests: shaped batches, a windowed batch stream.

`shaped_batches` gives batches of the issue's shape (64 requests, a fresh
cluster snapshot every 8, so each batch carries 8 snapshots), each request with
an id of its own. `BatchStreamRun` drives one `MirrorManyStream` on a thread,
at most `window` batches ahead of the acks, and keeps what the acks said per
sequence; a test waits on its condition (`wait_for`), never on the clock.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc

from service.contract import MirrorRequest
from service.contract.batch import RequestBatch
from service.policies.synthetic import random_requests
from service.wire.batch_codec import batch_to_pb
from service.wire.understudy.v1 import batch_pb2, shadow_pb2, shadow_pb2_grpc

ACCEPTED = shadow_pb2.ACK_STATUS_ACCEPTED
BATCH_SIZE = 64
HANG_GUARD_S = 120.0


@dataclass(frozen=True)
class Batch:
    """One batch message and the ids of its requests, in row order."""

    msg: batch_pb2.MirrorBatch
    ids: tuple[str, ...]


def batch_requests(
    n_batches: int, tag: str, seed: int = 5, size: int = BATCH_SIZE, n_nodes: int = 32
) -> list[MirrorRequest]:
    """The requests of `shaped_batches`, in order (for a client that batches them itself)."""
    requests = random_requests(
        seed=seed, n_requests=n_batches * size, n_nodes=n_nodes, max_options=12
    )
    return [
        dataclasses.replace(r, request_id=f"{tag}-{i // size}-{i % size}")
        for i, r in enumerate(requests)
    ]


def shaped_batches(
    n_batches: int, tag: str, seed: int = 5, size: int = BATCH_SIZE, n_nodes: int = 32
) -> list[Batch]:
    """`n_batches` batches of `size` requests, 8 requests to a snapshot, ids `tag-k-row`."""
    requests = batch_requests(n_batches, tag, seed, size, n_nodes)
    out = []
    for k in range(n_batches):
        chunk = requests[k * size : (k + 1) * size]
        out.append(
            Batch(
                batch_to_pb(RequestBatch.from_requests(chunk)), tuple(c.request_id for c in chunk)
            )
        )
    return out


@dataclass
class BatchStreamRun:
    """One MirrorManyStream sending `batches` (sequences 1..n), `window` ahead of the acks.

    `through` is the highest cumulative ACCEPTED sequence; `individual` the acks of
    batches acked alone (shed or rejected), by sequence. `pace_s` spaces the sends
    (pacing of the generator, not a synchronisation).
    """

    port: int
    token: str
    batches: list[Batch]
    window: int = 4
    pace_s: float = 0.0
    through: int = 0
    sent: int = 0
    individual: dict[int, shadow_pb2.BatchAck] = field(default_factory=dict)
    acks: list[shadow_pb2.BatchAck] = field(default_factory=list)
    error: grpc.StatusCode | None = None
    done: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _thread: threading.Thread | None = None

    def start(self) -> BatchStreamRun:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _handled(self) -> int:
        return max([self.through, *self.individual])

    def _sends(self) -> Iterator[shadow_pb2.MirrorBatchStreamRequest]:
        for sequence, batch in enumerate(self.batches, start=1):
            with self._cond:
                ok = self._cond.wait_for(
                    lambda s=sequence: (
                        self.done  # type: ignore[misc]
                        or self.stop.is_set()
                        or self._handled() >= s - self.window
                    ),
                    HANG_GUARD_S,
                )
                if not ok or self.done or self.stop.is_set():
                    return
                self.sent = sequence
            yield shadow_pb2.MirrorBatchStreamRequest(sequence=sequence, batch=batch.msg)
            if self.pace_s:
                time.sleep(self.pace_s)  # pacing of the generator, not a synchronisation

    def _run(self) -> None:
        auth = (("authorization", f"Bearer {self.token}"),)
        try:
            with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
                stub = shadow_pb2_grpc.ShadowEvaluationStub(channel)  # type: ignore[no-untyped-call]
                for envelope in stub.MirrorManyStream(
                    self._sends(), metadata=auth, timeout=10 * HANG_GUARD_S
                ):
                    with self._cond:
                        ack = envelope.ack
                        self.acks.append(ack)
                        if ack.status == ACCEPTED:
                            self.through = max(self.through, int(ack.sequence))
                        else:
                            self.individual[int(ack.sequence)] = ack
                        self._cond.notify_all()
        except grpc.RpcError as exc:
            self.error = exc.code()
        finally:
            with self._cond:
                self.done = True
                self._cond.notify_all()

    def wait_for(self, condition: Callable[[BatchStreamRun], bool], what: str) -> None:
        """Wait until `condition(self)` holds (a hang guard only)."""
        with self._cond:
            assert self._cond.wait_for(lambda: condition(self), HANG_GUARD_S), (
                f"hang guard: {what}; through {self.through}, sent {self.sent}, {self.error}"
            )

    def join(self) -> None:
        assert self._thread is not None
        self._thread.join(HANG_GUARD_S)
        assert not self._thread.is_alive(), "the batch stream never ended"

    def acked_sequences(self) -> list[int]:
        """Sequences whose every request was acked accepted (cumulatively or alone)."""
        with self._cond:
            wholly = [
                s
                for s in range(1, self.through + 1)
                if s not in self.individual
                or self.individual[s].accepted == len(self.batches[s - 1].ids)
            ]
        return wholly

    def acked_ids(self) -> list[str]:
        """Ids of every request acked accepted, from wholly accepted batches and the
        accepted rows of batches acked alone (rows not named as rejected, none shed)."""
        ids = [i for s in self.acked_sequences() for i in self.batches[s - 1].ids]
        with self._cond:
            for s, ack in self.individual.items():
                if 0 < ack.accepted < len(self.batches[s - 1].ids):
                    assert ack.shed == 0, "a batch is one record: shed all or none"
                    refused = {r.index for r in ack.rejections}
                    ids += [
                        i for row, i in enumerate(self.batches[s - 1].ids) if row not in refused
                    ]
        return ids
