"""The durable, bounded ingest journal: what an ingest ack means.

Ingest parses and validates a request, appends its serialized bytes here, and
acks; the scorer consumes the journal in micro-batches and commits a checkpoint
after its database commit; a restart resumes after the checkpoint. There is no
well-kept PyPI library that offers a crash-safe, bounded, multi-consumer segment
journal with checkpoints inside a Python process (Kafka/Redpanda are servers,
the SQLite/LMDB queues add a database on the ack path and share neither the
bound nor the recovery rules we need), so this is written by hand on the stdlib.
The file format lives in :mod:`service.pipeline.journal_format`.

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
  consumers commit. Disk use is at most ``max_bytes`` plus one segment.
* **Damage that is not a torn tail** (a bad record in a non-last segment, or a
  bad record followed by valid ones) raises :class:`JournalCorrupt` on open,
  naming file and offset, instead of dropping acknowledged data.

Cost: an append is a CRC of the payload (outside the lock), a 32-byte header, one
``writev`` and some bookkeeping under a ``threading.Lock``; no fsync unless
``ALWAYS``. That is safe to call straight from an asyncio event loop in the
``NEVER``/``INTERVAL`` modes (a page-cache write); in ``ALWAYS`` mode call it
via ``asyncio.to_thread``. One process may hold a journal directory at a time
(``flock`` on ``LOCK``; the kernel releases it if the process dies).
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import logging
import os
import re
import threading
import time
import zlib
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import NamedTuple, Self

from service.pipeline.journal_format import (
    CHECKPOINT_DIR,
    HEADER_SIZE,
    LOCK_FILE,
    MAX_PAYLOAD,
    FrameError,
    JournalCorrupt,
    JournalError,
    JournalRecord,
    RecordKind,
    all_checkpoints,
    encode_header,
    find_valid_frame,
    fsync_dir,
    fsync_path,
    iter_frames,
    list_segments,
    read_all,
    segment_name,
    write_checkpoint,
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

_INDEX_STRIDE = 64 * 1024  # sparse seq->offset index granularity inside a segment
_IOV_MAX = 1024
_CONSUMER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class FsyncMode(enum.StrEnum):
    """How much of the journal survives power loss (a process crash loses nothing)."""

    NEVER = "never"  # OS page cache only: survives process crash, not power loss
    INTERVAL = "interval"  # a background thread fsyncs every `fsync_interval_s` (batched)
    ALWAYS = "always"  # fsync before append returns


@dataclass(frozen=True)
class JournalConfig:
    """Where the journal lives and how big and how durable it is."""

    directory: Path
    segment_bytes: int = 64 * 1024 * 1024
    max_bytes: int = 1024 * 1024 * 1024  # bound on unconsumed bytes (head minus slowest ckpt)
    fsync_mode: FsyncMode = FsyncMode.INTERVAL
    fsync_interval_s: float = 0.05
    tail_cache_bytes: int = 64 * 1024 * 1024  # recent records kept in memory for readers

    def __post_init__(self) -> None:
        if self.segment_bytes <= HEADER_SIZE:
            raise ValueError(f"segment_bytes must exceed {HEADER_SIZE}")
        if self.max_bytes <= 0 or self.tail_cache_bytes < 0:
            raise ValueError("max_bytes must be positive and tail_cache_bytes non-negative")
        if not self.fsync_interval_s > 0:
            raise ValueError("fsync_interval_s must be positive")
        object.__setattr__(self, "fsync_mode", FsyncMode(self.fsync_mode))


class JournalClosed(JournalError):
    """The journal was closed; it accepts and serves nothing more."""


class JournalLocked(JournalError):
    """Another open journal (this or another process) holds the directory."""


class JournalIOError(JournalError):
    """A write or fsync failed; the record was not acknowledged (not the same as full)."""


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


class _Segment:
    """In-memory state of one segment file; mutated only under the journal lock."""

    __slots__ = ("base_seq", "idx_off", "idx_seq", "last_seq", "logical_start", "path", "size")

    def __init__(self, base_seq: int, path: Path, logical_start: int) -> None:
        self.base_seq = base_seq
        self.path = path
        self.size = 0
        self.last_seq = base_seq - 1
        self.logical_start = logical_start  # position of byte 0 in the journal's byte stream
        self.idx_seq: list[int] = [base_seq]  # sparse index: a record start every ~64 KiB
        self.idx_off: list[int] = [0]

    def note_record(self, seq: int, offset: int, size: int) -> None:
        if offset - self.idx_off[-1] >= _INDEX_STRIDE:
            self.idx_seq.append(seq)
            self.idx_off.append(offset)
        self.last_seq = seq
        self.size = offset + size

    def start_for(self, seq: int) -> tuple[int, int]:
        """(offset, seq) of an indexed record at or before ``seq`` (base <= seq)."""
        i = bisect_right(self.idx_seq, seq) - 1
        return self.idx_off[i], self.idx_seq[i]


class _Span(NamedTuple):
    """A piece of a segment to scan outside the lock."""

    path: Path
    logical_start: int
    start_off: int
    start_seq: int
    end: int


# cache entry: (seq, kind, payload, appended_at, logical end position)
_CacheEntry = tuple[int, RecordKind, bytes, float, int]


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
        self._dir = Path(config.directory)
        self._mode = config.fsync_mode
        self._segment_bytes = config.segment_bytes
        self._max_bytes = config.max_bytes
        self._cache_limit = config.tail_cache_bytes
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._commit_lock = threading.Lock()  # serializes commits: the only segment deleter
        self._sync_lock = threading.Lock()
        self._waiters = 0
        self._closed = False
        self._failed: BaseException | None = None
        self._segments: list[_Segment] = []
        self._fd = -1
        self._next_seq = 1
        self._head_logical = 0
        self._ckpt: dict[str, int] = {}
        self._pos: dict[str, int] = {}  # consumer -> logical position after its checkpoint
        self._min_pos = 0
        self._cache: list[_CacheEntry] = []
        self._cache_start = 0
        self._cache_bytes = 0
        self._dirty = False
        self._dir_dirty = False
        self._rotated_unsynced: list[Path] = []
        self._appended = 0
        self._shed = 0
        self._fsyncs = 0
        self._fsync_failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock_fd = -1
        self._open(list(dict.fromkeys(consumers)))

    # ------------------------------------------------------------------ recovery

    def _open(self, consumers: list[str]) -> None:
        (self._dir / CHECKPOINT_DIR).mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self._dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise JournalLocked(f"journal {self._dir} is open elsewhere") from None
        try:
            self._recover(consumers)
        except BaseException:
            self._release_fds()
            raise
        if self._mode is FsyncMode.INTERVAL:
            self._thread = threading.Thread(
                target=self._sync_loop, name=f"journal-fsync:{self._dir.name}", daemon=True
            )
            self._thread.start()

    def _recover(self, consumers: list[str]) -> None:
        stored = all_checkpoints(self._dir)
        self._ckpt = {c: stored.get(c, 0) for c in consumers}
        found = list_segments(self._dir)
        logical = 0
        prev_last = 0
        for i, (base, path) in enumerate(found):
            seg = _Segment(base, path, logical)
            if base <= prev_last:
                raise JournalCorrupt(path, 0, f"segment starts at {base} <= {prev_last}")
            self._scan_segment(seg, last=i == len(found) - 1)
            self._segments.append(seg)
            logical += seg.size
            prev_last = max(prev_last, seg.last_seq)
        self._head_logical = logical
        self._next_seq = max([prev_last, *stored.values()]) + 1
        active = self._segments[-1] if self._segments else None
        if active is not None and active.size == 0 and active.base_seq != self._next_seq:
            os.unlink(active.path)  # empty and misnamed: replace it with a correctly named one
            self._segments.pop()
            active = None
        if active is None or active.last_seq + 1 != self._next_seq:
            active = self._create_segment()
        self._fd = os.open(active.path, os.O_WRONLY | os.O_APPEND)
        fsync_dir(self._dir)
        for consumer, seq in self._ckpt.items():
            found_pos = self._pos_plan_locked(seq)
            self._pos[consumer] = (
                found_pos if isinstance(found_pos, int) else self._locate(found_pos, seq)
            )
        self._min_pos = min(self._pos.values())

    def _scan_segment(self, seg: _Segment, last: bool) -> None:
        fd = os.open(seg.path, os.O_RDWR if last else os.O_RDONLY)
        try:
            end = os.fstat(fd).st_size
            try:
                for f in iter_frames(fd, 0, end, seg.base_seq):
                    seg.note_record(f.seq, f.offset, f.size)
                if not last and seg.size == 0:
                    raise JournalCorrupt(seg.path, 0, "empty segment before later ones")
            except FrameError as exc:
                if not last:
                    raise JournalCorrupt(seg.path, exc.offset, exc.reason) from None
                later = find_valid_frame(fd, exc.offset, end, seg.last_seq)
                if later is not None:
                    raise JournalCorrupt(
                        seg.path, exc.offset, f"{exc.reason}, but a valid record follows at {later}"
                    ) from None
                logger.warning(
                    "journal: truncating torn tail of %s at offset %d (%s; %d bytes dropped)",
                    seg.path,
                    exc.offset,
                    exc.reason,
                    end - exc.offset,
                )
                os.ftruncate(fd, exc.offset)
                os.fsync(fd)
        finally:
            os.close(fd)

    def _create_segment(self) -> _Segment:
        """Create the next segment file, named after the seq it will start with."""
        path = self._dir / segment_name(self._next_seq)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.close(fd)
        seg = _Segment(self._next_seq, path, self._head_logical)
        self._segments.append(seg)
        return seg

    # ------------------------------------------------------------------ append

    def append(self, kind: RecordKind, payload: bytes) -> int | None:
        """Journal one record; its seq, or ``None`` when shed because the journal is full.

        When this returns a seq the record survives a process crash (and power loss
        per the fsync mode). Raises :class:`JournalIOError` if the write failed and
        :class:`JournalClosed` after :meth:`close`.
        """
        if payload.__class__ is not bytes:
            payload = bytes(payload)  # never cache a buffer the caller may mutate
        if kind.__class__ is not RecordKind:
            kind = RecordKind(kind)
        n = len(payload)
        if n > MAX_PAYLOAD:
            raise ValueError("payload too large for one journal record")
        size = HEADER_SIZE + n
        pcrc = zlib.crc32(payload)
        with self._lock:
            if self._closed or self._failed is not None:
                self._raise_unwritable()
            if self._head_logical - self._min_pos + size > self._max_bytes:
                self._shed += 1
                return None
            seg = self._segments[-1]
            if seg.size and seg.size + size > self._segment_bytes:
                seg = self._rotate_locked()
            seq = self._next_seq
            ts = time.time()
            self._write_locked(seg, [encode_header(n, pcrc, seq, kind, ts), payload], size)
            offset = seg.size
            seg.note_record(seq, offset, size)
            self._next_seq = seq + 1
            self._head_logical += size
            self._appended += 1
            self._dirty = True
            if self._cache_limit:
                self._cache.append((seq, kind, payload, ts, self._head_logical))
                self._cache_bytes += size
                if self._cache_bytes > self._cache_limit:
                    self._evict_cache_locked(0)
            if self._mode is FsyncMode.ALWAYS:
                self._fdatasync_locked()
            if self._waiters:
                self._cond.notify_all()
            return seq

    def append_many(self, items: Sequence[tuple[RecordKind, bytes]]) -> list[int | None]:
        """Journal a batch (e.g. one gRPC stream read) with one lock hold and one write.

        Order is kept and seqs are contiguous. When the bound is hit, the accepted
        records are a prefix and the rest are shed (``None``), which is what a
        cumulative stream ack needs. A batch crossing a segment boundary costs
        one write per segment it touches.
        """
        prepared: list[tuple[RecordKind, bytes, int]] = []
        for kind, payload in items:
            if payload.__class__ is not bytes:
                payload = bytes(payload)
            if kind.__class__ is not RecordKind:
                kind = RecordKind(kind)
            if len(payload) > MAX_PAYLOAD:
                raise ValueError("payload too large for one journal record")
            prepared.append((kind, payload, zlib.crc32(payload)))
        results: list[int | None] = [None] * len(prepared)
        if not prepared:
            return results
        with self._lock:
            if self._closed or self._failed is not None:
                self._raise_unwritable()
            ts = time.time()
            room = self._max_bytes - (self._head_logical - self._min_pos)
            i = 0
            while i < len(prepared):
                seg = self._segments[-1]
                bufs: list[bytes] = []
                batch: list[tuple[int, RecordKind, bytes, int]] = []
                nbytes = 0
                seq = self._next_seq
                for kind, payload, pcrc in prepared[i:]:
                    size = HEADER_SIZE + len(payload)
                    if size > room:
                        break
                    if seg.size + nbytes and seg.size + nbytes + size > self._segment_bytes:
                        if batch:
                            break  # write what fits in this segment first
                        seg = self._rotate_locked()
                    bufs.append(encode_header(len(payload), pcrc, seq, kind, ts))
                    bufs.append(payload)
                    batch.append((seq, kind, payload, size))
                    nbytes += size
                    room -= size
                    seq += 1
                if not batch:
                    break
                self._write_locked(seg, bufs, nbytes)
                for seq, kind, payload, size in batch:
                    seg.note_record(seq, seg.size, size)
                    self._head_logical += size
                    if self._cache_limit:
                        self._cache.append((seq, kind, payload, ts, self._head_logical))
                        self._cache_bytes += size
                    results[i] = seq
                    i += 1
                self._next_seq = batch[-1][0] + 1
                self._appended += len(batch)
                self._dirty = True
            self._shed += len(prepared) - i
            if i:
                if self._cache_bytes > self._cache_limit:
                    self._evict_cache_locked(0)
                if self._mode is FsyncMode.ALWAYS:
                    self._fdatasync_locked()
                if self._waiters:
                    self._cond.notify_all()
        return results

    def _raise_unwritable(self) -> None:
        if self._closed:
            raise JournalClosed(f"journal {self._dir} is closed")
        raise JournalIOError(f"journal {self._dir} failed earlier: {self._failed}")

    def _write_locked(self, seg: _Segment, bufs: list[bytes], nbytes: int) -> None:
        """Write whole records at the end of the active segment, or roll back and raise.

        A short write is completed (O_APPEND keeps it contiguous: we hold the
        lock); on an error the file is cut back to its last complete record so a
        failed write can never strand garbage in front of later acked records.
        """
        try:
            if len(bufs) <= _IOV_MAX:
                written = os.writev(self._fd, bufs)
            else:
                bufs = [b"".join(bufs)]
                written = os.write(self._fd, bufs[0])
            if written != nbytes:
                rest = memoryview(b"".join(bufs))[written:]
                while rest:
                    rest = rest[os.write(self._fd, rest) :]
        except OSError as exc:
            try:
                os.ftruncate(self._fd, seg.size)
            except OSError as exc2:
                self._failed = exc2
                logger.error("journal: cannot roll back failed write in %s: %s", seg.path, exc2)
            raise JournalIOError(f"journal write to {seg.path} failed: {exc}") from exc

    def _fdatasync_locked(self) -> None:
        try:
            os.fdatasync(self._fd)
            self._fsyncs += 1
            self._dirty = False
        except OSError as exc:
            self._fsync_failures += 1
            self._failed = exc  # the durability promised by ALWAYS is gone: stop acking
            raise JournalIOError(f"journal fsync failed: {exc}") from exc

    def _rotate_locked(self) -> _Segment:
        """Start a new segment. Never fsyncs the old one here in INTERVAL mode (ack path)."""
        old = self._segments[-1]
        if self._mode is FsyncMode.ALWAYS and self._dirty:
            self._fdatasync_locked()  # an append_many batch spanning segments
        elif self._mode is FsyncMode.INTERVAL and self._dirty:
            self._rotated_unsynced.append(old.path)
        seg = self._create_segment()
        fd = os.open(seg.path, os.O_WRONLY | os.O_APPEND)
        os.close(self._fd)
        self._fd = fd
        self._dirty = False
        if self._mode is FsyncMode.ALWAYS:
            fsync_dir(self._dir)
        else:
            self._dir_dirty = True
        return seg

    def _evict_cache_locked(self, upto_seq: int) -> None:
        """Drop cached records over the byte budget or at/below ``upto_seq``."""
        cache, i = self._cache, self._cache_start
        while i < len(cache) and (self._cache_bytes > self._cache_limit or cache[i][0] <= upto_seq):
            self._cache_bytes -= HEADER_SIZE + len(cache[i][2])
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

        In seq order; fewer only when fewer exist. Recent records come from an
        in-memory tail cache; older ones (and everything after a restart) are read
        from the segment files outside the append lock. Records at or below every
        consumer's checkpoint may already be deleted and are then skipped.
        """
        with self._lock:
            self._check_open_locked()
            after = self._consumer_ckpt(consumer) if after_seq is None else after_seq
        out: list[JournalRecord] = []
        while len(out) < max_records:
            want = max_records - len(out)
            chunk: list[_CacheEntry] = []
            spans: list[_Span] = []
            with self._lock:
                self._check_open_locked()
                if after >= self._next_seq - 1:
                    break
                c, s = self._cache, self._cache_start
                if s < len(c) and c[s][0] <= after + 1:
                    i = s + (after + 1 - c[s][0])
                    chunk = c[i : i + want]
                else:
                    spans = self._read_spans_locked(after, want)
            if chunk:
                out.extend(JournalRecord(q, k, p, t) for q, k, p, t, _ in chunk)
            else:
                got = self._read_spans(spans, after, want)
                if not got:
                    break
                out.extend(got)
            after = out[-1].seq
        return out

    def _read_spans_locked(self, after: int, want: int) -> list[_Span]:
        spans: list[_Span] = []
        for seg in self._segments:
            if seg.last_seq <= after:
                continue
            if after + 1 <= seg.base_seq:
                off, seq = 0, seg.base_seq
            else:
                off, seq = seg.start_for(after + 1)
            spans.append(_Span(seg.path, seg.logical_start, off, seq, seg.size))
            want -= seg.last_seq - max(after, seg.base_seq - 1)
            if want <= 0:
                break
        return spans

    def _read_spans(self, spans: list[_Span], after: int, want: int) -> list[JournalRecord]:
        out: list[JournalRecord] = []
        for span in spans:
            try:
                fd = os.open(span.path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # deleted by a commit meanwhile: every consumer is past it
            try:
                for f in iter_frames(fd, span.start_off, span.end, span.start_seq):
                    if f.seq > after:
                        out.append(JournalRecord(f.seq, RecordKind(f.kind), bytes(f.payload), f.ts))
                        if len(out) >= want:
                            return out
            except FrameError as exc:
                raise JournalCorrupt(span.path, exc.offset, exc.reason) from None
            finally:
                os.close(fd)
        return out

    def wait_for_records(self, consumer: str, timeout: float, after_seq: int | None = None) -> bool:
        """Block until a record after the checkpoint (or ``after_seq``) exists, or timeout.

        Lets the scorer sleep while ingest is idle instead of polling; returns
        whether such a record exists (``False`` on timeout or close).
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            pos = self._consumer_ckpt(consumer) if after_seq is None else after_seq
            while self._next_seq - 1 <= pos and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._waiters += 1
                try:
                    self._cond.wait(remaining)
                finally:
                    self._waiters -= 1
            return self._next_seq - 1 > pos and not self._closed

    # ------------------------------------------------------------------ checkpoints

    def commit(self, consumer: str, seq: int) -> None:
        """Durably record that ``consumer`` is done with every record up to ``seq``.

        Returns once the checkpoint survives power loss; then deletes segments that
        every consumer has passed (freeing journal room). Commits must not move
        backwards; committing the current checkpoint again is a no-op.
        """
        with self._commit_lock:
            with self._lock:
                self._check_open_locked()
                cur = self._consumer_ckpt(consumer)
                if seq < cur:
                    raise ValueError(
                        f"commit {seq} for {consumer!r} is behind its checkpoint {cur}"
                    )
                if seq > self._next_seq - 1:
                    raise ValueError(f"commit {seq} beyond head {self._next_seq - 1}")
                if seq == cur:
                    return
                plan = self._pos_plan_locked(seq)
            pos = plan if isinstance(plan, int) else self._locate(plan, seq)
            write_checkpoint(self._dir, consumer, seq)
            with self._lock:
                self._ckpt[consumer] = seq
                self._pos[consumer] = pos
                self._min_pos = min(self._pos.values())
                floor = min(self._ckpt.values())
                doomed: list[_Segment] = []
                while len(self._segments) > 1 and self._segments[0].last_seq <= floor:
                    doomed.append(self._segments.pop(0))
                if self._cache_limit:
                    self._evict_cache_locked(floor)
                if self._waiters:
                    self._cond.notify_all()
            for seg in doomed:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(seg.path)
            if doomed:
                fsync_dir(self._dir)

    def checkpoint(self, consumer: str) -> int:
        """Last committed seq of ``consumer`` (0 before its first commit)."""
        with self._lock:
            return self._consumer_ckpt(consumer)

    def _consumer_ckpt(self, consumer: str) -> int:
        try:
            return self._ckpt[consumer]
        except KeyError:
            raise KeyError(f"unknown journal consumer {consumer!r}") from None

    def _pos_plan_locked(self, seq: int) -> int | _Span:
        """Logical position just after every record <= ``seq``, or a span to scan for it."""
        if seq >= self._next_seq - 1:
            return self._head_logical
        c, s = self._cache, self._cache_start
        if s < len(c) and c[s][0] <= seq:
            return c[s + seq - c[s][0]][4]
        for seg in self._segments:
            if seg.last_seq > seq:
                if seq < seg.base_seq:
                    return seg.logical_start
                off, first = seg.start_for(seq)
                return _Span(seg.path, seg.logical_start, off, first, seg.size)
        return self._head_logical

    def _locate(self, span: _Span, seq: int) -> int:
        """Scan ``span`` for record ``seq``; the logical position after it."""
        fd = os.open(span.path, os.O_RDONLY)
        try:
            for f in iter_frames(fd, span.start_off, span.end, span.start_seq):
                if f.seq == seq:
                    return span.logical_start + f.offset + f.size
        except FrameError as exc:
            raise JournalCorrupt(span.path, exc.offset, exc.reason) from None
        finally:
            os.close(fd)
        raise JournalCorrupt(span.path, span.end, f"record {seq} not found")

    # ------------------------------------------------------------------ state

    @property
    def head_seq(self) -> int:
        """The last seq handed out (0 for a new journal)."""
        return self._next_seq - 1

    def depth_records(self, consumer: str | None = None) -> int:
        """Seqs after ``consumer``'s checkpoint (default: the slowest consumer's)."""
        with self._lock:
            base = min(self._ckpt.values()) if consumer is None else self._consumer_ckpt(consumer)
            return max(0, self._next_seq - 1 - base)

    @property
    def depth_bytes(self) -> int:
        """Unconsumed bytes, headers included: what the ``max_bytes`` bound applies to."""
        with self._lock:
            return self._head_logical - self._min_pos

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
            return JournalStats(
                head_seq=self._next_seq - 1,
                depth_records=max(0, self._next_seq - 1 - min(self._ckpt.values())),
                depth_bytes=self._head_logical - self._min_pos,
                capacity_bytes=self._max_bytes,
                appended_total=self._appended,
                shed_total=self._shed,
                segments=len(self._segments),
                fsyncs_total=self._fsyncs,
                fsync_failures_total=self._fsync_failures,
                cached_records=len(self._cache) - self._cache_start,
            )

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
        with self._sync_lock:
            with self._lock:
                if self._fd < 0:
                    return
                if self._mode is FsyncMode.NEVER:
                    paths = [s.path for s in self._segments]  # rotations are not tracked
                else:
                    paths = self._rotated_unsynced
                    if self._dirty:
                        paths.append(self._segments[-1].path)
                self._rotated_unsynced = []
                self._dirty = False
                dir_dirty, self._dir_dirty = self._dir_dirty, False
            try:
                for path in paths:
                    with contextlib.suppress(FileNotFoundError):  # consumed and deleted
                        fsync_path(path)
                if dir_dirty:
                    fsync_dir(self._dir)
            except OSError as exc:
                with self._lock:
                    self._fsync_failures += 1
                logger.error("journal: fsync of %s failed: %s", self._dir, exc)
                raise JournalIOError(f"journal fsync failed: {exc}") from exc
            with self._lock:
                self._fsyncs += 1

    def _sync_loop(self) -> None:
        """INTERVAL mode: batch the fsyncs of every append in the last interval."""
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
            self._release_fds()

    def _release_fds(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
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
