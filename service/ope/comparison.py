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
  bounded *by the logged distributions*: the largest weight any action could
  get (``Diagnostics.max_possible_weight``, known only with the full logging
  distribution) <= `TAIL_THRESHOLD`, k-hat < 1/2 and ESS >= `MIN_ESS` — the
  temperature-1.0 regime, where it covered. The sample's own max weight is
  not enough: at temperature 0.3 and 500 rounds a few samples saw no weight
  above 10 and their normal intervals missed (unseen tail);
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
    max_possible_weight: NDArray[np.float64] | float,
) -> Any:
    """Where the normal paired interval may carry a verdict (module docstring); arrays
    broadcast; a NaN `max_possible_weight` (no logged distributions) never allows it."""
    light = ~(np.asarray(khat) >= KHAT_FINITE_VARIANCE)
    bounded = np.asarray(max_possible_weight) <= TAIL_THRESHOLD
    return light & bounded & (np.asarray(ess) >= MIN_ESS)


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
    if bool(normal_allowed(d.khat, d.ess, d.max_possible_weight)):
        return IntervalMethod.NORMAL
    return None


def no_verdict_reason(d: Diagnostics) -> str:
    """Why no verdict is given when `verdict_method` returns None."""
    return (
        f"no verdict: the reward has no known bounds for a betting interval, and the weights "
        f"are not shown light enough for the normal one (Pareto k-hat {d.khat:.2f}, largest "
        f"possible weight {d.max_possible_weight:.3g} — unknown without the full logging "
        f"distribution —, ESS {d.ess:.1f}); no interval here has shown its coverage"
    )
