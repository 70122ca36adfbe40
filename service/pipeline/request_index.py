"""The ingest's memory of recent request ids: request_id -> content digest, bounded.

Lets ingest answer at ack time what the decision log would decide later: a
re-send of a recent request with the same content (`content_sha256`, the one
definition the writer also uses) is a duplicate — acked, not journaled again —
and the same id with other content is refused (`ConflictingRequest`).

Bounded (oldest ids are forgotten first) and per process: it does not know
ids it evicted, ids another replica took, or, until `fill_from_journal` has
read them back, ids journaled before a restart. Those are caught by the writer
(``request_identities``, migration 0011), which keeps the second request out
of the log and records it in ``conflicts``; the index only lets most clients
hear about it in their ack.

Thread-safe. `claim` holds the index's lock across the journal append it
guards (the caller passes it as `append`), so two concurrent sends of one id
cannot both be journaled, and an id whose append was shed is never remembered
(a re-send must then be journaled, not acked as a duplicate of nothing). The
journal's own lock serialises appends anyway, so this costs little concurrency.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

import numpy as np
from numpy.typing import NDArray

from service.contract import MirrorRequest
from service.contract.identity import content_sha256
from service.pipeline import batch_record
from service.pipeline.journal import IngestJournal
from service.pipeline.journal_format import JournalClosed, RecordKind
from service.wire.convert import mirror_request_from_pb
from service.wire.understudy.v1 import contract_pb2

log = logging.getLogger(__name__)

DEFAULT_CAPACITY = 100_000
"""Ids remembered by default: about 20 MB (id string, 32-byte digest, dict slot),
minutes to hours of traffic at the rates the benchmarks measure."""

DIGEST_SIZE = 32
"""Bytes of a content digest (sha256)."""

T = TypeVar("T")


class Seen(StrEnum):
    """What the index says about one send."""

    NEW = "new"  # not known: journal it
    DUPLICATE = "duplicate"  # known with the same content: ack, do not journal
    CONFLICT = "conflict"  # known with other content: refuse


@dataclass(frozen=True, slots=True)
class Claim(Generic[T]):
    """The index's answer, and the append's result when the send was new."""

    seen: Seen
    appended: T | None = None


@dataclass(frozen=True, slots=True)
class BatchClaim(Generic[T]):
    """The index's answer for each request of a batch (positions in what was claimed).

    ``new``: journal them (``appended`` holds the append's result); ``duplicates``:
    known with the same content; ``repeats``: an earlier request of this batch
    with the same id and content (accepted with it, or shed with it);
    ``conflicts``: known, or earlier in the batch, with other content.
    """

    new: NDArray[np.intp]
    duplicates: NDArray[np.intp]
    repeats: NDArray[np.intp]
    conflicts: NDArray[np.intp]
    appended: T | None = None


def _positions(found: list[int]) -> NDArray[np.intp]:
    return np.array(found, dtype=np.intp) if found else _NONE


_NONE = np.empty(0, dtype=np.intp)
_NONE.flags.writeable = False


class RequestIndex:
    """A bounded request_id -> content digest map, oldest forgotten first."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._capacity = capacity
        self._digests: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._digests)

    @property
    def capacity(self) -> int:
        """The most ids remembered."""
        return self._capacity

    def claim(
        self,
        request_id: str,
        digest: bytes,
        append: Callable[[], T],
        accepted: Callable[[T], bool],
    ) -> Claim[T]:
        """Look `request_id` up; when new, run `append` and remember it if `accepted`.

        `append` runs under the index lock (see the module docstring); its
        exceptions propagate and nothing is remembered.
        """
        with self._lock:
            known = self._digests.get(request_id)
            if known is not None:
                return Claim(Seen.DUPLICATE if known == digest else Seen.CONFLICT)
            result = append()
            if accepted(result):
                self._remember_locked(request_id, digest)
            return Claim(Seen.NEW, result)

    def claim_batch(
        self,
        request_ids: Sequence[str],
        digests: bytes,
        append: Callable[[NDArray[np.intp]], T],
        accepted: Callable[[T], bool],
    ) -> BatchClaim[T]:
        """`claim` for the requests of one batch, under one lock hold and one `append`.

        `digests` is the requests' 32-byte digests concatenated, in order. Each
        request is looked up as `claim` would, and also against the requests
        before it in the same batch (the first copy of an id wins: a later
        identical copy is a repeat, a later different copy a conflict). When
        any request is new, `append` runs once, under the lock, with the
        positions of the new ones, and every new id is remembered if
        `accepted` says the append took them; otherwise none is (a re-send
        must then be journaled). Its exceptions propagate and nothing is
        remembered.
        """
        n = len(request_ids)
        if len(digests) != n * DIGEST_SIZE:
            raise ValueError(
                f"{n} requests need {n * DIGEST_SIZE} digest bytes, got {len(digests)}"
            )
        new: list[int] = []
        duplicates: list[int] = []
        repeats: list[int] = []
        conflicts: list[int] = []
        fresh: dict[str, bytes] = {}  # this batch's new ids, first copy first
        with self._lock:
            known = self._digests
            for i, request_id in enumerate(request_ids):  # one dict probe per request id
                digest = digests[i * DIGEST_SIZE : (i + 1) * DIGEST_SIZE]
                held = known.get(request_id)
                if held is not None:
                    (duplicates if held == digest else conflicts).append(i)
                    continue
                first = fresh.get(request_id)
                if first is None:
                    fresh[request_id] = digest
                    new.append(i)
                else:
                    (repeats if first == digest else conflicts).append(i)
            if not new:
                return BatchClaim(
                    _positions(new),
                    _positions(duplicates),
                    _positions(repeats),
                    _positions(conflicts),
                )
            result = append(_positions(new))
            if accepted(result):
                for request_id, digest in fresh.items():
                    self._remember_locked(request_id, digest)
        return BatchClaim(
            _positions(new),
            _positions(duplicates),
            _positions(repeats),
            _positions(conflicts),
            result,
        )

    def remember(self, request_id: str, digest: bytes) -> bool:
        """Add an id known from elsewhere (the journal); False when it was known already."""
        with self._lock:
            if request_id in self._digests:
                return False
            self._remember_locked(request_id, digest)
            return True

    def clear(self) -> None:
        """Forget every id (what a restart without the journal's records gives)."""
        with self._lock:
            self._digests.clear()

    def _remember_locked(self, request_id: str, digest: bytes) -> None:
        if not self._capacity:
            return
        self._digests[request_id] = digest
        while len(self._digests) > self._capacity:
            self._digests.popitem(last=False)


def mirror_from_payload(payload: bytes) -> MirrorRequest:
    """A journaled mirror payload as its contract request (as the scorer decodes it)."""
    return mirror_request_from_pb(contract_pb2.MirrorRequest.FromString(payload))


def _remember_batch(index: RequestIndex, payload: bytes, decoded: object) -> int:
    """Remember the accepted requests of a batch record, with the digests it carries."""
    try:
        held = batch_record.unpack(payload, RecordKind.MIRROR_BATCH)
        ids = batch_record.request_ids_of(held, decoded)
    except Exception:  # a record that no longer decodes is the scorer's to dead-letter
        return 0
    assert held.digests is not None
    return sum(index.remember(rid, held.digests[i].tobytes()) for i, rid in enumerate(ids))


def fill_from_journal(
    index: RequestIndex,
    journal: IngestJournal,
    decode: Callable[[bytes], MirrorRequest] = mirror_from_payload,
    *,
    chunk: int = 512,
) -> int:
    """Remember the ids of the mirrored requests the journal still holds; returns how many.

    The journal keeps what its consumers have not checkpointed (and segments
    not yet reclaimed), so after a restart this is the recent traffic — what
    a client is most likely to re-send. Reads at most `index.capacity`
    records' worth of mirrors from the oldest kept; records that no longer
    decode are skipped (the scorer dead-letters them). A batch record's
    accepted requests are remembered with the digests the record carries. `decode` turns a
    payload into its contract request (``request_id`` and content).

    Cheap enough to run once at startup on a background thread: ids that
    arrive meanwhile are claimed live, and the writer catches anything missed.
    """
    filled = 0
    after = 0
    try:
        while filled < index.capacity:
            records = journal.read("request-index", chunk, after_seq=after)
            if not records:
                break
            for record in records:
                after = record.seq
                if record.kind is RecordKind.MIRROR_BATCH:
                    filled += _remember_batch(index, record.payload, record.decoded)
                    continue
                if record.kind is not RecordKind.MIRROR:
                    continue
                known = record.decoded
                try:
                    request = known if isinstance(known, MirrorRequest) else decode(record.payload)
                    digest = content_sha256(request)
                except Exception:  # a record that no longer decodes is the scorer's to dead-letter
                    continue
                filled += index.remember(request.request_id, digest)
    except JournalClosed:
        pass  # shutting down before the fill finished: nothing to fill any more
    except Exception:  # the index is an optimisation: the writer still checks every id
        log.warning("request index fill stopped after %d ids", filled, exc_info=True)
    log.info("request index filled with %d ids from the journal", filled)
    return filled
