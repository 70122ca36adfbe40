"""Production rules: `_check_production` and `check_distribution` over rows.

Production's chosen option, propensity, distribution (one probability per
option, each in [0, 1], summing to 1 with the defer probability) and the
propensity's agreement with the chosen probability. Shared by requests and
outcomes (`n_options` None). Vectorised: the sum is a `reduceat` per row, and
only rows within rounding of the tolerance are summed again by `math.fsum`, as
validate_request sums them.
"""

from __future__ import annotations

import math

import numpy as np

from service.contract.actions import DEFER
from service.contract.batch import ProductionColumns
from service.contract.batch.validation.arrays import I64, Mask, _segment_first
from service.contract.batch.validation.context import _Pass
from service.contract.batch.validation.verdicts import _Verdicts
from service.contract.production import SUM_TOLERANCE

_INT32_BOUND = 2**31 - 1


class _ProductionRules(_Pass):
    """`_check_production` for the requests that carry production's decision."""

    def production(self) -> None:
        if not self.present.any():
            return
        _production(self.v, self.pp, self.present, self.n_opts)


def _production(v: _Verdicts, p: ProductionColumns, present: Mask, n_options: I64 | None) -> None:
    """`_check_production` and `check_distribution` over rows (n_options None: outcomes)."""
    n = len(present)
    option = p.option.astype(np.int64)
    bound = np.full(n, _INT32_BOUND, np.int64) if n_options is None else n_options
    v.request(
        present & (option != DEFER) & ~((option >= 0) & (option < bound)),
        lambda r: (
            "production.option",
            f"must be -1 (defer) or in [0, {int(bound[r])}), got {int(option[r])}",
        ),
    )
    prop = np.asarray(p.propensity, np.float64)
    sent = ~np.isnan(prop)
    v.request(
        present & sent & ~(np.isfinite(prop) & (prop > 0.0) & (prop <= 1.0)),
        lambda r: ("production.propensity", f"must be in (0, 1], got {float(prop[r])}"),
    )
    po = p.probability_offsets
    k = (po[1:] - po[:-1]) if len(po) else np.zeros(n, np.int64)
    has = present & (k > 0)
    defer_raw = np.asarray(p.defer_probability, np.float64)
    defer_sent = ~np.isnan(defer_raw)
    v.request(
        present & ~has & defer_sent,
        lambda r: (
            "production.defer_probability",
            "needs `production.probabilities` (one per option) alongside it",
        ),
    )
    if not has.any():
        return
    if n_options is not None:
        v.request(
            has & (k != n_options),
            lambda r: (
                "production.probabilities",
                f"must hold one probability per option ({int(n_options[r])}), got {int(k[r])}",
            ),
        )
    probs = np.asarray(p.probabilities, np.float64)
    po = np.asarray(po, np.int64)
    row_bad = ~((probs >= 0.0) & (probs <= 1.0))  # NaN fails it
    if row_bad.any():
        bad, first = _segment_first(row_bad, po, n)
        v.request(
            has & bad,
            lambda r: (
                f"production.probabilities[{int(first[r])}]",
                f"must be finite and in [0, 1], got {float(probs[po[r] + first[r]])}",
            ),
        )
    defer = np.where(defer_sent, defer_raw, 0.0)
    v.request(
        has & ~(np.isfinite(defer) & (defer >= 0.0) & (defer <= 1.0)),
        lambda r: (
            "production.defer_probability",
            f"must be finite and in [0, 1], got {float(defer[r])}",
        ),
    )
    # the sum: a per-row numpy sum (error below k * 1.2e-16) decides where it is clearly
    # in or out; math.fsum, what validate_request uses, decides the rows near the edge.
    # (A NaN or inf value is refused above; zeroed so it cannot spoil other rows.)
    clean = np.where(np.isfinite(probs), probs, 0.0)
    sums = np.zeros(n, np.float64)
    rows_with = k > 0  # their starts increase strictly: each sum runs to the next start
    sums[rows_with] = np.add.reduceat(clean, po[:-1][rows_with])
    approx = sums + defer
    off = np.abs(approx - 1.0)
    near = has & ~v.refused & (np.abs(off - SUM_TOLERANCE) < 1e-9 + 1e-12 * k)
    exact = {
        r: math.fsum(probs[po[r] : po[r + 1]].tolist()) + float(defer[r])
        for r in np.flatnonzero(near).tolist()  # rows at the edge only
    }
    wrong = has & (off > SUM_TOLERANCE)
    for r, t in exact.items():
        wrong[r] = abs(t - 1.0) > SUM_TOLERANCE

    def sum_problem(r: int) -> tuple[str, str]:
        t = exact.get(r)
        if t is None:
            t = math.fsum(probs[po[r] : po[r + 1]].tolist()) + float(defer[r])
        return (
            "production.probabilities",
            "must sum to 1 with `production.defer_probability` "
            f"(within {SUM_TOLERANCE:g}), got {t!r}",
        )

    v.request(wrong, sum_problem)
    v.request(
        has & (option != DEFER) & (option >= k),
        lambda r: (
            "production.option",
            f"must index `production.probabilities` (< {int(k[r])}), got {int(option[r])}",
        ),
    )
    inside = (option >= 0) & (option < k)
    pick = np.where(has & inside, po[:-1] + np.where(inside, option, 0), 0)
    chosen = np.where(
        option == DEFER,
        defer,
        probs[np.minimum(pick, max(len(probs) - 1, 0))] if len(probs) else 0.0,
    )

    def where(r: int) -> str:
        o = int(option[r])
        return "production.defer_probability" if o == DEFER else f"production.probabilities[{o}]"

    v.request(
        has & (chosen <= 0.0),
        lambda r: (where(r), f"must be > 0: production chose it, got {float(chosen[r])}"),
    )
    v.request(
        has & sent & (np.abs(prop - chosen) > SUM_TOLERANCE),
        lambda r: (
            "production.propensity",
            f"must equal `{where(r)}` (within {SUM_TOLERANCE:g}), "
            f"got {float(prop[r])} vs {float(chosen[r])}",
        ),
    )
