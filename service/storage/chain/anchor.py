"""The anchor: chain heads and retirements, signed, in an append-only file outside the database.

Whoever holds the service's database role can rewrite rows *and* the chain
tables; it cannot rewrite this file's history without the signing key, which
the database never sees. Each line is one JSON object::

    {"v": 1, "seq": 7, "prev": "<sha256 hex of line 6's bytes>", "kind": "seal",
     "at": 1764450000.0, "key_id": "<16 hex>", "watermark": 812,
     "blocks": [["2026-11-29", 3, 3000, 1000, "<head hex>"], ...],
     "sig": "<HMAC-SHA256 hex>"}

``kind`` is ``seal`` (``blocks``: day, block, first position, row count, head,
and the chain's name — ``outcomes``, ``requests`` — for a block not of the
decisions chain) or ``retire`` (``retirement``: the retirement record). ``sig`` is
HMAC-SHA256(key, the line's JSON without ``sig``, keys sorted, no spaces);
``seq`` counts lines from 0 and ``prev`` is the hash of the previous line
(64 zeros for the first), so a line removed, reordered or edited in the
middle is detected, and a forged line needs the key. Appends take an
exclusive ``flock`` (the service's sealer and a CLI seal may share the file)
and are fsynced before the call returns.

Every line is also appended, byte for byte, to the **witness**
(``UNDERSTUDY_CHAIN_WITNESS_FILE``), a second file opened ``O_APPEND`` in another
directory, while the anchor's lock is held: whoever can cut the anchor file
but not the witness cannot hide the cut (`compare_witness`; the sealer refuses
to sign while they differ, docs/tamper_evidence.md says who can do what).
Lines are numbered from 1 in every message, like an editor does.

The key is 32 random bytes, hex, in a file created with mode 0600 when
missing; a key file readable by group or others is refused.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

ZERO = "0" * 64
log = logging.getLogger(__name__)


class AnchorError(Exception):
    """Raised when the key file or the anchor file cannot be used as they are."""


class SealRefused(Exception):
    """Raised instead of signing: what would be signed does not extend the signed chain.

    The anchor or its witness was cut or edited, or the chain tables no longer
    match the signed heads; signing now would launder the tamper.
    """


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
    """The anchor file's line (1-based, as an editor numbers it) that signed it; -1: none yet."""
    chain: str = "decisions"
    """The chain the block belongs to (``decisions``, ``outcomes``, ``requests``)."""

    def as_json(self) -> list[Any]:
        """The block as an anchor line lists it (decisions blocks without the chain's name)."""
        row: list[Any] = [self.day.isoformat(), self.block, self.first_position, self.row_count]
        return [*row, self.head] + ([] if self.chain == "decisions" else [self.chain])


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

    blocks: dict[tuple[str, date, int], AnchoredBlock] = field(default_factory=dict)
    """By (chain, day, block)."""
    retirements: dict[date, Retirement] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    lines: int = 0
    last_seq: int = -1
    last_hash: str = ZERO
    last: dict[tuple[str, date], AnchoredBlock] = field(default_factory=dict)
    """Per (chain, day), the highest block anchored."""
    keep_blocks: bool = True
    """False: keep only `last` (a long-running sealer need not hold every block)."""

    def heads(self) -> dict[tuple[str, date], AnchoredBlock]:
        """Per (chain, day), the highest block anchored."""
        return self.last


def _block_of(entry: Sequence[Any], line: int) -> AnchoredBlock:
    d, block, first, count, head, *chain = entry
    name = str(chain[0]) if chain else "decisions"
    return AnchoredBlock(
        date.fromisoformat(d), int(block), int(first), int(count), head, line, name
    )


def feed_lines(out: AnchorContents, data: bytes, key: bytes, name: str) -> None:
    """Check the complete lines of `data` (following those `out` has read) into `out`."""
    for raw in data.splitlines():
        out.lines += 1
        where = f"anchor {name} line {out.lines}"
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
        out.last_hash = hashlib.sha256(raw).hexdigest()
        if obj["kind"] == "seal":
            for entry in obj["blocks"]:
                b = _block_of(entry, out.lines)
                seen_last = out.last.get((b.chain, b.day))
                if seen_last is None or b.block > seen_last.block:
                    out.last[(b.chain, b.day)] = b
                if not out.keep_blocks:
                    continue
                k = (b.chain, b.day, b.block)
                seen = out.blocks.get(k)
                if seen is not None and (seen.first_position, seen.row_count, seen.head) != (
                    b.first_position,
                    b.row_count,
                    b.head,
                ):
                    out.problems.append(
                        f"{where}: {b.chain} day {b.day} block {b.block} anchored twice with "
                        f"different contents (first at line {seen.line})"
                    )
                    continue
                if seen is None:
                    out.blocks[k] = b
        elif obj["kind"] == "retire":
            record = Retirement.from_json(obj["retirement"])
            out.retirements[record.day] = record


def read_bytes(path: Path | None) -> bytes:
    """A file's bytes up to its last newline (b"" when it does not exist)."""
    if path is None or not path.exists():
        return b""
    data = path.read_bytes()
    return data[: data.rfind(b"\n") + 1]


def read_anchor(path: Path, key: bytes) -> AnchorContents:
    """Read and check every line of `path`; problems are collected, not raised."""
    out = AnchorContents()
    if path.exists():
        feed_lines(out, path.read_bytes(), key, path.name)
    return out


def compare_witness(
    anchor: bytes, witness: bytes, anchor_name: str, witness_name: str, first_line: int = 1
) -> tuple[list[str], bytes]:
    """Problems between an anchor's lines and its witness's, and the tail the witness lacks.

    Every line goes to the anchor first, then to the witness, so a witness
    shorter than its anchor is a crash between the two writes (the tail is
    copied by the next seal); an anchor that lacks lines its witness holds was
    cut, and a line that differs was edited. `first_line` numbers the first line
    of `anchor` and `witness` (both start at the same line).
    """
    a_lines, w_lines = anchor.splitlines(), witness.splitlines()
    for i, (a, w) in enumerate(zip(a_lines, w_lines, strict=False)):
        if a != w:
            n = first_line + i
            return [
                f"anchor {anchor_name} line {n} differs from its witness {witness_name} line {n} "
                "(one of them was edited)"
            ], b""
    if len(w_lines) > len(a_lines):
        lo, hi = first_line + len(a_lines), first_line + len(w_lines) - 1
        which = f"line {lo}" if lo == hi else f"lines {lo}-{hi}"
        return [
            f"anchor {anchor_name} lacks {which} that its witness {witness_name} holds: "
            "the anchor file was cut"
        ], b""
    return [], anchor[len(witness) :] if len(anchor) > len(witness) else b""


class Anchor:
    """Appends signed lines to the anchor file and its witness; remembers what they hold.

    Args:
        path: the anchor file.
        key: the signing key.
        witness: the second, append-only sink every line is also written to (None: none).
    """

    def __init__(self, path: Path, key: bytes, witness: Path | None = None) -> None:
        self.path = path
        self.witness = witness
        self._key = key
        self._key_id = key_id(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        if witness is not None:
            witness.parent.mkdir(parents=True, exist_ok=True)
        data = read_bytes(path)
        self.contents = AnchorContents(keep_blocks=False)
        feed_lines(self.contents, data, key, path.name)
        self.problems: list[str] = list(self.contents.problems)
        """What is wrong with the anchor or its witness; the sealer refuses to sign while any."""
        self._offset = len(data)
        self._w_offset = 0
        self._w_lines = 0
        self._w_lag = b""
        if witness is not None:
            w = read_bytes(witness)
            cut, self._w_lag = compare_witness(data, w, path.name, str(witness))
            self.problems += cut
            self._w_offset = len(w)
            self._w_lines = w.count(b"\n")

    @property
    def key(self) -> bytes:
        """The signing key (for retirement records in the database)."""
        return self._key

    @property
    def anchored(self) -> dict[tuple[str, date], int]:
        """Per (chain, day), the highest block number anchored."""
        return {k: b.block for k, b in self.contents.heads().items()}

    @property
    def retired(self) -> set[date]:
        """Days with an anchored retirement record."""
        return set(self.contents.retirements)

    def check(self) -> None:
        """Follow lines other processes appended; refuse when the files were cut or edited.

        Cheap (it reads only what was appended since this process last looked),
        so the sealer calls it before every seal.

        Raises:
            SealRefused: the anchor or its witness holds less than before, or
                they differ, or a line does not check.
        """
        with self.path.open("ab+") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                self._follow(f)
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        if self.problems:
            raise SealRefused(
                "refusing to sign: "
                + "; ".join(self.problems[:3])
                + (f" (and {len(self.problems) - 3} more)" if len(self.problems) > 3 else "")
            )

    def append_seal(self, watermark: int, blocks: Sequence[AnchoredBlock]) -> None:
        """Anchor `blocks` (one signed, fsynced line)."""
        if not blocks:
            return
        self._append(
            {"kind": "seal", "watermark": watermark, "blocks": [b.as_json() for b in blocks]}
        )

    def append_retirement(self, record: Retirement) -> None:
        """Anchor a retirement record (one signed, fsynced line)."""
        self._append({"kind": "retire", "retirement": record.as_json()})

    def _append(self, body: dict[str, Any]) -> None:
        with self.path.open("ab+") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                self._follow(f)
                if self.problems:
                    raise SealRefused("refusing to sign: " + "; ".join(self.problems[:3]))
                obj = {
                    "v": 1,
                    "seq": self.contents.last_seq + 1,
                    "prev": self.contents.last_hash,
                    "at": time.time(),
                }
                obj |= {"key_id": self._key_id} | body
                obj["sig"] = sign(self._key, obj)
                line = canonical(obj) + b"\n"
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
                self._offset = f.tell()
                feed_lines(self.contents, line, self._key, self.path.name)
                self._witness_append(line)
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def _witness_append(self, data: bytes) -> None:
        """Append `data` to the witness (O_APPEND, fsynced); the anchor's lock is held."""
        if self.witness is None or not data:
            return
        self._w_lines += data.count(b"\n")
        fd = os.open(self.witness, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
            self._w_offset = os.fstat(fd).st_size
        finally:
            os.close(fd)

    def _follow(self, f: Any) -> None:
        """Read what was appended to the anchor and the witness since we last looked.

        Holding the anchor's lock: every writer appends the same bytes to both
        under it, so the two new tails must be equal (or the witness's shorter,
        after a writer crashed between them: it is completed).
        """
        size = os.fstat(f.fileno()).st_size
        if size < self._offset:
            self.problems.append(
                f"anchor {self.path.name} shrank from {self._offset} to {size} bytes since it "
                "was read: the anchor file was cut"
            )
            self._offset = size
            return
        f.seek(self._offset)
        new = f.read()
        new = new[: new.rfind(b"\n") + 1]
        before = len(self.contents.problems)
        feed_lines(self.contents, new, self._key, self.path.name)
        self.problems += self.contents.problems[before:]
        self._offset += len(new)
        f.seek(0, os.SEEK_END)
        if self.witness is None:
            return
        w_size = self.witness.stat().st_size if self.witness.exists() else 0
        if w_size < self._w_offset:
            self.problems.append(
                f"witness {self.witness} shrank from {self._w_offset} to {w_size} bytes "
                "since it was read: the witness was cut"
            )
            self._w_offset = w_size
            return
        w_new = b""
        if w_size > self._w_offset:
            with self.witness.open("rb") as w:
                w.seek(self._w_offset)
                w_new = w.read()
        w_new = w_new[: w_new.rfind(b"\n") + 1]
        self._w_offset += len(w_new)
        lag = self._w_lag + new
        self._w_lag = b""
        first_line = self._w_lines + 1
        self._w_lines += w_new.count(b"\n")
        cut, missing = compare_witness(lag, w_new, self.path.name, str(self.witness), first_line)
        self.problems += cut
        if not cut and missing:
            log.warning(
                "witness %s lacked %d bytes of the anchor (a crash between the two writes, or a "
                "new witness): copied",
                self.witness,
                len(missing),
            )
            self._witness_append(missing)
