"""The durable, bounded ingest journal: what an ingest ack means.

Ingest parses and validates a request, appends its serialized bytes here, and
acks; the scorer consumes the journal in micro-batches and commits a checkpoint
after its database commit; a restart resumes after the checkpoint. There is no
well-kept PyPI library that offers a crash-safe, bounded, multi-consumer segment
journal with checkpoints inside a Python process (Kafka/Redpanda are servers,
the SQLite/LMDB queues add a database on the ack path and share neither the
bound nor the recovery rules we need), so this is written by hand on the stdlib.
The file format lives in :mod:`service.pipeline.journal_format`, the segment
files (recovery, rotation, scans) in :mod:`service.pipeline.journal_store`.

Guarantees
----------
* **Process crash** (SIGKILL, OOM kill, segfault), any fsync mode: every record
  whose ``append``/``append_many`` returned a seq is in the page cache of a
  segment file and is found by the next open. Each append (each batch) is one
  ``write``/``writev`` on an ``O_APPEND`` descriptor; if the process dies inside
  that syscall only a torn *tail* can result, which recovery detects (short /
  bad magic / CRC mismatch), truncates, and logs; nothing acked is lost.
* **Power loss / kernel crash**: ``FsyncMode.ALWAYS`` fdatasyncs before append
  returns, so every acked record survives. ``FsyncMode.INTERVAL`` loses at most
  the records appended in the last ``fsync_interval_s`` (plus the time one
  fdatasync takes). ``FsyncMode.NEVER`` loses whatever the kernel had not yet
  written back (typically up to ~30 s). Checkpoints are always durable when
  ``commit`` returns (temp file, fsync, ``os.replace``, directory fsync).
* **Ordering**: seqs are global, start at 1, strictly increase and are never
  reused, even across restarts (after a power loss that lost journal data but
  not a later checkpoint, numbering continues above the checkpoint, leaving a
  gap). Seq order is file order is ``read`` order; records appended by one
  thread appear in that thread's call order; an ``append_many`` batch is
  contiguous. A record is visible to readers only after its write returned.
* **Bounded**: ``append`` returns ``None`` (shed) when the unconsumed bytes
  (head minus the slowest consumer's checkpoint, headers included) plus the new
  record would exceed ``max_bytes``; the bound is exact, and room comes back as
  consumers commit. Disk use is at most ``max_bytes`` plus the consumed part of
  the oldest kept segment (less than one segment, or one oversized record).
* **Failures are not the bound**: a failed write (a full disk, say) raises
  :class:`JournalIOError` (ingest sheds it under its own reason) after cutting
  the file back to its last whole record (if even the cut fails, it is retried
  before the next write, which is refused until it succeeds: nothing is ever
  written behind a partial record); a failed segment creation leaves the old
  segment active. Nothing is latched: the next append tries the disk again, and
  on a full disk first deletes the active segment if every consumer has passed
  it (otherwise it would stay until it filled, which it cannot). A checkpoint
  on a full disk first deletes the segments it frees, then is rewritten in
  place (every consumer gets a checkpoint file at open for this), so a journal
  that filled its own disk frees it as consumers catch up. :meth:`health`
  reports a failing write (and the appends refused since) until one succeeds.
  A failed fsync in ``ALWAYS`` mode makes every later append raise (the promise
  is gone); in ``INTERVAL`` mode it is logged, counted
  (``fsync_failures_total``), shown by :meth:`health`, and the next pass
  fsyncs the same files again.
* **Damage that is not a torn tail** (a bad record in a non-last segment, or a
  bad record followed by valid ones) raises :class:`JournalCorrupt` on open,
  naming file and offset, instead of dropping acknowledged data.

Cost: an append is a CRC of the payload (outside the lock; zlib-ng's, see
:mod:`~service.pipeline.journal_format`), a 32-byte header, one ``writev`` and
some bookkeeping under a ``threading.Lock``; no fsync unless ``ALWAYS``.
Measured: ~3 µs for a tiny payload, ~12 µs for 10 KB (8 µs of it the kernel
copying into the page cache); a 225 KB batch record ~50 µs, all but ~5 µs of it
the kernel's copy (zlib's CRC alone took ~45 µs of it). Opening CRC-checks
every kept segment (~0.2 s per 256 MB from page cache with zlib's CRC).
Checkpoint files of consumers no longer configured do not hold back deletion.
An append is safe to call straight from an asyncio event loop in the
``NEVER``/``INTERVAL`` modes (a page-cache write); in ``ALWAYS`` mode call it
via ``asyncio.to_thread``. One process may hold a journal directory at a time
(``flock`` on ``LOCK``; the kernel releases it if the process dies).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from service.pipeline.journal_format import (
    CHECKPOINT_DIR,
    HEADER_SIZE,
    LOCK_FILE,
    MAX_PAYLOAD,
    JournalClosed,
    JournalCorrupt,
    JournalError,
    JournalIOError,
    JournalLocked,
    JournalRecord,
    RecordKind,
    all_checkpoints,
    crc32,
    fsync_dir,
    fsync_path,
    overwrite_checkpoint,
    read_all,
    write_checkpoint,
)
from service.pipeline.journal_store import (
    Accepted,
    FsyncMode,
    Prepared,
    SegmentStore,
    Span,
    locate,
    read_spans,
)

__all__ = [
    "FsyncMode",
    "IngestJournal",
    "JournalClosed",
    "JournalConfig",
    "JournalCorrupt",
    "JournalError",
    "JournalIOError",
    "JournalLocked",
    "JournalRecord",
    "JournalStats",
    "RecordKind",
    "read_all",
]

logger = logging.getLogger(__name__)

_CONSUMER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
"""Errnos that mean the journal's disk (or quota) is full."""


@dataclass(frozen=True)
class JournalConfig:
    """Where the journal lives, how big it may grow and how durable an ack is."""

    directory: Path
    segment_bytes: int = 64 * 1024 * 1024
    max_bytes: int = 1024 * 1024 * 1024  # bound on unconsumed bytes (head minus slowest ckpt)
    fsync_mode: FsyncMode = FsyncMode.INTERVAL
    fsync_interval_s: float = 0.05
    tail_cache_bytes: int = 64 * 1024 * 1024  # recent records kept in memory for readers
    decoded_cache_records: int = 1024  # decoded objects handed from ingest to consumers
    decoded_cache_payload_bytes: int = 8 * 1024 * 1024  # ... and their payloads' total size

    def __post_init__(self) -> None:
        if self.segment_bytes <= HEADER_SIZE:
            raise ValueError(f"segment_bytes must exceed {HEADER_SIZE}")
        if (
            self.max_bytes <= 0
            or self.tail_cache_bytes < 0
            or self.decoded_cache_records < 0
            or self.decoded_cache_payload_bytes < 0
        ):
            raise ValueError("max_bytes must be positive and tail_cache_bytes non-negative")
        if not self.fsync_interval_s > 0:
            raise ValueError("fsync_interval_s must be positive")
        object.__setattr__(self, "directory", Path(self.directory))
        object.__setattr__(self, "fsync_mode", FsyncMode(self.fsync_mode))


@dataclass(frozen=True, slots=True)
class JournalStats:
    """A consistent snapshot for metrics."""

    head_seq: int
    depth_records: int
    depth_bytes: int
    capacity_bytes: int
    appended_total: int
    shed_total: int
    segments: int
    fsyncs_total: int
    fsync_failures_total: int
    cached_records: int


_EVICTED: Accepted = (0, RecordKind.MIRROR, b"", 0.0, 0)
"""What an evicted slot of the tail cache holds until the list is compacted."""


def _prepare(kind: RecordKind, payload: bytes) -> Prepared:
    """Validate and CRC a payload before taking the lock (the CRC is the costly part)."""
    if payload.__class__ is not bytes:
        payload = bytes(payload)  # never keep a buffer the caller may still mutate
    if kind.__class__ is not RecordKind:
        kind = RecordKind(kind)
    if len(payload) > MAX_PAYLOAD:
        raise ValueError("payload too large for one journal record")
    return kind, payload, crc32(payload)


class IngestJournal:
    """Durable bounded append-only journal with per-consumer checkpoints. Thread-safe."""

    def __init__(self, config: JournalConfig, consumers: Sequence[str] = ("scorer",)) -> None:
        """Open (creating if needed) and recover the journal in ``config.directory``."""
        if isinstance(consumers, str) or not consumers:
            raise ValueError("consumers must be a non-empty sequence of names")
        for name in consumers:
            if not _CONSUMER_RE.match(name):
                raise ValueError(f"bad consumer name {name!r}")
        self._config = config
        self._dir = config.directory
        self._max_bytes = config.max_bytes
        self._cache_limit = config.tail_cache_bytes
        self._lock = threading.Lock()  # guards everything below and the store
        self._cond = threading.Condition(self._lock)
        self._commit_lock = threading.Lock()  # serializes commits: the only segment deleter
        self._sync_lock = threading.Lock()  # one fsync pass at a time
        self._store = SegmentStore(self._dir, config.segment_bytes, config.fsync_mode)
        self._waiters = 0
        self._closed = False
        self._ckpt: dict[str, int] = {}
        self._pos: dict[str, int] = {}  # consumer -> logical position after its checkpoint
        self._min_pos = 0
        # tail cache: recent records, contiguous up to the head; _cache[_cache_start:] is live
        self._cache: list[Accepted] = []
        self._cache_start = 0
        self._cache_bytes = 0
        # seq -> the object ingest decoded from the payload; bounded by count and by payload
        # bytes (a decoded 64-node request takes ~26 KiB for a ~6 KiB payload), filled only
        # while there is room (under overload the scorer decodes the bytes, as after a restart)
        self._decoded: dict[int, object] = {}
        self._decoded_sizes: dict[int, int] = {}
        self._decoded_bytes = 0
        self._decoded_limit = config.decoded_cache_records
        self._decoded_byte_limit = config.decoded_cache_payload_bytes
        self._appended = 0
        self._shed = 0
        self._fsync_failures = 0
        # the failure of the last append, until one succeeds, and the appends refused since;
        # read without the lock by `health` (a probe must never wait on an fsync)
        self._write_failure: str | None = None
        self._refused = 0
        self._sync_failure: str | None = None  # INTERVAL: the last background fsync failed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock_fd = os.open(_mkdirs(self._dir) / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise JournalLocked(f"journal {self._dir} is open elsewhere") from None
        try:
            stored = all_checkpoints(self._dir)
            self._store.recover(max(stored.values(), default=0))
            for consumer in dict.fromkeys(consumers):
                seq = self._ckpt[consumer] = stored.get(consumer, 0)
                plan = self._store.pos_plan_locked(seq)
                self._pos[consumer] = plan if isinstance(plan, int) else locate(plan, seq)
            self._min_pos = min(self._pos.values())
            for consumer in self._ckpt.keys() - stored.keys():
                _first_checkpoint(self._dir, consumer)
        except BaseException:
            self._store.close_locked()
            os.close(self._lock_fd)
            raise
        if config.fsync_mode is FsyncMode.INTERVAL:
            self._thread = threading.Thread(
                target=self._sync_loop, name=f"journal-fsync:{self._dir.name}", daemon=True
            )
            self._thread.start()

    # ------------------------------------------------------------------ append

    def append(self, kind: RecordKind, payload: bytes, decoded: object = None) -> int | None:
        """Journal one record; its seq, or ``None`` when shed because the journal is full.

        When this returns a seq the record survives a process crash (and power loss
        per the fsync mode). Raises :class:`JournalIOError` if the write failed and
        :class:`JournalClosed` after :meth:`close`.

        ``decoded``, if given, must be exactly what decoding ``payload`` gives (and
        immutable): readers in this process then receive it as
        `JournalRecord.decoded` and skip decoding the bytes again. It lives in
        memory only, for a bounded number of records; the bytes stay the truth.
        """
        kind, payload, pcrc = _prepare(kind, payload)
        size = HEADER_SIZE + len(payload)
        store = self._store
        with self._lock:
            if self._closed:
                self._raise_unwritable()
            if store.head_logical - self._min_pos + size > self._max_bytes:
                self._shed += 1
                return None
            try:
                store.check_writable_locked()
                try:
                    entry = store.append_one_locked(kind, payload, pcrc, size)
                except JournalIOError as exc:
                    if exc.errno not in NO_SPACE or not self._reclaim_locked():
                        raise
                    entry = store.append_one_locked(kind, payload, pcrc, size)
            except JournalIOError as exc:
                self._note_failure_locked(exc, 1)
                raise
            if self._write_failure is not None:
                self._recovered_locked()
            self._appended += 1
            if (
                decoded is not None
                and len(self._decoded) < self._decoded_limit
                and self._decoded_bytes + len(payload) <= self._decoded_byte_limit
            ):
                self._decoded[entry[0]] = decoded
                self._decoded_sizes[entry[0]] = len(payload)
                self._decoded_bytes += len(payload)
            if self._cache_limit:
                self._cache.append(entry)
                self._cache_bytes += size
                if self._cache_bytes > self._cache_limit:
                    self._evict_cache_locked(0)
            if self._waiters:
                self._cond.notify_all()
            return entry[0]

    def append_many(self, items: Sequence[tuple[RecordKind, bytes]]) -> list[int | None]:
        """Journal a batch (e.g. one gRPC stream read) under one lock hold and one write.

        Order is kept and seqs are contiguous. When the bound is hit the accepted
        records are a prefix and the rest are shed (``None``), which is what a
        cumulative stream ack needs. A batch crossing a segment boundary costs
        one write per segment it touches.
        """
        prepared = [_prepare(kind, payload) for kind, payload in items]
        results: list[int | None] = [None] * len(prepared)
        if not prepared:
            return results
        store = self._store
        with self._lock:
            if self._closed:
                self._raise_unwritable()
            room = self._max_bytes - (store.head_logical - self._min_pos)
            try:
                store.check_writable_locked()
                accepted = store.append_batch_locked(prepared, room)
            except JournalIOError as exc:
                self._note_failure_locked(exc, len(prepared))
                raise
            if accepted and self._write_failure is not None:
                self._recovered_locked()
            self._appended += len(accepted)
            self._shed += len(prepared) - len(accepted)
            for i, entry in enumerate(accepted):
                results[i] = entry[0]
            if accepted:
                if self._cache_limit:
                    self._cache.extend(accepted)
                    self._cache_bytes += sum(HEADER_SIZE + len(e[2]) for e in accepted)
                    if self._cache_bytes > self._cache_limit:
                        self._evict_cache_locked(0)
                if self._waiters:
                    self._cond.notify_all()
        return results

    def _raise_unwritable(self) -> None:
        raise JournalClosed(f"journal {self._dir} is closed")

    def _note_failure_locked(self, exc: JournalIOError, refused: int) -> None:
        if self._write_failure is None:
            logger.error("journal: appends refused until a write succeeds: %s", exc)
        self._write_failure = exc.reason
        self._refused += refused

    def _recovered_locked(self) -> None:
        logger.warning(
            "journal: writes succeed again (%d appends were refused: %s)",
            self._refused,
            self._write_failure,
        )
        self._write_failure = None
        self._refused = 0

    def _reclaim_locked(self) -> bool:
        """On a full disk: delete the active segment if every consumer passed it."""
        doomed = self._store.reclaim_active_locked(min(self._ckpt.values()))
        try:
            _unlink_all(doomed, self._dir)
        except OSError as exc:  # a consumed file left behind: the next open finds it, harmless
            logger.error("journal: cannot delete consumed segments: %s", exc)
        return bool(doomed)

    def _evict_cache_locked(self, upto_seq: int) -> None:
        """Drop cached records over the byte budget or at/below ``upto_seq``."""
        cache, i = self._cache, self._cache_start
        while i < len(cache) and (self._cache_bytes > self._cache_limit or cache[i][0] <= upto_seq):
            self._cache_bytes -= HEADER_SIZE + len(cache[i][2])
            # let go of the payload now, not at the next compaction: with 225 KB batch records
            # that held ~1,000 dead payloads (~230 MB) and freed them in one append, and every
            # record meanwhile landed in fresh pages (page faults in the caller's packing)
            cache[i] = _EVICTED
            i += 1
        if i >= len(cache):
            cache.clear()
            i = 0
        elif i > 1024 and 2 * i > len(cache):
            del cache[:i]
            i = 0
        self._cache_start = i

    # ------------------------------------------------------------------ read

    def read(
        self, consumer: str, max_records: int, after_seq: int | None = None
    ) -> list[JournalRecord]:
        """Up to ``max_records`` records after the consumer's checkpoint (or ``after_seq``).

        In seq order; fewer only when fewer exist. Recent records come from the
        in-memory tail cache; older ones (everything, after a restart) are read
        from the segment files outside the lock. Records at or below every
        consumer's checkpoint may already be deleted and are then skipped.
        """
        with self._lock:
            self._check_open_locked()
            after = self._consumer_ckpt(consumer) if after_seq is None else after_seq
        out: list[JournalRecord] = []
        while len(out) < max_records:
            want = max_records - len(out)
            chunk: list[Accepted] = []
            spans: list[Span] = []
            with self._lock:
                self._check_open_locked()
                if after >= self._store.next_seq - 1:
                    break
                c, s = self._cache, self._cache_start
                if s < len(c) and c[s][0] <= after + 1:
                    i = s + after + 1 - c[s][0]
                    chunk = c[i : i + want]
                else:
                    spans = self._store.read_spans_locked(after, want)
            known = self._decoded
            if chunk:
                out.extend(JournalRecord(q, k, p, t, known.get(q)) for q, k, p, t, _ in chunk)
            else:
                got = read_spans(spans, after, want)
                if not got:
                    break
                out.extend(
                    JournalRecord(r.seq, r.kind, r.payload, r.appended_at, known[r.seq])
                    if r.seq in known
                    else r
                    for r in got
                )
            after = out[-1].seq
        return out

    def wait_for_records(self, consumer: str, timeout: float, after_seq: int | None = None) -> bool:
        """Block until a record after the checkpoint (or ``after_seq``) exists, or timeout.

        Lets the scorer sleep while ingest is idle instead of polling; returns
        whether such a record exists (``False`` on timeout or close).
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            pos = self._consumer_ckpt(consumer) if after_seq is None else after_seq
            while self._store.next_seq - 1 <= pos and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._waiters += 1
                try:
                    self._cond.wait(remaining)
                finally:
                    self._waiters -= 1
            return self._store.next_seq - 1 > pos and not self._closed

    # ------------------------------------------------------------------ checkpoints

    def commit(self, consumer: str, seq: int) -> None:
        """Durably record that ``consumer`` is done with every record up to ``seq``.

        Returns once the checkpoint survives power loss; then deletes segments that
        every consumer has passed, which frees room under the bound. Commits must
        not move backwards; committing the current checkpoint again is a no-op.
        """
        with self._commit_lock:
            with self._lock:
                self._check_open_locked()
                cur = self._consumer_ckpt(consumer)
                if seq < cur:
                    raise ValueError(f"commit {seq} for {consumer!r} is behind checkpoint {cur}")
                if seq > self._store.next_seq - 1:
                    raise ValueError(f"commit {seq} beyond head {self._store.next_seq - 1}")
                if seq == cur:
                    return
                plan = self._pos_plan_locked(seq)
            # no segment can vanish meanwhile: deletion happens only under _commit_lock
            pos = plan if isinstance(plan, int) else locate(plan, seq)
            self._write_checkpoint(consumer, seq)
            with self._lock:
                self._ckpt[consumer] = seq
                self._pos[consumer] = pos
                self._min_pos = min(self._pos.values())
                floor = min(self._ckpt.values())
                doomed = self._store.pop_consumed_locked(floor)
                if self._decoded:
                    self._decoded = {q: d for q, d in self._decoded.items() if q > floor}
                    self._decoded_sizes = {
                        q: n for q, n in self._decoded_sizes.items() if q > floor
                    }
                    self._decoded_bytes = sum(self._decoded_sizes.values())
                if self._cache_limit:
                    self._evict_cache_locked(floor)
            _unlink_all(doomed, self._dir)

    def _write_checkpoint(self, consumer: str, seq: int) -> None:
        """Write a checkpoint durably, on a full disk too (which the journal may have filled).

        First the atomic replace; on ENOSPC, free the segments the new checkpoint
        passes and try again; then overwrite the existing checkpoint in place
        (needs no free block; every consumer gets a file when the journal opens).
        """
        try:
            write_checkpoint(self._dir, consumer, seq)
            return
        except OSError as exc:
            if exc.errno not in NO_SPACE:
                raise
            logger.warning("journal: checkpoint of %s on a full disk: %s", consumer, exc)
        self._free_for_checkpoint(consumer, seq)
        try:
            write_checkpoint(self._dir, consumer, seq)
        except OSError as exc:
            if exc.errno not in NO_SPACE:
                raise
            overwrite_checkpoint(self._dir, consumer, seq)

    def _free_for_checkpoint(self, consumer: str, seq: int) -> None:
        """Make room for a checkpoint on a full disk (the journal may have filled it).

        Deletes the segments that every consumer has passed, counting ``consumer``
        as done through ``seq`` -- it says so by committing -- the active segment
        included. Deleting before the checkpoint is durable is safe: a restart
        resumes at the old checkpoint and skips the missing records, which the
        consumer had finished with. Runs under ``_commit_lock``.
        """
        with self._lock:
            floor = min(seq if name == consumer else at for name, at in self._ckpt.items())
            doomed = self._store.pop_consumed_locked(floor)
            try:
                doomed += self._store.reclaim_active_locked(floor)
            except JournalIOError as exc:
                logger.error("journal: cannot start a segment to free space: %s", exc)
        _unlink_all(doomed, self._dir)

    def checkpoint(self, consumer: str) -> int:
        """Last committed seq of ``consumer`` (0 before its first commit)."""
        with self._lock:
            return self._consumer_ckpt(consumer)

    def _consumer_ckpt(self, consumer: str) -> int:
        try:
            return self._ckpt[consumer]
        except KeyError:
            raise KeyError(f"unknown journal consumer {consumer!r}") from None

    def _pos_plan_locked(self, seq: int) -> int | Span:
        """Logical position after every record <= ``seq``: from the cache, or a span to scan."""
        c, s = self._cache, self._cache_start
        if s < len(c) and c[s][0] <= seq < self._store.next_seq:
            return c[s + seq - c[s][0]][4]
        return self._store.pos_plan_locked(seq)

    # ------------------------------------------------------------------ state

    @property
    def head_seq(self) -> int:
        """The last seq handed out (0 for a new journal)."""
        return self._store.next_seq - 1

    def depth_records(self, consumer: str | None = None) -> int:
        """Seqs after ``consumer``'s checkpoint (default: the slowest consumer's)."""
        with self._lock:
            base = min(self._ckpt.values()) if consumer is None else self._consumer_ckpt(consumer)
            return max(0, self._store.next_seq - 1 - base)

    @property
    def depth_bytes(self) -> int:
        """Unconsumed bytes, headers included: what the ``max_bytes`` bound applies to."""
        with self._lock:
            return self._store.head_logical - self._min_pos

    @property
    def capacity_bytes(self) -> int:
        """The configured bound on :attr:`depth_bytes`."""
        return self._max_bytes

    @property
    def config(self) -> JournalConfig:
        return self._config

    def stats(self) -> JournalStats:
        """Counters and gauges for Prometheus, read under one lock hold."""
        with self._lock:
            head = self._store.next_seq - 1
            return JournalStats(
                head_seq=head,
                depth_records=max(0, head - min(self._ckpt.values())),
                depth_bytes=self._store.head_logical - self._min_pos,
                capacity_bytes=self._max_bytes,
                appended_total=self._appended,
                shed_total=self._shed,
                segments=len(self._store.segments),
                fsyncs_total=self._store.fsyncs,
                fsync_failures_total=self._fsync_failures,
                cached_records=len(self._cache) - self._cache_start,
            )

    def health(self) -> tuple[bool, str]:
        """Whether appends succeed, for readiness; lock-free, so it never waits on a write.

        False from a failed append until the next one succeeds, with the reason
        (no path: probes are shown to clients) and the appends refused since;
        also while background fsyncs fail (appends go on, power-loss safety not).
        """
        failure, refused = self._write_failure, self._refused
        if failure is not None:
            return False, f"write failed: {failure}, {refused} refused"
        if self._sync_failure is not None:
            return False, f"fsync failed: {self._sync_failure}"
        used = (self._store.head_logical - self._min_pos) / self._max_bytes
        return True, f"{used:.1%} of the bound used"

    def _check_open_locked(self) -> None:
        if self._closed:
            raise JournalClosed(f"journal {self._dir} is closed")

    # ------------------------------------------------------------------ durability

    def sync(self) -> None:
        """fsync everything appended so far (and new directory entries) now."""
        with self._lock:
            if self._closed:
                return
        self._sync()

    def _sync(self) -> None:
        # by path, through private descriptors: never races with rotation closing the
        # append descriptor, and the append lock is not held during the fsync itself
        with self._sync_lock:
            with self._lock:
                if self._store.fd < 0:
                    return
                paths, dir_dirty = self._store.sync_targets_locked()
            try:
                for path in paths:
                    with contextlib.suppress(FileNotFoundError):  # consumed and deleted
                        fsync_path(path)
                if dir_dirty:
                    fsync_dir(self._dir)
            except OSError as exc:
                failure = JournalIOError.wrap("journal fsync", exc)
                with self._lock:
                    self._fsync_failures += 1
                    self._sync_failure = failure.reason
                    self._store.sync_again_locked(paths, dir_dirty)  # the next pass retries them
                logger.error("journal: fsync of %s failed: %s", self._dir, exc)
                raise failure from exc
            with self._lock:
                self._store.fsyncs += 1
                self._sync_failure = None

    def _sync_loop(self) -> None:
        """INTERVAL mode: one fsync covers every append of the last interval."""
        interval = self._config.fsync_interval_s
        while not self._stop.wait(interval):
            with contextlib.suppress(JournalIOError):  # logged, counted; retried next interval
                self.sync()

    def close(self) -> None:
        """Refuse new work, stop the fsync thread, fsync, close descriptors. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with contextlib.suppress(JournalIOError):  # logged; must still release descriptors
            self._sync()
        with self._sync_lock, self._lock:
            self._store.close_locked()
            if self._lock_fd >= 0:
                os.close(self._lock_fd)  # closing the descriptor releases the flock
                self._lock_fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _first_checkpoint(directory: Path, consumer: str) -> None:
    """Give a new consumer a checkpoint file (seq 0) while the disk has room.

    On a full disk a checkpoint can only be rewritten in place, which needs a
    file to rewrite; a consumer whose first commit came after the disk filled
    could otherwise never commit, and so never free the disk. Best effort: an
    open on a full disk still succeeds.
    """
    try:
        write_checkpoint(directory, consumer, 0)
    except OSError as exc:
        logger.warning("journal: no first checkpoint for %s yet: %s", consumer, exc)


def _unlink_all(paths: list[Path], directory: Path) -> None:
    """Delete consumed segment files (already gone is fine) and make that durable."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    if paths:
        fsync_dir(directory)


def _mkdirs(directory: Path) -> Path:
    (directory / CHECKPOINT_DIR).mkdir(parents=True, exist_ok=True)
    return directory
