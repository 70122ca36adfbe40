"""The support rule: `check_request_support`, no mass on an infeasible option.

Runs last, for the requests that carry a distribution and are still clean. The
feasibility function's joined columns are built from the batch's columns
(`joined.joined_feasibility`) and evaluated by the code `check_feasibility_batch`
runs (`feasibility_of_joined`): one pass over the batch, no request objects.
"""

from __future__ import annotations

import numpy as np

from service.contract.batch.validation.arrays import _ragged, _segment_first
from service.contract.batch.validation.context import _Pass
from service.contract.batch.validation.joined import joined_feasibility
from service.contract.feasibility import feasibility_of_joined


class _SupportRules(_Pass):
    """`check_request_support` over the requests still clean."""

    def support(self) -> None:
        """`check_request_support`: no probability on an option feasibility masks.

        The feasibility function's joined columns (`feasibility._Batch`) are built from
        the batch's columns (`joined_feasibility`), for the requests that carry a
        distribution and are not refused, and evaluated by the same code
        `check_feasibility_batch` runs (`feasibility_of_joined`): one pass, no
        request objects.
        """
        todo = np.flatnonzero(self.has_probs & ~self.v.refused)
        if not len(todo):
            return
        feasibility = feasibility_of_joined(joined_feasibility(self.b, todo))
        po = np.asarray(self.pp.probability_offsets, np.int64)
        counts = self.n_opts[todo]
        rows = _ragged(po[todo], counts)
        probs = self.pp.probabilities[rows]
        bad = (probs != 0.0) & ~feasibility.mask
        if not bad.any():
            return
        off = np.zeros(len(todo) + 1, np.int64)
        np.cumsum(counts, out=off[1:])
        has, first = _segment_first(bad, off, len(todo))
        mask = np.zeros(self.n, np.bool_)
        mask[todo[has]] = True
        where = {int(todo[k]): (k, int(first[k])) for k in np.flatnonzero(has).tolist()}

        def problem(r: int) -> tuple[str, str]:
            k, i = where[r]
            g = int(off[k]) + i
            signals = ", ".join(s.value for s in feasibility.failed(g))
            return (
                f"production.probabilities[{i}]",
                f"must be 0: option {i} is infeasible (signals {signals}), got {float(probs[g])}",
            )

        self.v.request(mask, problem)
