"""What makes two sends the same request: one content digest (docs/ingest.md, "Identity").

``request_id`` is the identity of a request. Two sends with the same id are
the same request when `content_sha256` of their decoded contract objects is
equal; the same id with another digest is a conflicting request, refused at
ingest and, when ingest could not know, kept out of the log by the writer.
Both call this one function, so the two can never disagree.

The digest is over the *contract object*, after decoding and version mapping,
not over the bytes that came: JSON and protobuf forms of one request, a
protobuf with unknown fields or another field order, and a version-1 request
and its version-2 equivalent all have one digest. ``schema_version`` is left
out (it says how the request was written, not what it says); the received
time and the journal position are not in the object at all.

The canonical encoding walks the object's dataclass fields in declaration
order, each written as its name and a typed, length-prefixed value: strings
(and tuples of strings or of string sets) as ASCII-escaped JSON, integers in
decimal, floats as IEEE-754 float64, numpy arrays as dtype, shape and bytes,
tuples in order, sets sorted, nested dataclasses recursively.
A field that has a default and holds an empty value (None, ``""``, an empty
array or collection) is left out, so a field added later with an empty
default does not change the digest of a request that does not use it.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import struct
from typing import Any

import numpy as np

NOT_CONTENT = frozenset({"schema_version"})
"""Fields that say how a request was written, not what it says."""

_FLOAT = struct.Struct("<d")
_JSON = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))


def _length(data: bytes) -> bytes:
    return b"%d:%b" % (len(data), data)


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _is_empty(value: object) -> bool:
    if value is None:
        return True
    if isinstance(value, np.ndarray):
        return value.size == 0
    if isinstance(value, (str, tuple, list, frozenset, set)):
        return len(value) == 0
    return False


def _json(value: object) -> bytes:
    """Strings (and lists of them) as ASCII JSON: C speed, one fixed escaping rule."""
    return b"j" + _length(_JSON.encode(value).encode())


def _strings(value: tuple[Any, ...] | list[Any]) -> list[Any] | None:
    """`value` as JSON-ready lists when it holds only strings or only sets of strings."""
    if all(type(item) is str for item in value):  # node ids, zones, option ids
        return list(value)
    if all(type(item) is frozenset for item in value):  # labels per node
        sets = [sorted(item) for item in value]
        if all(type(s) is str for members in sets for s in members):
            return sets
    return None


def _encode_array(value: np.ndarray[Any, Any], out: list[bytes]) -> None:
    array = np.ascontiguousarray(value)
    shape = ",".join(str(n) for n in array.shape).encode()
    out.append(b"a" + _length(array.dtype.str.encode()) + _length(shape))
    out.append(_length(array.tobytes()))


def _encode(value: object, out: list[bytes]) -> None:
    """Append the canonical encoding of `value` to `out`."""
    t = type(value)  # exact-type fast paths first: most values are these
    if t is float:
        out.append(b"f" + _FLOAT.pack(value))
    elif t is str:
        out.append(_json(value))
    elif t is np.ndarray:
        _encode_array(value, out)  # type: ignore[arg-type]
    elif value is None:
        out.append(b"N")
    elif isinstance(value, bool | np.bool_):
        out.append(b"T" if value else b"F")
    elif isinstance(value, enum.Enum) and not isinstance(value, str | int):
        _encode(value.value, out)
    elif isinstance(value, str):  # a StrEnum member is its value
        out.append(_json(str.__str__(value)))
    elif isinstance(value, int | np.integer):
        out.append(b"i" + _length(str(int(value)).encode()))
    elif isinstance(value, float | np.floating):
        out.append(b"f" + _FLOAT.pack(float(value)))
    elif isinstance(value, np.ndarray):
        _encode_array(value, out)
    elif isinstance(value, tuple | list):
        strings = _strings(value)
        if strings is not None:
            out.append(b"t" + _json(strings))
            return
        out.append(b"t%d:" % len(value))
        for item in value:
            _encode(item, out)
    elif isinstance(value, frozenset | set):
        if all(type(item) is str for item in value):
            out.append(b"e" + _json(sorted(value)))
            return
        members = []
        for item in value:
            parts: list[bytes] = []
            _encode(item, parts)
            members.append(b"".join(parts))
        out.append(b"e%d:%b" % (len(members), b"".join(sorted(members))))
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        _encode_fields(value, out, frozenset())
    else:
        raise TypeError(f"no canonical encoding for {type(value).__name__}")


_FIELDS: dict[type, tuple[tuple[str, bytes, bool], ...]] = {}
"""Per dataclass type: (name, encoded name, has a default) per field; `fields()` is slow."""


def _fields_of(cls: type) -> tuple[tuple[str, bytes, bool], ...]:
    known = _FIELDS.get(cls)
    if known is None:
        known = _FIELDS[cls] = tuple(
            (f.name, _length(f.name.encode()), _has_default(f)) for f in dataclasses.fields(cls)
        )
    return known


def _encode_fields(obj: object, out: list[bytes], skip: frozenset[str]) -> None:
    cls = type(obj)
    out.append(b"d" + _length(cls.__name__.encode()))
    for name, encoded_name, has_default in _fields_of(cls):
        if name in skip:
            continue
        value = getattr(obj, name)
        if has_default and _is_empty(value):
            continue
        out.append(encoded_name)
        _encode(value, out)
    out.append(b"/")


def canonical_bytes(obj: object) -> bytes:
    """The canonical encoding of a contract object (request or outcome), ``schema_version`` out."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"expected a contract dataclass, got {type(obj).__name__}")
    out: list[bytes] = []
    _encode_fields(obj, out, NOT_CONTENT)
    return b"".join(out)


def content_sha256(obj: object) -> bytes:
    """sha256 (32 bytes) of `canonical_bytes`: equal iff two sends are the same request.

    The one definition the ingest index and the decision-log writer both use.
    """
    return hashlib.sha256(canonical_bytes(obj)).digest()
