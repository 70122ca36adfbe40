"""What `verify` reports: problems (broken links) and the summary; merged anchor files."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from service.storage.chain.anchor import AnchorContents, read_anchor


@dataclass(frozen=True)
class Problem:
    """One broken link: where it is and what differs."""

    day: date | None
    block: int | None = None
    position: int | None = None
    what: str = field(default="", compare=False)
    request_id: str | None = field(default=None, compare=False)
    policy: str | None = field(default=None, compare=False)
    table: str | None = field(default=None, compare=False)
    """The chained table (``outcomes``, ``requests``); None: ``decisions`` or the anchor."""

    def __str__(self) -> str:
        where = [f"day {self.day}" if self.day else "anchor"]
        if self.table is not None:
            where[0] = f"{self.table} {where[0]}"
        if self.block is not None:
            where.append(f"block {self.block}")
        if self.position is not None:
            where.append(f"position {self.position}")
        who = ""
        if self.request_id:
            policy = f", policy `{self.policy}`" if self.policy else ""
            who = f" (request `{self.request_id}`{policy})"
        return f"{', '.join(where)}{who}: {self.what}"


@dataclass
class VerifyReport:
    """The outcome of `verify`."""

    problems: list[Problem] = field(default_factory=list)
    days: int = 0
    retired_days: int = 0
    rows: int = 0
    """Decisions verified."""
    blocks: int = 0
    """Blocks of the decisions chain verified."""
    chains: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per chain, (rows, blocks) verified."""
    pending_rows: int = 0
    """Decisions above the sealed cursor (written since the last seal)."""
    anchor_lines: int = 0

    def count(self, chain: str, rows: int) -> None:
        """One more block of `chain`, with `rows` rows, was read."""
        have = self.chains.get(chain, (0, 0))
        self.chains[chain] = (have[0] + rows, have[1] + 1)
        if chain == "decisions":
            self.rows += rows
            self.blocks += 1

    @property
    def ok(self) -> bool:
        """True when nothing is broken."""
        return not self.problems

    @property
    def first(self) -> Problem | None:
        """The first broken link: anchor problems first, then by day, block, position.

        On a tie a decision's problem comes before an outcome's or a request's.
        """
        if not self.problems:
            return None
        return min(
            self.problems,
            key=lambda p: (p.day or date.min, p.block or 0, p.position or 0, p.table is not None),
        )


def merge_anchors(paths: Sequence[Path], key: bytes) -> AnchorContents:
    """Read every anchor file; blocks anchored differently by two files are a problem."""
    merged = AnchorContents()
    for path in paths:
        contents = read_anchor(path, key)
        merged.problems += contents.problems
        merged.lines += contents.lines
        for k, b in contents.blocks.items():
            seen = merged.blocks.get(k)
            if seen is not None and (seen.first_position, seen.row_count, seen.head) != (
                b.first_position,
                b.row_count,
                b.head,
            ):
                merged.problems.append(
                    f"anchor {path.name}: {k[0]} day {k[1]} block {k[2]} differs from another "
                    "anchor file"
                )
            merged.blocks.setdefault(k, b)
        merged.retirements |= contents.retirements
    return merged
