"""Off-policy estimators of a target policy's value from logged bandit data.

The estimand is ``V(pi) = E_x[ sum_a pi(a|x) E[r | x, a] ]`` under the logged
context distribution. Every estimator takes a validated `BanditData` and
returns `Estimate` (value, normal interval, n, diagnostics, basis, caveats,
per-round contributions) or `NotIdentifiable` (no number, the reason) when
the logging policy never takes actions the target would. Formulas are in
`service.ope.kernels`; with ``w_t = pi(a_t|x_t) / pscore_t``:

- `dm`: ``1/n sum_t sum_a pi(a|x_t) q_hat(x_t, a)``. Model-based: no support
  needed, biased when the model is. Beygelzimer & Langford (2009).
- `ips`: ``1/n sum_t w_t r_t``. Unbiased under support. Horvitz & Thompson
  (1952); Precup, Sutton & Singh (2000).
- `snips`: ``sum_t w_t r_t / sum_t w_t``. Consistent, lower variance, O(1/n)
  bias. Swaminathan & Joachims (2015).
- `dr`: ``1/n sum_t [q_pi(x_t) + w_t (r_t - q_hat(x_t, a_t))]``. Unbiased under
  support whatever the model; lower variance when the model is good. Dudik,
  Langford & Li (2011).
- `sndr`: DR with the correction normalised by ``sum w``. Kallus & Uehara (2019).
- `switch_dr`: DR where ``w_t <= tau``, DM where above. Wang, Agarwal & Dudik
  (2017), "Optimal and adaptive off-policy evaluation in contextual bandits";
  the logged-action form of zr-obp. Biased by the switched-off residuals.

A cost is another outcome: ``estimate(data.with_outcome(cost, cost_model), ...)``
gives the cost guardrail's own estimate with the same call.
"""

from __future__ import annotations

import math

from service.contract import InvalidInput
from service.ope.data import BanditData
from service.ope.diagnostics import (
    TAIL_THRESHOLD,
    caveats,
    diagnostics,
    identification_failure,
)
from service.ope.intervals import (
    Bootstrap,
    bootstrap_interval,
    check_level,
    normal_interval,
)
from service.ope.kernels import contributions, parts, value
from service.ope.results import Basis, Estimate, Estimator, NotIdentifiable, Result

SWITCH_TAU = 10.0
"""Default switch-DR threshold: rounds weighted above it use the model only."""

BASIS: dict[Estimator, Basis] = {
    Estimator.DM: Basis.MODEL_BASED,
    Estimator.IPS: Basis.IMPORTANCE_WEIGHTED,
    Estimator.SNIPS: Basis.IMPORTANCE_WEIGHTED,
    Estimator.DR: Basis.DOUBLY_ROBUST,
    Estimator.SNDR: Basis.DOUBLY_ROBUST,
    Estimator.SWITCH_DR: Basis.DOUBLY_ROBUST,
}


def check_estimator(data: BanditData, estimator: Estimator | str, tau: float) -> Estimator:
    """The `Estimator`, after checking that `data` has what it needs."""
    try:
        est = Estimator(estimator)
    except ValueError:
        names = ", ".join(e.value for e in Estimator)
        raise InvalidInput("estimator", f"must be one of {names}, got {estimator!r}") from None
    if est.needs_model and data.estimated_rewards is None:
        raise InvalidInput("estimated_rewards", f"is required by {est.value}, got None")
    if not (isinstance(tau, float | int) and tau > 0 and not math.isnan(tau)):
        raise InvalidInput("tau", f"must be > 0, got {tau}")
    return est


def estimate(
    data: BanditData,
    estimator: Estimator | str,
    *,
    level: float = 0.95,
    tau: float = SWITCH_TAU,
    bootstrap: Bootstrap | None = None,
    support_tolerance: float = 0.0,
    tail_threshold: float = TAIL_THRESHOLD,
) -> Result:
    """Estimate the target's value in `data` with `estimator`.

    Args:
        data: logged rounds and the target's action distribution.
        estimator: one of `Estimator`.
        level: nominal coverage of the interval.
        tau: switch-DR's weight threshold (ignored by the others).
        bootstrap: percentile bootstrap settings; None = normal interval.
        support_tolerance: unsupported target mass accepted as negligible
            (`service.ope.diagnostics.identification_failure`).
        tail_threshold: weight above which a round counts as tail.

    Returns:
        `Estimate`, or `NotIdentifiable` for a weighted estimator when the
        logging policy never takes actions the target would (DM still answers,
        labelled model-based).
    """
    est = check_estimator(data, estimator, tau)
    check_level(level)
    diag = diagnostics(data, tail_threshold)
    basis = BASIS[est]
    if basis is not Basis.MODEL_BASED:
        failure = identification_failure(diag, support_tolerance)
        if failure is not None:
            return NotIdentifiable(est, failure, diag)
    p = parts(data, est, tau)
    psi = contributions(p)
    interval = (
        normal_interval(psi, level)
        if bootstrap is None
        else bootstrap_interval(p, level, bootstrap)
    )
    v = value(p)
    half = (interval.upper - interval.lower) / 2
    if bootstrap is not None:  # the caveat speaks of the normal interval
        normal = normal_interval(psi, level)
        half = (normal.upper - normal.lower) / 2
    return Estimate(
        estimator=est,
        basis=basis,
        value=v,
        interval=interval,
        n=data.n,
        diagnostics=diag,
        caveats=caveats(diag, basis, v, half),
        contributions=psi,
    )


def dm(data: BanditData, *, level: float = 0.95, bootstrap: Bootstrap | None = None) -> Result:
    """Direct method (model-based); see the module docstring."""
    return estimate(data, Estimator.DM, level=level, bootstrap=bootstrap)


def ips(
    data: BanditData,
    *,
    level: float = 0.95,
    bootstrap: Bootstrap | None = None,
    support_tolerance: float = 0.0,
) -> Result:
    """Inverse propensity scoring; see the module docstring."""
    return estimate(
        data, Estimator.IPS, level=level, bootstrap=bootstrap, support_tolerance=support_tolerance
    )


def snips(
    data: BanditData,
    *,
    level: float = 0.95,
    bootstrap: Bootstrap | None = None,
    support_tolerance: float = 0.0,
) -> Result:
    """Self-normalised IPS; see the module docstring."""
    return estimate(
        data, Estimator.SNIPS, level=level, bootstrap=bootstrap, support_tolerance=support_tolerance
    )


def dr(
    data: BanditData,
    *,
    level: float = 0.95,
    bootstrap: Bootstrap | None = None,
    support_tolerance: float = 0.0,
) -> Result:
    """Doubly robust; see the module docstring."""
    return estimate(
        data, Estimator.DR, level=level, bootstrap=bootstrap, support_tolerance=support_tolerance
    )


def sndr(
    data: BanditData,
    *,
    level: float = 0.95,
    bootstrap: Bootstrap | None = None,
    support_tolerance: float = 0.0,
) -> Result:
    """Self-normalised doubly robust; see the module docstring."""
    return estimate(
        data, Estimator.SNDR, level=level, bootstrap=bootstrap, support_tolerance=support_tolerance
    )


def switch_dr(
    data: BanditData,
    *,
    tau: float = SWITCH_TAU,
    level: float = 0.95,
    bootstrap: Bootstrap | None = None,
    support_tolerance: float = 0.0,
) -> Result:
    """Switch doubly robust with weight threshold `tau`; see the module docstring."""
    return estimate(
        data,
        Estimator.SWITCH_DR,
        level=level,
        tau=tau,
        bootstrap=bootstrap,
        support_tolerance=support_tolerance,
    )
