"""The journal payload of a batch: which rows were accepted, their digests, the bytes received.

A `MirrorBatch` (or `OutcomeBatch`) whose accepted part is journaled is ONE
record (`RecordKind.MIRROR_BATCH` / `OUTCOME_BATCH`): one write, one CRC,
whatever the number of requests. The batch protobuf is kept exactly as it was
received — ingest never re-serialises it — and a small header says which of its
rows were accepted (the others were refused, duplicates or conflicts, and must
not be scored or logged). A mirror record also carries each accepted row's
identity digest (`service.contract.identity.content_sha256`, 32 bytes), so
neither the request index's startup refill nor the decision-log writer
computes it again.

Layout (little-endian)::

    magic    4s   b"UJB1"
    version  u8   1
    kind     u8   RecordKind (3 mirror batch, 4 outcome batch)
    flags    u16  bit 0: digests present
    n_rows   u32  accepted rows
    n_batch  u32  rows in the batch message (every accepted row is below it)
    body_len u32  length of the batch protobuf
    crc      u32  crc32 of the 20 bytes above, then the rows and the digests
    rows     u32[n_rows]        accepted row indexes, strictly increasing
    digests  u8[n_rows, 32]     (when flagged) the rows' identity digests
    body     bytes[body_len]    the batch protobuf as received

The journal's record CRC already covers the whole payload against torn writes
and flipped bits on disk; the header's own CRC and the exact length check catch
a payload that was put together wrongly (or a record of another kind read as
this one), so a bad header is refused, never read as other rows.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.contract import MirrorRequest, Outcome, RequestLimits
from service.contract.batch import RequestBatch
from service.pipeline.journal_format import RecordKind, crc32
from service.wire.understudy.v1 import batch_pb2

MAGIC = b"UJB1"
VERSION = 1
HEADER = struct.Struct("<4sBBHIIII")
HEADER_SIZE = HEADER.size  # 24
_CRC_COVERED = HEADER_SIZE - 4  # the crc is the header's last field
_DIGESTS = 1
DIGEST_SIZE = 32
ROW_DTYPE = np.dtype("<u4")
BATCH_KINDS = frozenset({RecordKind.MIRROR_BATCH, RecordKind.OUTCOME_BATCH})


class BatchRecordCorrupt(ValueError):
    """A batch record's header does not describe its payload."""


@dataclass(frozen=True, eq=False)
class BatchRecord:
    """One decoded batch record (its arrays are read-only views of the payload)."""

    kind: RecordKind
    rows: NDArray[np.uint32]
    """Accepted row indexes in the batch message, increasing."""
    digests: NDArray[np.uint8] | None
    """(n_rows, 32) identity digests of those rows (mirror records), else None."""
    n_batch: int
    """Rows in the batch message."""
    body: bytes
    """The batch protobuf as received."""

    @property
    def n_rows(self) -> int:
        """Accepted rows."""
        return len(self.rows)

    def digest(self, i: int) -> bytes:
        """The digest of the i-th accepted row."""
        if self.digests is None:
            raise ValueError("an outcome batch record carries no digests")
        return bytes(self.digests[i].tobytes())


def pack(
    kind: RecordKind,
    rows: NDArray[np.integer],
    n_batch: int,
    body: bytes,
    digests: NDArray[np.uint8] | None = None,
) -> bytes:
    """The payload of a batch record: header, `rows`, their `digests`, then `body` unchanged.

    Raises:
        ValueError: `kind` is not a batch kind, a mirror record lacks digests (or an
            outcome record has some), or `rows` are not increasing indexes below `n_batch`.
    """
    if kind not in BATCH_KINDS:
        raise ValueError(f"not a batch record kind: {kind!r}")
    packed_rows = np.ascontiguousarray(rows, dtype=ROW_DTYPE)
    n = len(packed_rows)
    if n and (
        int(packed_rows[-1]) >= n_batch or np.any(np.diff(packed_rows.astype(np.int64)) <= 0)
    ):
        raise ValueError("rows must be strictly increasing indexes below n_batch")
    flags = 0
    parts = [packed_rows.tobytes()]
    if kind is RecordKind.MIRROR_BATCH:
        if digests is None or digests.shape != (n, DIGEST_SIZE):
            raise ValueError(f"a mirror batch record needs ({n}, {DIGEST_SIZE}) digests")
        flags |= _DIGESTS
        parts.append(np.ascontiguousarray(digests, dtype=np.uint8).tobytes())
    elif digests is not None:
        raise ValueError("an outcome batch record carries no digests")
    head = HEADER.pack(MAGIC, VERSION, int(kind), flags, n, n_batch, len(body), 0)[:_CRC_COVERED]
    crc = crc32(head)
    for part in parts:
        crc = crc32(part, crc)
    return b"".join((head, struct.pack("<I", crc), *parts, body))


def _header(payload: bytes | memoryview) -> tuple[int, int, int, int, int, int, int, int]:
    if len(payload) < HEADER_SIZE:
        raise BatchRecordCorrupt(f"batch record of {len(payload)} bytes has no header")
    magic, version, kind, flags, n, n_batch, body_len, crc = HEADER.unpack_from(payload)
    if magic != MAGIC:
        raise BatchRecordCorrupt(f"batch record magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise BatchRecordCorrupt(f"batch record version {version}, this build reads {VERSION}")
    return magic, version, kind, flags, n, n_batch, body_len, crc


def row_count(payload: bytes | memoryview) -> int:
    """Accepted rows of a batch record, from its header alone (what the scorer sizes by)."""
    return int(_header(payload)[4])


def unpack(payload: bytes, kind: RecordKind | None = None) -> BatchRecord:
    """The batch record in `payload` (of `kind`, when given).

    Raises:
        BatchRecordCorrupt: the header is damaged or does not describe the payload.
    """
    _, _, raw_kind, flags, n, n_batch, body_len, crc = _header(payload)
    try:
        record_kind = RecordKind(raw_kind)
    except ValueError:
        raise BatchRecordCorrupt(f"batch record of unknown kind {raw_kind}") from None
    if record_kind not in BATCH_KINDS or (kind is not None and record_kind is not kind):
        raise BatchRecordCorrupt(f"batch record says kind {raw_kind}, read as {kind!r}")
    has_digests = bool(flags & _DIGESTS)
    if flags & ~_DIGESTS or has_digests != (record_kind is RecordKind.MIRROR_BATCH):
        raise BatchRecordCorrupt(f"batch record flags {flags:#x} do not fit kind {raw_kind}")
    rows_end = HEADER_SIZE + n * ROW_DTYPE.itemsize
    meta_end = rows_end + (n * DIGEST_SIZE if has_digests else 0)
    if meta_end + body_len != len(payload):
        raise BatchRecordCorrupt(
            f"batch record header describes {meta_end + body_len} bytes, payload has {len(payload)}"
        )
    view = memoryview(payload)
    if crc32(view[HEADER_SIZE:meta_end], crc32(view[:_CRC_COVERED])) != crc:
        raise BatchRecordCorrupt("batch record header checksum mismatch")
    rows = np.frombuffer(payload, dtype=ROW_DTYPE, count=n, offset=HEADER_SIZE)
    if n and (int(rows[-1]) >= n_batch or np.any(rows[1:] <= rows[:-1])):
        raise BatchRecordCorrupt("batch record rows are not increasing indexes below n_batch")
    digests = (
        np.frombuffer(payload, dtype=np.uint8, count=n * DIGEST_SIZE, offset=rows_end).reshape(
            n, DIGEST_SIZE
        )
        if has_digests
        else None
    )
    return BatchRecord(record_kind, rows, digests, int(n_batch), payload[meta_end:])


_REPLAY_LIMITS = RequestLimits(
    **{f.name: 2**31 - 1 for f in dataclasses.fields(RequestLimits) if f.type in (int, "int")}
)
"""What reading a journaled batch back allows (no bound): ingest applied the configured
limits already, and a record must read back whatever they were when it was accepted."""


def _batch(record: BatchRecord, decoded: object = None) -> RequestBatch:
    if isinstance(decoded, RequestBatch):  # ingest's own decoding of the body (the journal's
        return decoded  # `JournalRecord.decoded`): the same columns, not parsed again
    from service.wire.batch_codec import batch_from_pb  # the scorer's side only

    return batch_from_pb(batch_pb2.MirrorBatch.FromString(record.body), _REPLAY_LIMITS)


def requests_of(record: BatchRecord, decoded: object = None) -> list[MirrorRequest]:
    """The accepted requests of a mirror batch record, in row order.

    `decoded` is `JournalRecord.decoded` (ingest's `RequestBatch` of the body, while
    the journal still holds it); otherwise the body is parsed.

    Raises:
        DecodeError, InvalidInput: the body does not decode (it did at ingest).
    """
    return _batch(record, decoded).requests(record.rows.tolist())


def outcomes_of(record: BatchRecord) -> list[Outcome]:
    """The accepted outcomes of an outcome batch record, in row order."""
    from service.wire.batch_codec import outcomes_from_pb  # the scorer's side only

    cols = outcomes_from_pb(batch_pb2.OutcomeBatch.FromString(record.body), _REPLAY_LIMITS)
    return cols.outcomes(record.rows.tolist())


def request_ids_of(record: BatchRecord, decoded: object = None) -> list[str]:
    """The ``request_id`` of each accepted row of a mirror batch record, in row order."""
    batch = _batch(record, decoded)
    return [batch.request_id[r] for r in record.rows.tolist()]
