"""The journal's bytes stay what they were: zlib's CRC-32, the same header, old files replay.

The journal computes its checksums with `journal_format.crc32` (zlib-ng's when
installed, for speed). These tests pin the on-disk format against an encoder
written here from the documented layout with the standard library's
``zlib.crc32``, in both directions: what the journal writes is byte for byte
what that encoder gives, and a segment written by that encoder (as every
journal before the switch was) is read back whole. The tail cache's eviction
is checked to let go of payloads at once (a 225 KB batch record each).
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from service.pipeline import batch_record
from service.pipeline.journal import FsyncMode, IngestJournal, JournalConfig
from service.pipeline.journal_format import RecordKind, crc32, read_all, segment_name

_HEADER = struct.Struct("<4sIIQH2xd")  # the documented layout, restated
_FIELDS = struct.Struct("<IQH2xd")


def _record(seq: int, kind: int, ts: float, payload: bytes) -> bytes:
    """One record as the format's docstring describes it, with the stdlib's zlib."""
    fields = _FIELDS.pack(len(payload), seq, kind, ts)
    crc = zlib.crc32(fields, zlib.crc32(payload))
    return _HEADER.pack(b"UJR1", crc, len(payload), seq, kind, ts) + payload


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=70_000), start=st.integers(0, 2**32 - 1), cut=st.integers(0, 64))
def test_crc32_gives_zlibs_values(data: bytes, start: int, cut: int) -> None:
    """Same value as zlib.crc32 for any bytes, any running value, and memoryview slices."""
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data, start) == zlib.crc32(data, start)
    view = memoryview(data)[min(cut, len(data)) :]
    assert crc32(view, start) == zlib.crc32(view, start)
    assert crc32(data[len(data) // 2 :], crc32(data[: len(data) // 2])) == zlib.crc32(data)


def _payloads() -> list[tuple[RecordKind, bytes]]:
    rng = np.random.default_rng(5)
    rows = np.array([0, 3, 7])
    digests = rng.integers(0, 256, (3, 32), dtype=np.uint8)
    body = rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes()  # a batch-record size
    mirrors = batch_record.pack(RecordKind.MIRROR_BATCH, rows, 9, body, digests)
    outcomes = batch_record.pack(RecordKind.OUTCOME_BATCH, rows, 8, b"o" * 99)
    return [
        (RecordKind.MIRROR, b"one request"),
        (RecordKind.MIRROR_BATCH, mirrors),
        (RecordKind.OUTCOME, b""),
        (RecordKind.OUTCOME_BATCH, outcomes),
    ]


def test_journal_writes_the_documented_bytes(tmp_path: Path) -> None:
    """Each append's bytes on disk equal the stdlib encoder's for its seq, kind, ts, payload."""
    items = _payloads()
    with IngestJournal(JournalConfig(tmp_path, fsync_mode=FsyncMode.NEVER)) as j:
        for kind, payload in items:
            j.append(kind, payload)
        j.append_many(items)
    (seg,) = sorted(tmp_path.glob("*.seg"))
    data = seg.read_bytes()
    expected, at = b"", 0
    for seq, (kind, payload) in enumerate(items + items, start=1):
        ts = _HEADER.unpack_from(data, at)[5]  # the one field the journal chooses: time.time()
        record = _record(seq, int(kind), ts, payload)
        expected += record
        at += len(record)
    assert data == expected


def test_a_segment_written_with_zlib_replays(tmp_path: Path) -> None:
    """A journal written before the switch (the stdlib's CRC) opens, reads, and goes on."""
    items = _payloads()
    segment = b"".join(
        _record(seq, int(kind), 1_700_000_000.0 + seq, payload)
        for seq, (kind, payload) in enumerate(items, start=1)
    )
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / segment_name(1)).write_bytes(segment)
    assert [(r.seq, r.kind, r.payload) for r in read_all(tmp_path)] == [
        (seq, kind, payload) for seq, (kind, payload) in enumerate(items, start=1)
    ]
    with IngestJournal(JournalConfig(tmp_path, fsync_mode=FsyncMode.NEVER)) as j:
        got = j.read("scorer", 10)
        assert [(r.seq, r.kind, r.payload) for r in got] == [
            (seq, kind, payload) for seq, (kind, payload) in enumerate(items, start=1)
        ]
        assert j.append(RecordKind.MIRROR, b"after") == len(items) + 1
    assert (tmp_path / segment_name(1)).read_bytes().startswith(segment)  # nothing cut
    record = batch_record.unpack(items[1][1], RecordKind.MIRROR_BATCH)
    assert record.rows.tolist() == [0, 3, 7] and record.n_batch == 9


def test_batch_record_header_crc_is_zlibs() -> None:
    """The batch payload's own header CRC: zlib's over the 20 header bytes, rows, digests."""
    rows = np.array([1, 4], dtype=np.uint32)
    digests = np.arange(64, dtype=np.uint8).reshape(2, 32)
    payload = batch_record.pack(RecordKind.MIRROR_BATCH, rows, 5, b"body", digests)
    meta = rows.astype("<u4").tobytes() + digests.tobytes()
    head = struct.pack("<4sBBHIIII", b"UJB1", 1, 3, 1, 2, 5, 4, 0)[:20]
    crc = zlib.crc32(meta, zlib.crc32(head))
    assert payload == head + struct.pack("<I", crc) + meta + b"body"


def test_evicted_payloads_are_let_go_at_once(tmp_path: Path) -> None:
    """A record pushed out of the tail cache is no longer referenced by the journal.

    Before, evicted slots kept their payloads until the cache list was compacted
    (after 1,024 of them): ~230 MB of dead batch records, freed inside one append.
    """
    config = JournalConfig(tmp_path, fsync_mode=FsyncMode.NEVER, tail_cache_bytes=4 * 1100)
    with IngestJournal(config) as j:
        first = os.urandom(1000)
        held = sys.getrefcount(first)
        j.append(RecordKind.MIRROR, first)
        assert sys.getrefcount(first) == held + 1  # the cache holds it
        for _ in range(8):
            j.append(RecordKind.MIRROR, os.urandom(1000))  # pushes `first` out of the cache
        assert sys.getrefcount(first) == held
        assert [r.payload for r in j.read("scorer", 1)] == [first]  # read back from the file
