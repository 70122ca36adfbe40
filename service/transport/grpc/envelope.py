"""Reading raw gRPC messages: a bounded parse, the embedded payload, a leading sequence.

Handlers receive raw bytes (no deserializer registered) and parse them here,
inside the ingest call, so a malformed protobuf is refused and counted like
any other rejection instead of an uncounted INTERNAL raised inside gRPC.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError

from service.contract import PayloadTooLarge
from service.contract.errors import MalformedMessage


def parse_message(message: Any, raw: bytes, what: str, limit: int) -> None:
    """Parse `raw` into `message`: PayloadTooLarge over `limit`, MalformedMessage if not one."""
    if len(raw) > limit:
        raise PayloadTooLarge(what, f"is {len(raw)} bytes; the limit is {limit}")
    try:
        message.ParseFromString(raw)
    except DecodeError as exc:
        raise MalformedMessage(what, f"is not a valid protobuf message: {exc}") from exc


def embedded_payload(raw: bytes) -> bytes | None:
    """The bytes of field 2 when a parsed envelope is exactly ``[sequence = 1][field 2]``.

    That is the layout every protobuf serializer writes, and then the slice is the
    message the envelope holds (it occurs once and nothing follows), so it is
    journaled as sent, as the unary RPC journals its body, instead of paying for
    a re-serialisation. Any other valid layout gives None and is re-serialised.
    """
    end, pos = len(raw), 0
    if raw[:1] == b"\x08":  # field 1, varint: skip it
        pos = 1
        while pos < end and raw[pos] & 0x80:
            pos += 1
        pos += 1
    if raw[pos : pos + 1] != b"\x12":  # field 2, length-delimited
        return None
    pos += 1
    length = shift = 0
    while pos < end:
        byte = raw[pos]
        pos += 1
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return raw[pos:] if pos + length == end else None
        shift += 7
    return None


def leading_sequence(raw: bytes) -> int | None:
    """The sequence of an envelope too large to parse, when it is written first.

    Every serializer writes field 1 first, so an oversized message can still be
    refused under its own number; None when the bytes do not start that way.
    """
    if raw[:1] != b"\x08":
        return None
    value = shift = 0
    for pos in range(1, min(len(raw), 11)):
        byte = raw[pos]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value if value < 2**64 else None
        shift += 7
    return None


def _varint(raw: bytes, pos: int) -> tuple[int, int] | None:
    """The varint at `pos` and the position after it, or None if it does not end."""
    value = shift = 0
    end = min(len(raw), pos + 10)
    while pos < end:
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (value, pos) if value < 2**64 else None
        shift += 7
    return None


def split_envelope(raw: bytes) -> tuple[int, bytes | None] | None:
    """``(sequence, field 2's bytes or None)`` of an envelope framed as every serializer
    writes it, ``[1: sequence][2: payload]`` (either may be absent), reading no further.

    So a batch stream message whose *batch* does not parse is still refused under its
    own sequence (the framing around it was readable); None for any other layout,
    which is then parsed whole.
    """
    sequence, pos, end = 0, 0, len(raw)
    if raw[:1] == b"\x08":
        read = _varint(raw, 1)
        if read is None:
            return None
        sequence, pos = read
    if pos == end:
        return sequence, None
    if raw[pos : pos + 1] != b"\x12":
        return None
    read = _varint(raw, pos + 1)
    if read is None:
        return None
    length, start = read
    return (sequence, raw[start:]) if start + length == end else None
