"""The segment files behind the ingest journal: recovery, appends, rotation, scans.

:class:`SegmentStore` is the file-side half of
:class:`~service.pipeline.journal.IngestJournal`; the journal keeps the policy
(bound, checkpoints, tail cache, waiting, fsync thread). The store is not
thread-safe by itself: methods named ``*_locked`` run under the journal's lock,
and the module functions :func:`read_spans` and :func:`locate` scan immutable
:class:`Span` snapshots *outside* it, so readers never hold up appenders while
they do file I/O.

Positions: every byte ever kept in the journal has a *logical position* (a
segment's ``logical_start`` plus the offset inside it). The bound and
``depth_bytes`` are differences of logical positions, which is what makes them
exact, headers included, and recoverable after a restart.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import time
from bisect import bisect_right
from pathlib import Path
from typing import NamedTuple

from service.pipeline.journal_format import (
    HEADER_SIZE,
    FrameError,
    JournalCorrupt,
    JournalIOError,
    JournalRecord,
    RecordKind,
    encode_header,
    find_valid_frame,
    fsync_dir,
    iter_frames,
    list_segments,
    segment_name,
)

logger = logging.getLogger("service.pipeline.journal")

_INDEX_STRIDE = 64 * 1024  # sparse seq -> offset index granularity inside a segment
_IOV_MAX = 1024  # writev limit on Linux; bigger batches are joined into one buffer


class FsyncMode(enum.StrEnum):
    """How much of the journal survives power loss (a process crash loses nothing)."""

    NEVER = "never"  # OS page cache only: survives process crash, not power loss
    INTERVAL = "interval"  # a background thread fsyncs every `fsync_interval_s` (batched)
    ALWAYS = "always"  # fsync before append returns


class Segment:
    """In-memory state of one segment file; mutated only under the journal lock."""

    __slots__ = ("base_seq", "idx_off", "idx_seq", "last_seq", "logical_start", "path", "size")

    def __init__(self, base_seq: int, path: Path, logical_start: int) -> None:
        self.base_seq = base_seq
        self.path = path
        self.size = 0
        self.last_seq = base_seq - 1
        self.logical_start = logical_start
        self.idx_seq: list[int] = [base_seq]  # sparse index: a record start every ~64 KiB,
        self.idx_off: list[int] = [0]  # so a read seeks instead of scanning the segment

    def note_record(self, seq: int, offset: int, size: int) -> None:
        if offset - self.idx_off[-1] >= _INDEX_STRIDE:
            self.idx_seq.append(seq)
            self.idx_off.append(offset)
        self.last_seq = seq
        self.size = offset + size

    def span_from(self, seq: int) -> Span:
        """Where to start scanning for record ``seq`` (or the first one after it)."""
        if seq <= self.base_seq:
            return Span(self.path, self.logical_start, 0, self.base_seq, self.size)
        i = bisect_right(self.idx_seq, seq) - 1
        return Span(self.path, self.logical_start, self.idx_off[i], self.idx_seq[i], self.size)


class Span(NamedTuple):
    """An immutable piece of a segment to scan outside the lock."""

    path: Path
    logical_start: int
    start_off: int
    start_seq: int
    end: int


# an accepted record: (seq, kind, payload, appended_at, logical end position)
Accepted = tuple[int, RecordKind, bytes, float, int]
# a record ready to write: (kind, payload, crc32(payload))
Prepared = tuple[RecordKind, bytes, int]


class SegmentStore:
    """Segments on disk plus the append descriptor of the active (last) one."""

    def __init__(self, directory: Path, segment_bytes: int, mode: FsyncMode) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.mode = mode
        self.segments: list[Segment] = []
        self.fd = -1
        self.next_seq = 1
        self.head_logical = 0
        self.dirty = False  # appended since the last fsync of the active segment
        self.dir_dirty = False  # a segment was created since the last directory fsync
        self.rotated_unsynced: list[Path] = []  # INTERVAL: rotated before the thread synced
        self.fsyncs = 0
        self.failed: BaseException | None = None  # ALWAYS mode: an fsync failed, for good
        self.torn = False  # a failed write could not be cut back yet: retried before the next

    # ------------------------------------------------------------------ recovery

    def recover(self, floor_seq: int) -> None:
        """Scan every segment, cut a torn tail, and open the active segment.

        Numbering resumes above both the last record and ``floor_seq`` (the highest
        checkpoint), so a seq is never handed out twice even if a power loss took
        journal pages that a durable checkpoint had already passed.
        """
        found = list_segments(self.directory)
        prev_last = 0
        for i, (base, path) in enumerate(found):
            if base <= prev_last:
                raise JournalCorrupt(path, 0, f"segment starts at {base} <= {prev_last}")
            seg = Segment(base, path, self.head_logical)
            self._scan(seg, last=i == len(found) - 1)
            self.segments.append(seg)
            self.head_logical += seg.size
            prev_last = max(prev_last, seg.last_seq)
        self.next_seq = max(prev_last, floor_seq) + 1
        active = self.segments[-1] if self.segments else None
        if active is not None and active.size == 0 and active.base_seq != self.next_seq:
            os.unlink(active.path)  # empty and misnamed: replace it by a correctly named one
            self.segments.pop()
            active = None
        if active is None or active.last_seq + 1 != self.next_seq:
            path = self.directory / segment_name(self.next_seq)  # seqs contiguous in a segment
            self.fd = _open_new_segment(path)
            self.segments.append(Segment(self.next_seq, path, self.head_logical))
        else:
            self.fd = os.open(active.path, os.O_WRONLY | os.O_APPEND)
        fsync_dir(self.directory)

    def _scan(self, seg: Segment, last: bool) -> None:
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

    # ------------------------------------------------------------------ append

    def check_writable_locked(self) -> None:
        """Raise :class:`JournalIOError` unless an append may be tried now.

        A failed fsync in ``ALWAYS`` mode is final. A failed write whose rollback
        also failed left a partial record at the end of the active segment: the
        cut is retried here, so the journal heals as soon as the disk lets it,
        and no record is ever written behind the partial one.
        """
        if self.failed is not None:
            raise JournalIOError(f"journal {self.directory} failed earlier: {self.failed}")
        if self.torn:
            seg = self.segments[-1]
            try:
                os.ftruncate(self.fd, seg.size)
            except OSError as exc:
                raise JournalIOError.wrap(f"cutting a partial record from {seg.path}", exc) from exc
            self.torn = False

    def append_one_locked(self, kind: RecordKind, payload: bytes, pcrc: int, size: int) -> Accepted:
        """Write one record (rotating first if it does not fit) with one writev."""
        seg = self.segments[-1]
        if seg.size and seg.size + size > self.segment_bytes:
            seg = self._rotate_locked()
        seq = self.next_seq
        ts = time.time()
        self._write_locked(seg, [encode_header(len(payload), pcrc, seq, kind, ts), payload], size)
        seg.note_record(seq, seg.size, size)
        self.next_seq = seq + 1
        self.head_logical += size
        self.dirty = True
        if self.mode is FsyncMode.ALWAYS:
            self._fdatasync_locked()
        return (seq, kind, payload, ts, self.head_logical)

    def append_batch_locked(self, items: list[Prepared], room: int) -> list[Accepted]:
        """Write the longest prefix of ``items`` that fits in ``room`` bytes.

        One write per segment touched. If a later write fails the exception
        propagates: the records already written stay journaled but unacked, which
        the idempotent downstream writes tolerate.
        """
        accepted: list[Accepted] = []
        ts = time.time()
        i = 0
        while i < len(items):
            seg = self.segments[-1]
            bufs: list[bytes] = []
            batch: list[tuple[int, RecordKind, bytes, int]] = []
            nbytes = 0
            seq = self.next_seq
            for kind, payload, pcrc in items[i:]:
                size = HEADER_SIZE + len(payload)
                if size > room:
                    break
                if seg.size + nbytes and seg.size + nbytes + size > self.segment_bytes:
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
                self.head_logical += size
                accepted.append((seq, kind, payload, ts, self.head_logical))
            self.next_seq = batch[-1][0] + 1
            self.dirty = True
            i += len(batch)
        if accepted and self.mode is FsyncMode.ALWAYS:
            self._fdatasync_locked()
        return accepted

    def _write_locked(self, seg: Segment, bufs: list[bytes], nbytes: int) -> None:
        """Write whole records at the end of the active segment, or roll back and raise.

        A short write is completed (O_APPEND keeps it contiguous: we hold the
        lock); on an error the file is cut back to its last complete record, so a
        failed write never strands garbage in front of later acked records.
        """
        try:
            if len(bufs) <= _IOV_MAX:
                written = os.writev(self.fd, bufs)
            else:
                bufs = [b"".join(bufs)]
                written = os.write(self.fd, bufs[0])
            if written != nbytes:
                rest = memoryview(b"".join(bufs))[written:]
                while rest:
                    rest = rest[os.write(self.fd, rest) :]
        except OSError as exc:
            try:
                os.ftruncate(self.fd, seg.size)
            except OSError as exc2:
                self.torn = True  # check_writable_locked retries the cut before any write
                logger.error("journal: cannot roll back failed write in %s: %s", seg.path, exc2)
            raise JournalIOError.wrap(f"journal write to {seg.path}", exc) from exc

    def _fdatasync_locked(self) -> None:
        try:
            os.fdatasync(self.fd)
        except OSError as exc:
            self.failed = exc  # the durability ALWAYS promises is gone: stop acking
            raise JournalIOError.wrap("journal fsync", exc) from exc
        self.fsyncs += 1
        self.dirty = False

    def _rotate_locked(self) -> Segment:
        """Start a new segment; in INTERVAL mode the old one is fsynced by the thread.

        All or nothing: if the file cannot be created, opened or (``ALWAYS``) made
        durable, :class:`JournalIOError` is raised and the old segment stays the
        active one, so the in-memory segment list always matches the descriptor
        that appends go to, and the next append simply tries again.
        """
        if self.mode is FsyncMode.ALWAYS and self.dirty:
            self._fdatasync_locked()  # an append_many batch spanning segments
        path = self.directory / segment_name(self.next_seq)
        fd = _open_new_segment(path)
        if self.mode is FsyncMode.ALWAYS:
            try:
                fsync_dir(self.directory)
            except OSError as exc:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise JournalIOError.wrap(f"creating journal segment {path}", exc) from exc
        else:
            self.dir_dirty = True
        if self.mode is FsyncMode.INTERVAL and self.dirty:
            self.rotated_unsynced.append(self.segments[-1].path)
        seg = Segment(self.next_seq, path, self.head_logical)
        self.segments.append(seg)
        os.close(self.fd)
        self.fd = fd
        self.dirty = False
        return seg

    def reclaim_active_locked(self, floor: int) -> list[Path]:
        """Segments to delete once the active one is wholly consumed: room on a full disk.

        Consumed segments are deleted as consumers commit, except the active one,
        which would only go once it fills and rotates -- and on a disk the
        journal itself filled, it cannot fill. So when every record in it is at
        or below ``floor`` (every consumer's checkpoint) a fresh segment takes
        over and the old one is returned for deletion. The caller unlinks the
        paths (the records are consumed: readers skip missing files).
        """
        active = self.segments[-1]
        if active.size == 0 or active.last_seq > floor:
            return []
        self._rotate_locked()
        return self.pop_consumed_locked(floor)

    # ------------------------------------------------------------------ housekeeping

    def read_spans_locked(self, after: int, want: int) -> list[Span]:
        """Spans holding the (up to) ``want`` records after ``after``."""
        spans: list[Span] = []
        for seg in self.segments:
            if seg.last_seq > after:
                spans.append(seg.span_from(after + 1))
                want -= seg.last_seq - max(after, seg.base_seq - 1)
                if want <= 0:
                    break
        return spans

    def pos_plan_locked(self, seq: int) -> int | Span:
        """Logical position right after every record <= ``seq``, or a span to scan for it."""
        if seq >= self.next_seq - 1:
            return self.head_logical
        for seg in self.segments:
            if seg.last_seq > seq:
                return seg.logical_start if seq < seg.base_seq else seg.span_from(seq)
        return self.head_logical

    def pop_consumed_locked(self, floor: int) -> list[Path]:
        """Forget segments every consumer has passed (never the active one)."""
        gone: list[Path] = []
        while len(self.segments) > 1 and self.segments[0].last_seq <= floor:
            gone.append(self.segments.pop(0).path)
        return gone

    def sync_targets_locked(self) -> tuple[list[Path], bool]:
        """Files and whether the directory need an fsync to cover every append so far."""
        if self.mode is FsyncMode.NEVER:
            paths = [s.path for s in self.segments]  # rotations are not tracked
        else:
            paths = self.rotated_unsynced
            if self.dirty:
                paths.append(self.segments[-1].path)
        self.rotated_unsynced = []
        self.dirty = False
        dir_dirty, self.dir_dirty = self.dir_dirty, False
        return paths, dir_dirty

    def sync_again_locked(self, paths: list[Path], dir_dirty: bool) -> None:
        """Put back what a failed fsync pass took, so the next pass covers it again."""
        self.rotated_unsynced = list(dict.fromkeys(paths + self.rotated_unsynced))
        self.dir_dirty = self.dir_dirty or dir_dirty

    def close_locked(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _open_new_segment(path: Path) -> int:
    """The append descriptor of a new, empty segment file at ``path``.

    An empty file already there (left by an attempt that failed after creating
    it) is taken over; one with records in it never is.
    """
    flags = os.O_WRONLY | os.O_APPEND
    try:
        try:
            return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if os.stat(path).st_size:
                raise JournalCorrupt(path, 0, "a new segment's name is taken") from None
            return os.open(path, flags)
    except OSError as exc:
        raise JournalIOError.wrap(f"creating journal segment {path}", exc) from exc


def read_spans(spans: list[Span], after: int, want: int) -> list[JournalRecord]:
    """Up to ``want`` records with seq > ``after`` from ``spans``; runs outside the lock."""
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


def locate(span: Span, seq: int) -> int:
    """Scan ``span`` for record ``seq``; the logical position right after it."""
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
