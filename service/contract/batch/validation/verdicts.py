"""The verdict of a batch being built, and the refusal of one request by index.

`_Verdicts` is where every rule family lands: a rule hands it a boolean mask
over requests (or over snapshots, for a fault of a shared cluster state) and a
function that names the fault; only requests not refused yet are refused, so
the first rule a request breaks, in validate_request's order, is the one named.
Vectorised because the decision is one mask operation per rule; Python runs
only for the refused requests, one message each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.contract.batch import RequestBatch
from service.contract.batch.validation.arrays import Mask
from service.contract.errors import InvalidInput
from service.contract.rejections import RejectionReason, refusal_of


@dataclass(frozen=True, slots=True)
class IndexedRefusal:
    """One refused request of a batch: its position in what was sent (its row, for
    `validate_batch`), the field path as the single-request validator names it, the
    message (the `InvalidInput`'s ``problem``, without the field) and the reason code
    (`service.contract.rejections.refusal_of` of that error)."""

    index: int
    field: str
    message: str
    reason: RejectionReason


@dataclass(frozen=True, eq=False)
class BatchVerdict:
    """Per-request verdict of a batch: ``ok[r]`` True when request r is accepted;
    ``refusals`` one per refused request, sorted by index."""

    ok: NDArray[np.bool_]
    refusals: tuple[IndexedRefusal, ...]

    @property
    def n_accepted(self) -> int:
        """Requests accepted."""
        return int(np.count_nonzero(self.ok))


def refusal_from(index: int, exc: InvalidInput) -> IndexedRefusal:
    """The refusal of request `index` for `exc` (what validate_request raised)."""
    refusal = refusal_of(exc)
    assert refusal is not None  # an InvalidInput always names its field
    return IndexedRefusal(index, exc.field, exc.problem, refusal.reason)


class _Verdicts:
    """Which requests are refused so far, and why (first rule wins)."""

    def __init__(self, batch: RequestBatch | None, n: int) -> None:
        self.refused = np.zeros(n, dtype=np.bool_)
        self.out: dict[int, IndexedRefusal] = {}
        self.state_index = batch.state_index if batch is not None else None

    def request(
        self,
        bad: Mask,
        problem: Callable[[int], tuple[str, str]],
        error: type[InvalidInput] = InvalidInput,
    ) -> None:
        """Refuse the requests of `bad` not refused yet; problem(r) -> (field, problem)."""
        if not bad.any():
            return
        new = np.flatnonzero(bad & ~self.refused)
        for r in new.tolist():
            field, text = problem(r)
            self.out[r] = refusal_from(r, error(field, text))
        self.refused[new] = True

    def snapshot(self, bad: Mask, problem: Callable[[int], tuple[str, str]]) -> None:
        """Refuse every request on a snapshot of `bad` (per snapshot) not refused yet,
        all with the snapshot's one field and message."""
        if not bad.any():
            return
        assert self.state_index is not None
        new = np.flatnonzero(bad[self.state_index] & ~self.refused)
        if not len(new):
            return
        made: dict[int, tuple[str, str]] = {}
        for r in new.tolist():
            s = int(self.state_index[r])
            if s not in made:
                made[s] = problem(s)
            field, text = made[s]
            self.out[r] = refusal_from(r, InvalidInput(field, text))
        self.refused[new] = True

    def verdict(self) -> BatchVerdict:
        return BatchVerdict(ok=~self.refused, refusals=tuple(self.out[r] for r in sorted(self.out)))
