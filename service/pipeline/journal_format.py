"""On-disk format of the ingest journal: record framing, segment scanning, checkpoints.

This module is the part of the journal that is pure file format, so that the
engine (:mod:`service.pipeline.journal`) stays about concurrency and policy, and
so that an offline reader (:func:`read_all`, used by tests that SIGKILL a server
and by operators inspecting a journal directory) shares exactly one parser with
recovery.

Layout of a journal directory::

    00000000000000000001.seg     segment, named by the seq of its first record
    00000000000000004711.seg     (seqs are contiguous inside one segment)
    checkpoints/scorer           {"consumer": "scorer", "seq": 4700}
    LOCK                         flock'd by the process that has the journal open

A record is a fixed 32-byte little-endian header followed by the payload::

    magic  4s  b"UJR1"
    crc    u32 crc32(payload, then header bytes 8..32: length, seq, kind, timestamp)
    length u32 payload length
    seq    u64 global sequence number
    kind   u16 RecordKind
    pad    2 bytes, zero
    ts     f64 time.time() at append

The CRC covers every header field after itself plus the payload, so a torn
write, a zero-filled block after power loss, or a flipped bit is detected; the
payload CRC is computed first so the engine can do that part outside its lock.

The CRC is the standard CRC-32 of zlib (:data:`crc32`): zlib-ng's carry-less
multiply implementation when the ``zlib-ng`` package is installed (a dependency;
~3 µs for a 225 KB batch record where zlib 1.2.13 takes ~45 µs, which was half
of an append), zlib's otherwise. Both give the same values, so journals written
with either read with the other (``tests/pipeline/test_journal_format.py``).
"""

from __future__ import annotations

import enum
import errno
import json
import logging
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

try:  # the same CRC-32 values as zlib.crc32, ~15x faster (PCLMULQDQ / VPCLMULQDQ folding)
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - zlib-ng is a dependency; stay correct without it
    from zlib import crc32

__all__ = [
    "HEADER_SIZE",
    "MAGIC",
    "FrameError",
    "JournalClosed",
    "JournalCorrupt",
    "JournalError",
    "JournalIOError",
    "JournalLocked",
    "JournalRecord",
    "RecordKind",
    "crc32",
    "read_all",
]

logger = logging.getLogger("service.pipeline.journal")

MAGIC = b"UJR1"
HEADER = struct.Struct("<4sIIQH2xd")
HEADER_SIZE = HEADER.size  # 32
PREFIX = struct.Struct("<4sI")  # magic, crc
FIELDS = struct.Struct("<IQH2xd")  # length, seq, kind, ts: the CRC'd header part
CRC_FIELDS_OFFSET = PREFIX.size  # 8
MAX_PAYLOAD = 0xFFFFFFFF
SEGMENT_SUFFIX = ".seg"
SEQ_DIGITS = 20
CHECKPOINT_DIR = "checkpoints"
LOCK_FILE = "LOCK"
_SEGMENT_RE = re.compile(rf"^(\d{{{SEQ_DIGITS}}})\.seg$")
_READ_CHUNK = 1 << 20


class RecordKind(enum.IntEnum):
    """What a journaled payload is; the scorer dispatches on it."""

    MIRROR = 1
    OUTCOME = 2
    MIRROR_BATCH = 3  # accepted rows of one MirrorBatch (service.pipeline.batch_record)
    OUTCOME_BATCH = 4  # accepted rows of one OutcomeBatch


_KIND_VALUES = frozenset(int(k) for k in RecordKind)


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One acknowledged ingest request, as a consumer sees it.

    ``decoded`` is the contract object ingest already built from ``payload``,
    when it is still in memory (see `IngestJournal.append`); consumers fall
    back to decoding ``payload`` when it is None. Not part of equality.
    """

    seq: int
    kind: RecordKind
    payload: bytes
    appended_at: float
    decoded: object = field(default=None, compare=False, repr=False)


class JournalError(Exception):
    """Base of every error the ingest journal raises."""


class JournalCorrupt(JournalError):
    """A segment holds a damaged record where acknowledged data must be.

    Raised instead of silently dropping data: recovery only truncates a torn
    *tail* (nothing valid after the damage). ``path`` and ``offset`` name the
    first bad byte so an operator can inspect or cut the file by hand.
    """

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        super().__init__(f"corrupt journal segment {path} at offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class JournalClosed(JournalError):
    """The journal was closed; it accepts and serves nothing more."""


class JournalLocked(JournalError):
    """Another open journal (this or another process) holds the directory."""


class JournalIOError(JournalError):
    """A write, fsync or segment creation failed; the record was not acknowledged.

    Not the same as full (the bound): ingest sheds both, with different reasons.
    The message names the file for the operator's log; ``errno`` and
    :attr:`reason` carry what may be shown to clients and probes, which must
    never see a path.
    """

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno

    @property
    def reason(self) -> str:
        """What failed, without any path: ``"no space left on device"``, say."""
        if self.errno is None:
            return "journal unwritable"
        return os.strerror(self.errno).lower()

    @classmethod
    def wrap(cls, what: str, exc: OSError) -> JournalIOError:
        """``what`` failed because of ``exc``: the message for the log, the errno kept."""
        return cls(f"{what} failed: {exc}", exc.errno)


class FrameError(Exception):
    """Internal: the frame at ``offset`` is not a valid record (torn or corrupt)."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


class Frame(NamedTuple):
    """A validated record as found in a segment; ``payload`` is a view into a read buffer."""

    offset: int
    size: int
    seq: int
    kind: int
    ts: float
    payload: memoryview


def encode_header(payload_len: int, payload_crc: int, seq: int, kind: int, ts: float) -> bytes:
    """Build the 32-byte header; ``payload_crc`` is ``crc32(payload)``."""
    fields = FIELDS.pack(payload_len, seq, kind, ts)
    return PREFIX.pack(MAGIC, crc32(fields, payload_crc)) + fields


def segment_name(first_seq: int) -> str:
    """File name of the segment whose first record has ``first_seq``."""
    return f"{first_seq:0{SEQ_DIGITS}d}{SEGMENT_SUFFIX}"


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """(first seq, path) of every segment file in ``directory``, in seq order."""
    found: list[tuple[int, Path]] = []
    for entry in os.scandir(directory):
        m = _SEGMENT_RE.match(entry.name)
        if m is not None and entry.is_file():
            found.append((int(m.group(1)), Path(entry.path)))
    found.sort()
    return found


def _pread_exact(fd: int, offset: int, size: int) -> bytes:
    """Read up to ``size`` bytes at ``offset``; shorter only at end of file."""
    data = os.pread(fd, size, offset)
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = os.pread(fd, size - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def iter_frames(fd: int, start: int, end: int, expect_seq: int | None) -> Iterator[Frame]:
    """Yield the valid records in ``[start, end)`` of a segment, in order.

    Raises :class:`FrameError` at the first frame that is short, has a bad magic,
    a CRC mismatch, an unknown kind, or (when ``expect_seq`` is given) a seq that
    breaks the contiguous run a segment must hold. Reads in 1 MiB chunks so a
    scan costs few syscalls however small the records are. A yielded payload view
    is only valid until the next iteration.
    """
    buf = b""
    view = memoryview(buf)
    buf_off = start
    pos = start
    while pos < end:
        rel = pos - buf_off
        if len(buf) - rel < HEADER_SIZE:
            buf = _pread_exact(fd, pos, min(max(_READ_CHUNK, HEADER_SIZE), end - pos))
            view = memoryview(buf)
            buf_off, rel = pos, 0
            if len(buf) < HEADER_SIZE:
                raise FrameError(pos, f"truncated header ({len(buf)} of {HEADER_SIZE} bytes)")
        magic, crc, length, seq, kind, ts = HEADER.unpack_from(buf, rel)
        if magic != MAGIC:
            raise FrameError(pos, "bad magic")
        size = HEADER_SIZE + length
        if pos + size > end:
            raise FrameError(pos, f"truncated record (needs {size} bytes, {end - pos} left)")
        if len(buf) - rel < size:
            buf = _pread_exact(fd, pos, min(max(_READ_CHUNK, size), end - pos))
            view = memoryview(buf)
            buf_off, rel = pos, 0
            if len(buf) < size:
                raise FrameError(pos, "truncated record (file shrank)")
        payload = view[rel + HEADER_SIZE : rel + size]
        if crc32(view[rel + CRC_FIELDS_OFFSET : rel + HEADER_SIZE], crc32(payload)) != crc:
            raise FrameError(pos, "crc mismatch")
        if kind not in _KIND_VALUES:
            raise FrameError(pos, f"unknown record kind {kind}")
        if expect_seq is not None:
            if seq != expect_seq:
                raise FrameError(pos, f"seq {seq} where {expect_seq} was expected")
            expect_seq += 1
        yield Frame(pos, size, seq, kind, ts, payload)
        pos += size


def find_valid_frame(fd: int, start: int, end: int, after_seq: int) -> int | None:
    """Offset of a valid record with seq > ``after_seq`` somewhere in ``[start, end)``.

    Recovery uses it to tell a torn tail (nothing valid follows the damage: safe
    to cut) from damage in the middle of acknowledged data (must not be cut).
    """
    data = _pread_exact(fd, start, end - start)
    at = data.find(MAGIC, 1)
    while at != -1:
        try:
            for frame in iter_frames(fd, start + at, end, None):
                if frame.seq > after_seq:
                    return frame.offset
                break
        except FrameError:
            pass
        at = data.find(MAGIC, at + 1)
    return None


def fsync_path(path: Path) -> None:
    """fdatasync a file through a fresh descriptor.

    fsync acts on the inode, so a private descriptor flushes the writer's data
    too; syncing by path means the background syncer never shares (and never
    races on the closing of) the appender's descriptor.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make creations, renames and deletions in ``path`` survive power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_checkpoint(directory: Path, consumer: str) -> int:
    """Last committed seq of ``consumer``; 0 when it never committed."""
    path = directory / CHECKPOINT_DIR / consumer
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return 0
    try:
        doc = json.loads(raw)
        seq = doc["seq"]
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            raise ValueError(f"bad seq {seq!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise JournalCorrupt(path, 0, f"unreadable checkpoint: {exc}") from exc
    return seq


def all_checkpoints(directory: Path) -> dict[str, int]:
    """Every checkpoint file present, including consumers no longer configured."""
    ckpt_dir = directory / CHECKPOINT_DIR
    out: dict[str, int] = {}
    if ckpt_dir.is_dir():
        for entry in os.scandir(ckpt_dir):
            if entry.is_file() and not entry.name.startswith("."):
                out[entry.name] = read_checkpoint(directory, entry.name)
    return out


def write_checkpoint(directory: Path, consumer: str, seq: int) -> None:
    """Durably replace ``consumer``'s checkpoint: temp file, fsync, rename, dir fsync.

    A crash at any point leaves either the old or the new checkpoint, never a
    torn one, and after return the new one survives power loss.
    """
    ckpt_dir = directory / CHECKPOINT_DIR
    tmp = ckpt_dir / f".{consumer}.journal-tmp"
    data = json.dumps({"consumer": consumer, "seq": seq}).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, ckpt_dir / consumer)
    fsync_dir(ckpt_dir)


_CHECKPOINT_WIDTH = 128  # far below a 512-byte sector and a page: one atomic write


def overwrite_checkpoint(directory: Path, consumer: str, seq: int) -> None:
    """Rewrite ``consumer``'s existing checkpoint in place: for a disk with no free block.

    :func:`write_checkpoint` needs a new block for its temp file, which a full
    disk refuses, and a consumer that cannot checkpoint frees nothing: the disk
    would stay full. Overwriting the file's own block needs none. As PostgreSQL
    does for ``pg_control``, this relies on one small write at offset 0 (here
    128 bytes, space-padded JSON, so the file never shrinks) being atomic: a
    process crash cannot split one ``pwrite``, and a power loss leaves the old
    or the new sector. Raises ``FileNotFoundError`` if there is no file yet.
    """
    path = directory / CHECKPOINT_DIR / consumer
    data = json.dumps({"consumer": consumer, "seq": seq}).encode().ljust(_CHECKPOINT_WIDTH)
    fd = os.open(path, os.O_WRONLY)
    try:
        if os.pwrite(fd, data, 0) != len(data):
            raise OSError(errno.EIO, f"short checkpoint write to {path}")
        os.fsync(fd)
    finally:
        os.close(fd)


def read_all(directory: Path) -> list[JournalRecord]:
    """Every record retained in a journal directory, in seq order, without opening it.

    Read-only and lock-free: meant for offline inspection, e.g. after a server was
    SIGKILLed. Stops quietly at a torn tail of the last segment (what recovery
    would truncate); raises :class:`JournalCorrupt` for damage anywhere else.
    Checkpoints are ignored: consumed records still on disk are returned too.
    """
    out: list[JournalRecord] = []
    segments = list_segments(Path(directory))
    for i, (base, path) in enumerate(segments):
        fd = os.open(path, os.O_RDONLY)
        try:
            end = os.fstat(fd).st_size
            try:
                for f in iter_frames(fd, 0, end, base):
                    out.append(JournalRecord(f.seq, RecordKind(f.kind), bytes(f.payload), f.ts))
            except FrameError as exc:
                if i != len(segments) - 1:
                    raise JournalCorrupt(path, exc.offset, exc.reason) from None
                logger.warning("read_all: ignoring torn tail of %s at %d", path, exc.offset)
        finally:
            os.close(fd)
    return out
