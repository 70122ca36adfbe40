"""Which interval a verdict may rest on, given the log's weight diagnostics.

A verdict ("better than production") is read off an interval of the paired
difference target − production on the same rounds. The coverage table in
docs/ope.md (``python -m benchmarks.ope_coverage``) measured, per logging
temperature, sample size and reward shape, which intervals keep their 95%:

- the **normal** interval of the primary estimator's paired contributions
  keeps it when the weight tail is light (Pareto k-hat < 1/2: the weights'
  variance is finite, so the CLT the interval rests on holds) and the
  effective sample size is at least `MIN_ESS`;
- under a heavy tail it does not (IPS covered 33–55% on the demo's
  temperature-0.1 log), and the **paired off-policy betting** interval
  (`service.ope.sequences.PairedOffPolicyBettingCS`) does, for any tail,
  when the reward has known bounds;
- with a heavy tail and an unbounded reward no measured interval holds: no
  verdict.

`verdict_method` is the one rule; ``run_ope`` and the Parquet path both
call it and compute the interval it names.
"""

from __future__ import annotations

from service.ope.diagnostics import MIN_ESS
from service.ope.results import Diagnostics, IntervalMethod


def verdict_method(d: Diagnostics, bounded: bool) -> IntervalMethod | None:
    """The interval method a verdict may use on rounds with diagnostics `d`.

    Args:
        d: the primary estimate's diagnostics.
        bounded: whether the reward has known bounds (a betting interval needs them).

    Returns:
        `IntervalMethod.NORMAL`, `IntervalMethod.OFF_POLICY_BETTING_CS`, or
        None when no interval with measured coverage applies.
    """
    if not d.heavy_tail and d.ess >= MIN_ESS:
        return IntervalMethod.NORMAL
    return IntervalMethod.OFF_POLICY_BETTING_CS if bounded else None


def no_verdict_reason(d: Diagnostics) -> str:
    """Why no verdict is given when `verdict_method` returns None."""
    return (
        f"no verdict: the importance-weight tail is heavy (Pareto k-hat {d.khat:.2f}) or the "
        f"effective sample size small ({d.ess:.1f}), and the reward has no known bounds for "
        "a betting interval, so no interval here has shown its coverage"
    )
