"""Dead letters: journal records the decision log refuses for what they contain.

A database outage is retried for as long as it lasts (the journal absorbs it).
A record the database refuses every time — a bug, or an input the validator
should have caught — must not stop the scorer for good, and must not be lost
either: after `poison_attempts` failed writes the scorer bisects the batch,
commits everything else, and writes each refused record's raw payload here,
one file per journal sequence, with the reason beside it. A request of a batch
record (`RecordKind.MIRROR_BATCH`) is set aside alone, as its single-request
protobuf, in a file named by the record's sequence and its row
(``<seq>-<row>.pb``). Nothing acked is dropped; on-call sees
`understudy_dead_letters_total` move.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One refused record."""

    seq: int
    kind: str
    request_id: str
    payload: bytes
    reason: str
    row: int | None = None
    """Its row in a batch record (None: a single-request record)."""

    @property
    def name(self) -> str:
        """The file name stem: the seq, and for a batch record's request its row."""
        return f"{self.seq:020d}" if self.row is None else f"{self.seq:020d}-{self.row:06d}"


class DeadLetterBox:
    """A directory of refused records: `<name>.pb` (the request's payload) and `<name>.json`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def put(self, letter: DeadLetter) -> Path:
        """Store `letter` durably (fsync) and return the payload's path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        payload_path = self.directory / f"{letter.name}.pb"
        meta_path = self.directory / f"{letter.name}.json"
        for path, data in (
            (payload_path, letter.payload),
            (
                meta_path,
                json.dumps(
                    {
                        "seq": letter.seq,
                        "kind": letter.kind,
                        "request_id": letter.request_id,
                        "row": letter.row,
                        "reason": letter.reason,
                        "at": time.time(),
                    }
                ).encode(),
            ),
        ):
            with open(path, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        return payload_path

    def letters(self) -> list[dict[str, object]]:
        """The metadata of every stored letter, in sequence order."""
        if not self.directory.exists():
            return []
        return [json.loads(p.read_text()) for p in sorted(self.directory.glob("*.json"))]
