"""Array helpers over CSR segments, shared by every rule family.

A rule finds offending rows (nodes, devices, entries, probabilities) as one
boolean mask; these map the rows to the segment that owns them (snapshot,
request) and find each segment's first offending row, by cumulative sums and
binary search rather than a loop over segments, so the cost is per row of numpy
work and not per request of Python.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

I64 = NDArray[np.int64]
Mask = NDArray[np.bool_]


def _segment_first(mask: Mask, offsets: I64, n_segments: int) -> tuple[Mask, I64]:
    """Per CSR segment: whether any row of `mask` is set, and the first such row's
    local index (-1 where none). Rows of a segment are contiguous (CSR)."""
    has = np.zeros(n_segments, dtype=np.bool_)
    first = np.full(n_segments, -1, dtype=np.int64)
    rows = np.flatnonzero(mask)
    if not len(rows):
        return has, first
    seg = np.searchsorted(offsets, rows, side="right") - 1
    keep = np.ones(len(rows), dtype=np.bool_)
    keep[1:] = seg[1:] != seg[:-1]
    seg, rows = seg[keep], rows[keep]
    has[seg] = True
    first[seg] = rows - offsets[seg]
    return has, first


def _counts_in(mask: Mask, offsets: I64) -> I64:
    """Set rows of `mask` per segment of `offsets` (any offsets within bounds)."""
    total = np.zeros(len(mask) + 1, dtype=np.int64)
    np.cumsum(mask, out=total[1:])
    return total[offsets[1:]] - total[offsets[:-1]]


def _repair(offsets: I64, bounds: I64) -> tuple[Mask, I64, I64]:
    """Offsets that may step backwards inside a segment (bounds: the offsets' positions
    where segments start, monotone): (segment has a backward step, its first local
    step + 1, offsets made monotone by flattening the bad segments to their start).

    A backward step is a request's (or snapshot's) own fault, refused by index;
    the repaired offsets keep every *other* segment's rows where they are, so the
    rules after it can map rows to segments by binary search.
    """
    n_seg = len(bounds) - 1
    steps = offsets[1:] - offsets[:-1]
    neg = steps < 0
    if not len(steps) or not neg.any():
        return np.zeros(n_seg, np.bool_), np.full(n_seg, -1, np.int64), offsets
    bad, first = _segment_first(neg, bounds, n_seg)
    pos = np.arange(len(offsets), dtype=np.int64)
    seg = np.minimum(np.searchsorted(bounds, pos, side="right") - 1, n_seg - 1)
    inside = bad[seg] & (pos > bounds[seg]) & (pos < bounds[seg + 1])
    fixed = offsets.copy()
    fixed[inside] = offsets[bounds[seg[inside]]]
    return bad, first + 1, fixed


def _ragged(starts: I64, lengths: I64) -> I64:
    """``concatenate([arange(a, a + n) for a, n in zip(starts, lengths)])`` without the loop."""
    lengths = np.asarray(lengths, np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(lengths)
    out: I64 = np.repeat(np.asarray(starts, np.int64) - (ends - lengths), lengths) + np.arange(
        total, dtype=np.int64
    )
    return out


def _counts_sum(values: NDArray[np.generic], offsets: I64) -> I64:
    total = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, dtype=np.int64, out=total[1:])
    return total[offsets[1:]] - total[offsets[:-1]]
