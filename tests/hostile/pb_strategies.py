"""Hypothesis strategies for hostile protobuf bytes, driven by the message descriptors.

Each strategy draws ``(label, raw)``: the bytes to send as one message and a
short label saying how they were made, so a run can report what it covered:

- ``random``: every field random (any value its type can hold, open enums
  included), repeated fields of random length;
- ``mutated``: a valid message with one to three fields set to random values,
  cleared, or resized (reaches the contract rules, not just the parser);
- ``garbage`` / ``truncated`` / ``bitflip``: raw bytes, a valid message cut
  short, a valid message with bits flipped;
- ``bad_utf8``: a valid message with a string field (nested ones included)
  holding invalid UTF-8, written on the wire by hand since no protobuf API
  will produce it;
- ``nested``: unknown groups nested past the parser's depth limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

FD = FieldDescriptor
Drawn = tuple[str, bytes]

_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    FD.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    FD.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    FD.TYPE_UINT32: st.integers(0, 2**32 - 1),
    FD.TYPE_UINT64: st.integers(0, 2**64 - 1),
    FD.TYPE_DOUBLE: st.floats(),
    FD.TYPE_FLOAT: st.floats(width=32),
    FD.TYPE_BOOL: st.booleans(),
    FD.TYPE_STRING: st.text(max_size=40),
    # proto3 enums are open: any int32 is a legal value on the wire.
    FD.TYPE_ENUM: st.integers(-(2**31), 2**31 - 1),
}

# Invalid UTF-8: a lone continuation byte, a truncated sequence, an overlong
# encoding, an encoded surrogate, a code point above U+10FFFF, plain 0xFF.
BAD_UTF8 = (b"\x80", b"abc\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xff\xfe")


def scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    """Values of a scalar field's type."""
    return _SCALARS[field.type]


def field_value(field: FieldDescriptor, max_list: int) -> st.SearchStrategy[Any]:
    """A value for `field`: a list when repeated, a message when a message."""
    if field.type == FD.TYPE_MESSAGE:
        one: st.SearchStrategy[Any] = st.deferred(lambda: message(field.message_type, max_list))
    else:
        one = scalar(field)
    return st.lists(one, max_size=max_list) if field.is_repeated else one


def _assign(msg: Any, field: FieldDescriptor, value: Any) -> None:
    if field.is_repeated:
        container = getattr(msg, field.name)
        del container[:]
        if field.type == FD.TYPE_MESSAGE:
            for item in value:
                container.add().CopyFrom(item)
        else:
            container.extend(value)
    elif field.type == FD.TYPE_MESSAGE:
        getattr(msg, field.name).CopyFrom(value)
    else:
        setattr(msg, field.name, value)


@st.composite
def message(draw: st.DrawFn, descriptor: Descriptor, max_list: int = 6) -> Message:
    """A message of `descriptor`'s type with a random subset of fields set at random."""
    msg = GetMessageClass(descriptor)()
    for field in descriptor.fields:
        if draw(st.booleans()):
            _assign(msg, field, draw(field_value(field, max_list)))
    return msg


def field_paths(descriptor: Descriptor) -> list[tuple[FieldDescriptor, ...]]:
    """Every field reachable through singular sub-messages, as descriptor chains."""
    out: list[tuple[FieldDescriptor, ...]] = []
    for field in descriptor.fields:
        out.append((field,))
        if field.type == FD.TYPE_MESSAGE:
            out.extend((field, *rest) for rest in field_paths(field.message_type))
    return out


def _parent(msg: Any, path: Sequence[FieldDescriptor]) -> Any | None:
    for field in path[:-1]:
        if field.is_repeated:
            container = getattr(msg, field.name)
            if not container:
                return None
            msg = container[0]
        else:
            msg = getattr(msg, field.name)
    return msg


@st.composite
def mutation(draw: st.DrawFn, valid: Message, max_list: int = 6) -> Message:
    """`valid` with one to three fields replaced, cleared, truncated or extended."""
    msg = type(valid)()
    msg.CopyFrom(valid)
    paths = field_paths(msg.DESCRIPTOR)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        parent, field = _parent(msg, path), path[-1]
        if parent is None:
            continue
        action = draw(st.sampled_from(["set", "clear", "truncate", "extend"]))
        if action == "clear":
            parent.ClearField(field.name)
        elif field.is_repeated and action in ("truncate", "extend"):
            container = getattr(parent, field.name)
            if action == "truncate":
                del container[draw(st.integers(0, max(len(container) - 1, 0))) :]
            elif field.type == FD.TYPE_MESSAGE:
                container.add().CopyFrom(draw(message(field.message_type, max_list)))
            else:
                container.extend(draw(st.lists(scalar(field), min_size=1, max_size=max_list)))
        else:
            _assign(parent, field, draw(field_value(field, max_list)))
    return msg


def varint(value: int) -> bytes:
    """Protobuf base-128 varint."""
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def length_delimited(number: int, payload: bytes) -> bytes:
    """One wire-type-2 field: tag, length, payload."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def string_paths(descriptor: Descriptor) -> list[tuple[FieldDescriptor, ...]]:
    """Paths to every string field, through sub-messages (repeated ones too)."""
    return [p for p in field_paths(descriptor) if p[-1].type == FD.TYPE_STRING]


@st.composite
def bad_utf8(draw: st.DrawFn, valid: Message) -> bytes:
    """`valid`'s bytes followed by a string field, at any depth, holding invalid UTF-8.

    Appending merges on parse: a singular sub-message gains the field, a
    repeated one gains an element holding it.
    """
    path = draw(st.sampled_from(string_paths(valid.DESCRIPTOR)))
    payload = draw(st.sampled_from(BAD_UTF8))
    for field in reversed(path):
        payload = length_delimited(field.number, payload)
    return valid.SerializeToString() + payload


def bitflips(raw: bytes) -> st.SearchStrategy[bytes]:
    """`raw` with one to eight bits flipped."""

    def flip(positions: list[int]) -> bytes:
        out = bytearray(raw)
        for bit in positions:
            out[bit // 8] ^= 1 << (bit % 8)
        return bytes(out)

    return st.lists(st.integers(0, len(raw) * 8 - 1), min_size=1, max_size=8).map(flip)


def nested_groups(depth: int, number: int = 99) -> bytes:
    """Unknown group field `number` nested `depth` deep (the parser recurses into groups)."""
    return varint(number << 3 | 3) * depth + varint(number << 3 | 4) * depth


def hostile_bytes(descriptor: Descriptor, valids: Sequence[Message]) -> st.SearchStrategy[Drawn]:
    """Every kind of hostile message for `descriptor`, labelled by how it was made."""
    valid = st.sampled_from(list(valids))
    serialized = valid.map(lambda m: m.SerializeToString())
    return st.one_of(
        message(descriptor).map(lambda m: ("random", m.SerializeToString())),
        valid.flatmap(mutation).map(lambda m: ("mutated", m.SerializeToString())),
        st.binary(max_size=512).map(lambda b: ("garbage", b)),
        serialized.flatmap(lambda b: st.integers(0, len(b) - 1).map(lambda k: b[:k])).map(
            lambda b: ("truncated", b)
        ),
        serialized.flatmap(bitflips).map(lambda b: ("bitflip", b)),
        valid.flatmap(bad_utf8).map(lambda b: ("bad_utf8", b)),
        st.integers(50, 5_000).map(lambda d: ("nested", nested_groups(d))),
    )
