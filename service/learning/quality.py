"""How good a quantile predictor is: pinball loss, interval coverage, and group baselines.

Pinball (quantile) loss of prediction ``q`` for level ``tau`` and outcome ``y``
(Koenker & Bassett, Econometrica 1978)::

    rho_tau(y, q) = max(tau * (y - q), (tau - 1) * (y - q))

averaged here over rows and the levels ``(0.1, 0.5, 0.9)``; it is a proper
scoring rule for quantiles, so a lower value is a better predictive
distribution, not just a better point. Coverage is the share of outcomes
inside ``[q10, q90]`` (nominal 80%).

Baselines, fitted on the training rows only, keyed by (job type, accelerator
class) — the issue's "per-(job type, accelerator class) mean":

- `group_mean`: the group's mean used for every level (the literal reading);
- `group_quantiles`: the group's own empirical 10/50/90% quantiles — a
  stronger baseline for a quantile loss, and the one the acceptance gate uses.

A test row whose group never occurred in training (a class never seen, e.g.
P100 in ``new_class``) falls back to its job type over all classes, then to
all rows; how many did is reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

LEVELS: tuple[float, float, float] = (0.1, 0.5, 0.9)


def pinball(
    y: NDArray[np.float64], q: NDArray[np.float64], levels: Sequence[float] = LEVELS
) -> float:
    """Mean pinball loss of quantiles `q` ``(n, len(levels))`` for outcomes `y` ``(n,)``."""
    if q.shape != (len(y), len(levels)):
        raise ValueError(f"`q` must have shape ({len(y)}, {len(levels)}), got {q.shape}")
    diff = y[:, None] - q
    tau = np.asarray(levels, dtype=np.float64)[None, :]
    return float(np.maximum(tau * diff, (tau - 1.0) * diff).mean())


def coverage(y: NDArray[np.float64], lo: NDArray[np.float64], hi: NDArray[np.float64]) -> float:
    """Share of `y` inside ``[lo, hi]``."""
    return float(((y >= lo) & (y <= hi)).mean()) if len(y) else float("nan")


@dataclass(frozen=True, eq=False)
class GroupBaseline:
    """Per-(job type, class) statistics of training outcomes, with fallbacks."""

    by_group: dict[tuple[str, str], NDArray[np.float64]]
    by_type: dict[str, NDArray[np.float64]]
    overall: NDArray[np.float64]
    statistic: str

    @staticmethod
    def fit(
        job_type: NDArray[np.str_],
        hardware: NDArray[np.str_],
        y: NDArray[np.float64],
        statistic: str,
    ) -> GroupBaseline:
        """`statistic` is ``"mean"`` or ``"quantiles"`` (the `LEVELS`)."""
        if statistic not in ("mean", "quantiles"):
            raise ValueError(f"`statistic` must be 'mean' or 'quantiles', got {statistic!r}")

        def stat(values: NDArray[np.float64]) -> NDArray[np.float64]:
            if statistic == "mean":
                return np.full(len(LEVELS), float(values.mean()))
            return np.quantile(values, LEVELS)

        groups: dict[tuple[str, str], list[int]] = {}
        types: dict[str, list[int]] = {}
        for i, (t, h) in enumerate(zip(job_type.tolist(), hardware.tolist(), strict=True)):
            groups.setdefault((t, h), []).append(i)
            types.setdefault(t, []).append(i)
        return GroupBaseline(
            by_group={k: stat(y[v]) for k, v in groups.items()},
            by_type={k: stat(y[v]) for k, v in types.items()},
            overall=stat(y),
            statistic=statistic,
        )

    def predict(
        self, job_type: NDArray[np.str_], hardware: NDArray[np.str_]
    ) -> tuple[NDArray[np.float64], int]:
        """(quantile predictions ``(n, 3)``, rows that fell back from their group)."""
        out = np.empty((len(job_type), len(LEVELS)))
        fallbacks = 0
        for i, (t, h) in enumerate(zip(job_type.tolist(), hardware.tolist(), strict=True)):
            found = self.by_group.get((t, h))
            if found is None:
                fallbacks += 1
                found = self.by_type.get(t, self.overall)
            out[i] = found
        return out, fallbacks


def quality_figures(
    y: NDArray[np.float64],
    model_q: NDArray[np.float64],
    baselines: Sequence[GroupBaseline],
    job_type: NDArray[np.str_],
    hardware: NDArray[np.str_],
) -> dict[str, float | int]:
    """Pinball loss, coverage and loss ratios against each baseline, rounded for manifests.

    `y` and `model_q` are in the same space (log throughput or log run time).
    """
    loss = pinball(y, model_q)
    out: dict[str, float | int] = {
        "rows": len(y),
        "pinball_loss": round(loss, 5),
        "interval_coverage": round(coverage(y, model_q[:, 0], model_q[:, 2]), 4),
    }
    for b in baselines:
        pred, fell_back = b.predict(job_type, hardware)
        base = pinball(y, pred)
        out[f"baseline_group_{b.statistic}_pinball_loss"] = round(base, 5)
        out[f"pinball_ratio_vs_group_{b.statistic}"] = round(loss / base, 4)
        out["baseline_rows_without_their_group"] = fell_back
    return out
