"""The anchor: chain heads and retirements, signed, in an append-only file outside the database.

Whoever holds the service's database role can rewrite rows *and* the chain
tables; it cannot rewrite this file's history without the signing key, which
the database never sees. Each line is one JSON object::

    {"v": 1, "seq": 7, "prev": "<sha256 hex of line 6's bytes>", "kind": "seal",
     "at": 1764450000.0, "key_id": "<16 hex>", "watermark": 812,
     "blocks": [["2026-11-29", 3, 3000, 1000, "<head hex>"], ...],
     "sig": "<HMAC-SHA256 hex>"}

``kind`` is ``seal`` (``blocks``: day, block, first position, row count, head)
or ``retire`` (``retirement``: the retirement record). ``sig`` is
HMAC-SHA256(key, the line's JSON without ``sig``, keys sorted, no spaces);
``seq`` counts lines from 0 and ``prev`` is the hash of the previous line
(64 zeros for the first), so a line removed, reordered or edited in the
middle is detected, and a forged line needs the key. Appends take an
exclusive ``flock`` (the service's sealer and a CLI seal may share the file)
and are fsynced before the call returns.

The key is 32 random bytes, hex, in a file created with mode 0600 when
missing; a key file readable by group or others is refused.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

ZERO = "0" * 64


class AnchorError(Exception):
    """Raised when the key file or the anchor file cannot be used as they are."""


def load_key(path: Path, *, create: bool = True) -> bytes:
    """The signing key at `path`, generated (0600) when missing and `create` is set.

    Raises:
        AnchorError: the file is missing (and not to be created), readable by
            group or others, or not 64 hex characters.
    """
    if not path.exists():
        if not create:
            raise AnchorError(f"chain key file `{path}` does not exist")
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it first: read theirs
        else:
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_hex(32) + "\n")
                out.flush()
                os.fsync(out.fileno())
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise AnchorError(
            f"chain key file `{path}` has mode {mode:o}; it must be readable by its owner "
            "only (chmod 600)"
        )
    raw = path.read_text().strip()
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise AnchorError(f"chain key file `{path}` must hold 64 hex characters")
    return key


def key_id(key: bytes) -> str:
    """A short public name for a key (first 8 bytes of its sha256)."""
    return hashlib.sha256(b"understudy.key-id\x00" + key).hexdigest()[:16]


def canonical(obj: Mapping[str, Any]) -> bytes:
    """The bytes that are signed: JSON, keys sorted, no whitespace."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def sign(key: bytes, obj: Mapping[str, Any]) -> str:
    """HMAC-SHA256 of `obj`'s canonical JSON, hex."""
    return hmac.new(key, canonical(obj), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class AnchoredBlock:
    """A block as the anchor file signed it."""

    day: date
    block: int
    first_position: int
    row_count: int
    head: str
    line: int
    """The anchor line (``seq``) that signed it."""


@dataclass(frozen=True)
class Retirement:
    """A retired day: what was dropped and the chain's final head then."""

    day: date
    requests_rows: int
    decisions_rows: int
    outcomes_rows: int
    blocks: int
    final_head: str
    retired_at: float

    def as_json(self) -> dict[str, Any]:
        """JSON-ready, with the day as ISO text."""
        return dataclasses.asdict(self) | {"day": self.day.isoformat()}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Retirement:
        """Back from `as_json`."""
        return cls(**(dict(obj) | {"day": date.fromisoformat(obj["day"])}))


@dataclass
class AnchorContents:
    """What an anchor file says, and what is wrong with it."""

    blocks: dict[tuple[date, int], AnchoredBlock] = field(default_factory=dict)
    retirements: dict[date, Retirement] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    lines: int = 0
    last_seq: int = -1
    last_hash: str = ZERO


def _read_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    if not path.exists():
        return
    with path.open("rb") as f:
        yield from enumerate(f, start=1)


def read_anchor(path: Path, key: bytes) -> AnchorContents:
    """Read and check every line of `path`; problems are collected, not raised."""
    out = AnchorContents()
    for number, raw in _read_lines(path):
        where = f"anchor {path.name} line {number}"
        out.lines += 1
        try:
            obj = json.loads(raw)
        except ValueError:
            out.problems.append(f"{where}: not JSON (truncated or edited)")
            continue
        sig = obj.pop("sig", "")
        if not hmac.compare_digest(sign(key, obj), str(sig)):
            out.problems.append(f"{where}: signature does not match (edited, or another key)")
            continue
        if obj.get("seq") != out.last_seq + 1 or obj.get("prev") != out.last_hash:
            out.problems.append(
                f"{where}: expected seq {out.last_seq + 1} after line hash "
                f"{out.last_hash[:12]}, got seq {obj.get('seq')} after "
                f"{str(obj.get('prev'))[:12]} (a line was removed or reordered)"
            )
        out.last_seq = int(obj["seq"])
        out.last_hash = hashlib.sha256(raw.rstrip(b"\n")).hexdigest()
        if obj["kind"] == "seal":
            for d, block, first, count, head in obj["blocks"]:
                day = date.fromisoformat(d)
                seen = out.blocks.get((day, block))
                if seen is not None and (seen.first_position, seen.row_count, seen.head) != (
                    first,
                    count,
                    head,
                ):
                    out.problems.append(
                        f"{where}: day {d} block {block} anchored twice with different "
                        f"contents (first at line {seen.line + 1})"
                    )
                    continue
                if seen is None:
                    out.blocks[(day, block)] = AnchoredBlock(
                        day, block, first, count, head, int(obj["seq"])
                    )
        elif obj["kind"] == "retire":
            record = Retirement.from_json(obj["retirement"])
            out.retirements[record.day] = record
    return out


class Anchor:
    """Appends signed lines to the anchor file; remembers what it has anchored."""

    def __init__(self, path: Path, key: bytes) -> None:
        self.path = path
        self._key = key
        self._key_id = key_id(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        contents = read_anchor(path, key)
        self.anchored: dict[date, int] = {}
        """Per day, the highest block number anchored."""
        for day, block in contents.blocks:
            self.anchored[day] = max(self.anchored.get(day, -1), block)
        self.retired: set[date] = set(contents.retirements)
        self._seq = contents.last_seq
        self._prev = contents.last_hash
        self._offset = path.stat().st_size if path.exists() else 0

    @property
    def key(self) -> bytes:
        """The signing key (for retirement records in the database)."""
        return self._key

    def append_seal(self, watermark: int, blocks: Sequence[AnchoredBlock]) -> None:
        """Anchor `blocks` (one signed, fsynced line)."""
        if not blocks:
            return
        rows = [[b.day.isoformat(), b.block, b.first_position, b.row_count, b.head] for b in blocks]
        self._append({"kind": "seal", "watermark": watermark, "blocks": rows})
        for b in blocks:
            self.anchored[b.day] = max(self.anchored.get(b.day, -1), b.block)

    def append_retirement(self, record: Retirement) -> None:
        """Anchor a retirement record (one signed, fsynced line)."""
        self._append({"kind": "retire", "retirement": record.as_json()})
        self.retired.add(record.day)

    def _append(self, body: dict[str, Any]) -> None:
        with self.path.open("ab+") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                self._catch_up(f)
                obj = {"v": 1, "seq": self._seq + 1, "prev": self._prev, "at": time.time()}
                obj |= {"key_id": self._key_id} | body
                obj["sig"] = sign(self._key, obj)
                line = canonical(obj)
                f.write(line + b"\n")
                f.flush()
                os.fsync(f.fileno())
                self._seq += 1
                self._prev = hashlib.sha256(line).hexdigest()
                self._offset = f.tell()
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def _catch_up(self, f: Any) -> None:
        """Follow lines another process appended since our last write."""
        f.seek(self._offset)
        for raw in f:
            obj = json.loads(raw)
            self._seq = int(obj["seq"])
            self._prev = hashlib.sha256(raw.rstrip(b"\n")).hexdigest()
            if obj["kind"] == "seal":
                for d, block, *_ in obj["blocks"]:
                    day = date.fromisoformat(d)
                    self.anchored[day] = max(self.anchored.get(day, -1), block)
            elif obj["kind"] == "retire":
                self.retired.add(date.fromisoformat(obj["retirement"]["day"]))
        f.seek(0, os.SEEK_END)
