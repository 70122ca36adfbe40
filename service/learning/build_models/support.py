"""Training support of a quantile predictor, and the interval it gives outside it.

Why: gradient-boosted quantile trees extrapolate by repeating the nearest
leaf. Where that leaf held rows of one deterministic configuration, q10, q50
and q90 are the same number, and with a conformal offset clipped at zero the
80% interval has zero width: ``learned-outcome`` said ``[7.6179, 7.6179,
7.6179]`` for a 4-GPU Recommendation job on V100, a configuration its logs
never held. A zero-width interval claims certainty exactly where the model
knows least, and the pessimistic planner trusts it most there.

The rule (both predictors, written into the ONNX graph by
`service.learning.build_models.export.predictor_onnx`):

- **In support** means: the row's configuration columns (the first
  `n_cell_columns`: job, hardware capabilities and accelerators taken, see
  `CELL_COLUMNS`) equal those of some training row (to `TOLERANCE`), and every
  column lies within the training range ``[min, max]`` (to `TOLERANCE`).
- **Outside support**, the interval is widened to at least the widest one the
  model gives any training row, on each side of the median separately
  (``mid - lo`` and ``hi - mid`` in log space, conformal offset included), and
  never below `MIN_HALF_WIDTH_LOG`; the median is unchanged. The row is
  flagged: the graph's second output ``out_of_support`` is 1.0, and the
  service puts it into the predictions as ``out_of_support``.

Pure numpy, so the policies' side can import nothing from here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

TOLERANCE = 1e-4
"""Absolute tolerance of both tests: float32 rows from the same computation are equal."""
CELL_COLUMNS = 13
"""Predictor columns 0-12: family one-hot, batch size, four capability numbers, accelerators."""
MIN_HALF_WIDTH_LOG = 0.05
"""Floor of each half-width outside support (log space, about 5%): never zero."""


@dataclass(frozen=True, eq=False)
class TrainingSupport:
    """What a predictor saw in training, and how wide it answers outside it.

    Attributes:
        cells: float32 ``(K, n_cell_columns)``, distinct configuration rows seen.
        low, high: float32 ``(d,)``, per-column training minimum and maximum.
        half_width_lo, half_width_hi: log-space widening outside support.
    """

    cells: NDArray[np.float32]
    low: NDArray[np.float32]
    high: NDArray[np.float32]
    half_width_lo: float
    half_width_hi: float

    @property
    def n_cell_columns(self) -> int:
        """Columns compared exactly."""
        return int(self.cells.shape[1])

    def outside(self, x: NDArray[np.float32]) -> NDArray[np.bool_]:
        """True for rows of `x` outside the support (the rule in the module docstring)."""
        x = x.astype(np.float32, copy=False)
        k = self.n_cell_columns
        if len(x) == 0:
            return np.zeros(0, dtype=bool)
        diff = np.abs(x[:, None, :k] - self.cells[None, :, :]).max(axis=2).min(axis=1)
        out_range = ((x < self.low - TOLERANCE) | (x > self.high + TOLERANCE)).any(axis=1)
        result: NDArray[np.bool_] = (diff > TOLERANCE) | out_range
        return result

    def widen(self, q_log: NDArray[np.float64], outside: NDArray[np.bool_]) -> NDArray[np.float64]:
        """`q_log` ``(n, 3)`` with the out-of-support rows widened around their median."""
        q = q_log.copy()
        mid = q[:, 1]
        q[:, 0] = np.where(outside, np.minimum(q[:, 0], mid - self.half_width_lo), q[:, 0])
        q[:, 2] = np.where(outside, np.maximum(q[:, 2], mid + self.half_width_hi), q[:, 2])
        return q


def fit_support(
    x: NDArray[np.float32], q_log: NDArray[np.float64], n_cell_columns: int = CELL_COLUMNS
) -> TrainingSupport:
    """The support of training rows `x`, widened by the model's intervals `q_log` on them.

    `q_log` is ``(n, 3)``: the fitted model's log quantiles on its own
    training rows, conformal offset applied (what it would serve there).
    """
    x = x.astype(np.float32, copy=False)
    cells = np.unique(x[:, :n_cell_columns], axis=0)
    return TrainingSupport(
        cells=np.ascontiguousarray(cells, dtype=np.float32),
        low=x.min(axis=0),
        high=x.max(axis=0),
        half_width_lo=max(float((q_log[:, 1] - q_log[:, 0]).max()), MIN_HALF_WIDTH_LOG),
        half_width_hi=max(float((q_log[:, 2] - q_log[:, 1]).max()), MIN_HALF_WIDTH_LOG),
    )
