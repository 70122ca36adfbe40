"""Estimates updated batch by batch from sufficient statistics, without rereading the log.

`StreamingEstimator` keeps, per estimator, the count, means and co-moment
matrix of the kernel parts ``(d_t, c_t, m_t)`` (`service.ope.kernels.Moments`)
and the additive diagnostic sums (`service.ope.diagnostics.DiagnosticSums`).
From these alone it gives the same value, normal interval, diagnostics and
identifiability verdict as `service.ope.estimators.estimate` on all rounds at
once (to float rounding; tested to 1e-9). Per-round contributions are not
kept (``Estimate.contributions`` is None).

For anytime-valid monitoring feed each batch's `round_values` to a
`service.ope.sequences.AsymptoticCS`, or its weights and rewards to an
`OffPolicyBettingCS`; the fixed-sample interval of `estimate` must not be
checked repeatedly.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from service.contract import InvalidInput
from service.ope.data import BanditData
from service.ope.diagnostics import (
    TAIL_THRESHOLD,
    DiagnosticSums,
    caveats,
    identification_failure,
)
from service.ope.estimators import BASIS, SWITCH_TAU, check_estimator
from service.ope.intervals import check_level, normal_from_moments
from service.ope.kernels import Moments, parts
from service.ope.results import Basis, Estimate, Estimator, NotIdentifiable, Result


def round_values(
    data: BanditData, estimator: Estimator | str, tau: float = SWITCH_TAU
) -> NDArray[np.float64]:
    """Per-round terms ``d_t + c_t`` of an additive estimator (DM, IPS, DR, switch-DR).

    Their running mean is the estimate, so they can feed a confidence
    sequence. Self-normalised estimators have no fixed per-round terms (each
    depends on the final ``sum w``) and are refused.
    """
    est = check_estimator(data, estimator, tau)
    if not est.additive:
        raise InvalidInput(
            "estimator",
            f"must be additive (dm, ips, dr, switch-dr) for round values, got {est.value}",
        )
    p = parts(data, est, tau)
    out: NDArray[np.float64] = p.direct + p.correction
    return out


class StreamingEstimator:
    """One estimator of one target, updated from batches of logged rounds.

    Args:
        estimator: one of `Estimator`.
        level: nominal coverage of the (fixed-sample) normal interval.
        tau: switch-DR's weight threshold.
        support_tolerance: see `service.ope.diagnostics.identification_failure`.
        tail_threshold: weight above which a round counts as tail.
    """

    def __init__(
        self,
        estimator: Estimator | str,
        *,
        level: float = 0.95,
        tau: float = SWITCH_TAU,
        support_tolerance: float = 0.0,
        tail_threshold: float = TAIL_THRESHOLD,
    ) -> None:
        try:
            self.estimator = Estimator(estimator)
        except ValueError:
            names = ", ".join(e.value for e in Estimator)
            raise InvalidInput("estimator", f"must be one of {names}, got {estimator!r}") from None
        check_level(level)
        self.level = level
        self.tau = tau
        self.support_tolerance = support_tolerance
        self.tail_threshold = tail_threshold
        self.moments = Moments.empty()
        self.sums = DiagnosticSums(tail_threshold=tail_threshold)

    @property
    def n(self) -> int:
        """Rounds so far."""
        return self.moments.n

    def update(self, batch: BanditData) -> None:
        """Fold one batch of rounds into the statistics."""
        est = check_estimator(batch, self.estimator, self.tau)
        self.moments = self.moments.merge(Moments.of(parts(batch, est, self.tau)))
        self.sums = self.sums.merge(DiagnosticSums.of(batch, self.tail_threshold))

    def estimate(self) -> Result:
        """The estimate over every round so far (as `estimate` would give on them at once)."""
        if self.n == 0:
            raise InvalidInput("batch", "no rounds yet: call update() first")
        diag = self.sums.finish()
        basis = BASIS[self.estimator]
        if basis is not Basis.MODEL_BASED:
            failure = identification_failure(diag, self.support_tolerance)
            if failure is not None:
                return NotIdentifiable(self.estimator, failure, diag)
        value = self.moments.value()
        variance = self.moments.contribution_variance()
        interval = normal_from_moments(value, variance, self.n, self.level)
        return Estimate(
            estimator=self.estimator,
            basis=basis,
            value=value,
            interval=interval,
            n=self.n,
            diagnostics=diag,
            caveats=caveats(diag, basis, value, (interval.upper - interval.lower) / 2),
            contributions=None,
        )
