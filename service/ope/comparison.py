"""Which interval a verdict may rest on, given the reward's bounds and the weight diagnostics.

A verdict ("better than production") is read off an interval of the paired
difference target − production on the same rounds. The coverage table in
docs/ope.md (``python -m benchmarks.ope_coverage``) measured, per logging
temperature (0.05–1.0), sample size (500–10,000) and reward shape, which
intervals keep their 95%:

- the **paired off-policy betting** interval
  (`service.ope.sequences.PairedOffPolicyBettingCS`) kept it in every cell:
  it needs known reward bounds and correct propensities, nothing about the
  weights' tail. It is the verdict's interval whenever the reward is bounded;
- the **normal** interval of DR's paired contributions did not: at
  temperature 0.1 it covered 0.73–0.89 even in the replications whose
  Pareto k-hat was below 1/2 (the pool's weights are a few large atoms the
  fit cannot see), so a light k-hat alone does not license it. It carries a
  verdict only for an unbounded reward and only where the weights are
  light and bounded: k-hat < 1/2 (NaN: nothing above the threshold), max
  weight <= `TAIL_THRESHOLD` and ESS >= `MIN_ESS` — the temperature-1.0
  regime, where it covered;
- otherwise no interval here has shown its coverage: no verdict.

`verdict_method` is the one rule; ``run_ope`` and the Parquet path both
call it and compute the interval it names.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.ope.diagnostics import MIN_ESS, TAIL_THRESHOLD
from service.ope.results import Diagnostics, IntervalMethod
from service.ope.tail import KHAT_FINITE_VARIANCE


def normal_allowed(
    khat: NDArray[np.float64] | float,
    ess: NDArray[np.float64] | float,
    max_weight: NDArray[np.float64] | float,
) -> Any:
    """Where the normal paired interval may carry a verdict (module docstring); arrays
    broadcast."""
    light = ~(np.asarray(khat) >= KHAT_FINITE_VARIANCE)
    return light & (np.asarray(max_weight) <= TAIL_THRESHOLD) & (np.asarray(ess) >= MIN_ESS)


def verdict_method(d: Diagnostics, bounded: bool) -> IntervalMethod | None:
    """The interval method a verdict may use on rounds with diagnostics `d`.

    Args:
        d: the primary estimate's diagnostics.
        bounded: whether the reward has known bounds (a betting interval needs them).

    Returns:
        `IntervalMethod.OFF_POLICY_BETTING_CS` for a bounded reward,
        `IntervalMethod.NORMAL` for an unbounded one with light weights, else
        None (no interval with measured coverage applies).
    """
    if bounded:
        return IntervalMethod.OFF_POLICY_BETTING_CS
    if bool(normal_allowed(d.khat, d.ess, d.max_weight)):
        return IntervalMethod.NORMAL
    return None


def no_verdict_reason(d: Diagnostics) -> str:
    """Why no verdict is given when `verdict_method` returns None."""
    return (
        f"no verdict: the reward has no known bounds for a betting interval, and the weights "
        f"are not light enough for the normal one (Pareto k-hat {d.khat:.2f}, max weight "
        f"{d.max_weight:.3g}, ESS {d.ess:.1f}); no interval here has shown its coverage"
    )
