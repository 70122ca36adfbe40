"""Per-option feasibility in the form the decision log keeps: once per request, a bitmask.

The scorer computes feasibility once per micro-batch (`make_batch`, which keeps
`Feasibility.bits` on the `ScoringBatch`); this module slices those bits per
request into the stored form — little-endian uint16, one per option, bit i set
when ``SIGNALS[i]`` fired — keyed by journal sequence number, so a sub-batch
(the scorer's bisection after a refused write) finds its requests' bits without
any realignment (a request of a batch record, which shares its record's seq, is
keyed by ``(seq, row)``: `LoggedRequest.key`). Only when no policy scored the
batch (every one quarantined) is the feasibility function run here, so a
request is never checked twice and its row always says why each option was
masked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.contract import MirrorRequest
from service.contract.feasibility import check_feasibility_batch
from service.policies.base import ScoringBatch

RequestKey = int | tuple[int, int]
"""A request's journal seq, or ``(seq, row)`` for a request of a batch record."""

BITS_DTYPE = np.dtype("<u2")
"""Layout of ``requests.feasibility_bits``: one little-endian uint16 per option."""


@dataclass(frozen=True, eq=False)
class LoggedFeasibility:
    """The feasibility bits of a batch's requests, by journal sequence number.

    Attributes:
        version: the feasibility function's version (``requests.feasibility_version``).
        bits: request key (journal seq, or ``(seq, row)``) -> ``requests.feasibility_bits``.
    """

    version: str
    bits: Mapping[RequestKey, bytes]

    def of(self, seq: RequestKey) -> tuple[str | None, bytes | None]:
        """``(version, bits)`` for the request at `seq`; ``(None, None)`` if not known."""
        found = self.bits.get(seq)
        return (self.version, found) if found is not None else (None, None)


def pack_bits(bits: NDArray[np.integer]) -> bytes:
    """Per-option bits as ``requests.feasibility_bits`` stores them."""
    return np.asarray(bits, dtype=BITS_DTYPE).tobytes()


def logged_feasibility(
    seqs: Sequence[RequestKey], requests: Sequence[MirrorRequest], scored: ScoringBatch | None
) -> LoggedFeasibility:
    """Each request's stored bits, from the batch that scored them (or one pass if none did).

    Args:
        seqs: journal sequence numbers (or `LoggedRequest.key`), one per request.
        requests: the requests, in the order `scored` holds them.
        scored: the batch the policies ran on; None when no policy ran.
    """
    if scored is not None and scored.feasibility_bits is not None:
        bits, offsets, version = scored.feasibility_bits, scored.offsets, scored.feasibility_version
    elif requests:
        feasibility = check_feasibility_batch(
            [(r.state, r.workload, r.options, r.quota_remaining) for r in requests]
        )
        counts = [r.options.n_options for r in requests]
        offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        bits, version = feasibility.bits, feasibility.version
    else:
        return LoggedFeasibility("", {})
    raw = np.asarray(bits, dtype=BITS_DTYPE).tobytes()
    width = BITS_DTYPE.itemsize
    bounds = (np.asarray(offsets, dtype=np.int64) * width).tolist()
    return LoggedFeasibility(
        version,
        {seq: raw[bounds[i] : bounds[i + 1]] for i, seq in enumerate(seqs)},
    )
