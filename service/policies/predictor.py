"""Action-conditioned predictors: per option, a predicted outcome with uncertainty.

A predictor answers "if this request were placed on this option, what would
its throughput be?" as quantiles, so planning policies and doubly robust
estimates can weigh options by predicted outcome and know how sure the
prediction is. Predictions are keyed by name, aligned with the batch's option
rows, and travel in `PolicyDecisions.predictions`.

Names (all float32, shape ``(n_options_total,)``):

- ``throughput_q10`` / ``throughput_q50`` / ``throughput_q90``: work units
  per second of the whole job (the unit of `Outcome.throughput`).
- ``completion_time_q10`` / ``_q50`` / ``_q90``: ``work_units / throughput``
  seconds of run time (queueing excluded), NaN where the workload does not
  say its `work_units`. The slow quantile of time comes from the low
  quantile of throughput: ``time_q90 = work / throughput_q10``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from service.policies.base import ScoringBatch

QUANTILE_LEVELS: tuple[float, float, float] = (0.1, 0.5, 0.9)
THROUGHPUT_NAMES: tuple[str, str, str] = ("throughput_q10", "throughput_q50", "throughput_q90")
COMPLETION_NAMES: tuple[str, str, str] = (
    "completion_time_q10",
    "completion_time_q50",
    "completion_time_q90",
)
PREDICTION_NAMES: tuple[str, ...] = (*THROUGHPUT_NAMES, *COMPLETION_NAMES)


@runtime_checkable
class Predictor(Protocol):
    """What throughput-greedy, ONNX policies with a predictor and OPE call."""

    @property
    def name(self) -> str:
        """Registry name of the predictor."""
        ...

    @property
    def version(self) -> str:
        """Version of the predictor artifact."""
        ...

    def predict(self, batch: ScoringBatch) -> dict[str, NDArray[np.float32]]:
        """Predictions named as in `PREDICTION_NAMES`, one value per option row."""
        ...


def with_completion_time(
    batch: ScoringBatch, throughput: NDArray[np.float32]
) -> dict[str, NDArray[np.float32]]:
    """All `PREDICTION_NAMES` from a ``(n_options_total, 3)`` throughput-quantile matrix.

    Throughput quantiles must be ordered (q10 <= q50 <= q90) and positive;
    completion-time quantiles are derived per request from ``work_units``.
    """
    work = np.array(
        [
            np.nan if r.workload.work_units is None else r.workload.work_units
            for r in batch.requests
        ],
        dtype=np.float64,
    )
    row_work = work[batch.request_of_row] if len(work) else np.zeros(0)
    out = {name: throughput[:, i].astype(np.float32) for i, name in enumerate(THROUGHPUT_NAMES)}
    with np.errstate(divide="ignore"):
        for i, name in enumerate(COMPLETION_NAMES):
            out[name] = (row_work / throughput[:, 2 - i].astype(np.float64)).astype(np.float32)
    return out
