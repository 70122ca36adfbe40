"""The canonical encoding of a decision row, its hash, and block heads.

A row is encoded as PostgreSQL's binary COPY tuple of `CHAIN_COLUMNS`, in
that order: a big-endian int16 field count (19), then per field a big-endian
int32 length (-1 for NULL, no bytes follow) and the type's binary send form —
text as UTF-8, int4/int8 big-endian, float8 IEEE-754 big-endian, bool one
byte, bytea raw, timestamptz int64 microseconds since 2000-01-01 UTC, jsonb a
version byte (1) and its normalised text. It is the server's own, documented
wire format (``COPY ... TO STDOUT (FORMAT BINARY)``), so the sealer and the
verifier hash exactly the stored values without decoding them, and an edit of
any column — a probability's last bit included — changes the hash.

    row_hash   = sha256("understudy.decision.v1\\0" || tuple)
    genesis(d) = sha256("understudy.genesis.v1\\0"  || d.isoformat())
    head_n     = sha256("understudy.block.v1\\0" || d.isoformat() || int32 n
                        || int64 first_position || head_{n-1} || row_hash...)

The day, block number and first position are inside each head, so a block
cannot be relabelled or moved; ``head_{-1}`` is the day's genesis.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date, timedelta

CHAIN_COLUMNS: tuple[str, ...] = (
    "request_id",
    "request_time",
    "policy_name",
    "policy_version",
    "status",
    "chosen_option",
    "chosen_probability",
    "production_probability",
    "defer_probability",
    "scores_f32",
    "probabilities_f64",
    "predicted",
    "raw_favourite_infeasible",
    "agrees_with_production",
    "latency_us",
    "error",
    "scored_at",
    "chain_xid",
    "chain_seq",
)
"""Every column of ``decisions``, in encoding order (verify checks none is missing)."""

_SEND = {
    "request_id": "textsend",
    "request_time": "timestamptz_send",
    "policy_name": "textsend",
    "policy_version": "textsend",
    "status": "textsend",
    "chosen_option": "int4send",
    "chosen_probability": "float8send",
    "production_probability": "float8send",
    "defer_probability": "float8send",
    "scores_f32": "byteasend",
    "probabilities_f64": "byteasend",
    "predicted": "jsonb_send",
    "raw_favourite_infeasible": "boolsend",
    "agrees_with_production": "boolsend",
    "latency_us": "int8send",
    "error": "textsend",
    "scored_at": "timestamptz_send",
    "chain_xid": "int8send",
    "chain_seq": "int8send",
}
"""Each column's binary send function: the bytes binary COPY carries for it."""

ROW_DOMAIN = b"understudy.decision.v1\x00"
BLOCK_DOMAIN = b"understudy.block.v1\x00"
GENESIS_DOMAIN = b"understudy.genesis.v1\x00"
HASH_BYTES = 32

_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_PG_EPOCH = date(2000, 1, 1)
_US_PER_DAY = 86_400_000_000
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_N = len(CHAIN_COLUMNS)
_I_REQUEST_ID, _I_TIME, _I_POLICY, _I_VERSION = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class ChainRow:
    """One decision as the chain sees it: its hash, its day and order key, who it is."""

    row_hash: bytes
    day: date
    chain_xid: int
    chain_seq: int
    request_id: str
    policy: str
    """``name@version``."""


def genesis(day: date) -> bytes:
    """The head before a day's first block."""
    return hashlib.sha256(GENESIS_DOMAIN + day.isoformat().encode()).digest()


def block_head(
    day: date, block: int, first_position: int, prev_head: bytes, row_hashes: Iterable[bytes]
) -> bytes:
    """``head_n`` of the module docstring."""
    h = hashlib.sha256(BLOCK_DOMAIN)
    h.update(day.isoformat().encode())
    h.update(_INT32.pack(block))
    h.update(_INT64.pack(first_position))
    h.update(prev_head)
    for row_hash in row_hashes:
        h.update(row_hash)
    return h.digest()


def _field_sql(column: str) -> str:
    send = f"{_SEND[column]}({column})"
    return (
        f"CASE WHEN {column} IS NULL THEN '\\xffffffff'::bytea "
        f"ELSE int4send(octet_length({send})) || {send} END"
    )


ROW_HASH_SQL = (
    f"sha256('\\x{ROW_DOMAIN.hex()}{len(CHAIN_COLUMNS):04x}'::bytea || "
    + " || ".join(_field_sql(c) for c in CHAIN_COLUMNS)
    + ")"
)
"""The row hash computed by PostgreSQL from the same encoding (the sealer's fast path).

The sealer lets the server hash (no row leaves it); the verifier hashes the
binary COPY bytes itself, so the two implementations check each other: a
difference between them fails verification of every row.
"""


def copy_sql(where: str, limit: int | None = None) -> str:
    """``COPY (SELECT <chain columns> ... WHERE <where> ORDER BY chain order) TO STDOUT``."""
    cols = ", ".join(CHAIN_COLUMNS)
    tail = " ORDER BY chain_xid, chain_seq" + (f" LIMIT {int(limit)}" if limit else "")
    return f"COPY (SELECT {cols} FROM decisions WHERE {where}{tail}) TO STDOUT (FORMAT BINARY)"


def _decode(tup: bytes | bytearray, spans: Sequence[tuple[int, int]]) -> ChainRow:
    def text_at(i: int) -> str:
        start, n = spans[i]
        return bytes(tup[start : start + n]).decode() if n >= 0 else ""

    t_start, _ = spans[_I_TIME]
    us = _INT64.unpack_from(tup, t_start)[0]
    xid_start, _ = spans[_N - 2]
    seq_start, _ = spans[_N - 1]
    return ChainRow(
        row_hash=hashlib.sha256(ROW_DOMAIN + tup).digest(),
        day=_PG_EPOCH + timedelta(days=us // _US_PER_DAY),
        chain_xid=_INT64.unpack_from(tup, xid_start)[0],
        chain_seq=_INT64.unpack_from(tup, seq_start)[0],
        request_id=text_at(_I_REQUEST_ID),
        policy=f"{text_at(_I_POLICY)}@{text_at(_I_VERSION)}",
    )


class CopyDecoder:
    """Splits a binary COPY stream of `CHAIN_COLUMNS` into `ChainRow`s, chunk by chunk."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._header_done = False
        self.finished = False

    def feed(self, chunk: bytes | bytearray | memoryview) -> Iterator[ChainRow]:
        """Rows completed by `chunk` (a chunk may end mid-row; the rest is kept)."""
        self._buf += chunk
        buf = self._buf
        pos = 0
        if not self._header_done:
            if len(buf) < 19:
                return
            if bytes(buf[:11]) != _COPY_SIGNATURE:
                raise ValueError("not a binary COPY stream")
            pos = 19 + _INT32.unpack_from(buf, 15)[0]
            self._header_done = True
        try:
            while len(buf) - pos >= 2:
                count = _INT16.unpack_from(buf, pos)[0]
                if count == -1:
                    self.finished = True
                    pos += 2
                    break
                if count != _N:
                    raise ValueError(f"expected {_N} fields per row, got {count}")
                cursor = pos + 2
                spans: list[tuple[int, int]] = []
                complete = True
                for _ in range(_N):
                    if len(buf) - cursor < 4:
                        complete = False
                        break
                    n = _INT32.unpack_from(buf, cursor)[0]
                    cursor += 4
                    spans.append((cursor - pos, n))
                    if n > 0:
                        cursor += n
                if not complete or cursor > len(buf):
                    break
                yield _decode(buf[pos:cursor], spans)
                pos = cursor
        finally:
            del buf[:pos]
