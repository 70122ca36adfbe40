"""How many samples a protocol needs: the sample-size planner for its confidence sequences.

The evaluator checks each criterion after every batch with the asymptotic
confidence sequence of Waudby-Smith et al. (2021), tuned at ``n_star`` (the
protocol's `minimum_samples`, see `sequence_n_star`). Its half-width at ``n``
rounds with per-round standard deviation ``s`` is

    h(n) = s sqrt( 2 (n rho^2 + 1) / (n^2 rho^2) ln( sqrt(n rho^2 + 1) / alpha ) )

(`service.ope.sequences.AsymptoticCS`). If the true value of the judged
quantity lies ``effect`` beyond the criterion's threshold, its estimate at
``n`` is about ``N(threshold + effect, s^2 / n)``, and the bound crosses the
threshold at ``n`` with probability ``power`` when

    h(n) + z_power s / sqrt(n) <= effect.

`samples_to_detect` returns the smallest such ``n``. Because the sequence is
watched after every batch, the chance of having crossed *by* ``n`` is at
least that, so the plan is conservative. This is the sequential analogue of
the fixed-sample ``n = ((z_{1-alpha} + z_power) s / effect)^2`` and is
roughly 2-3x larger: the price of looking continuously.

What "effect" means per criterion (`plan_protocol`), with ``m`` the
*planning margin* of a metric — its guardrail's `margin` if it has one, else
the primary's MDE if it is the primary metric:

- stop / rollback: the candidate is worse than the threshold by ``m``
  (``worse_than_baseline_by: 0`` plus a reward guardrail of margin 0.05
  plans to catch a candidate 0.05 worse than production);
- primary: the true improvement is twice the MDE (success needs the bound
  beyond the MDE, so the truth must be);
- guardrail: candidate equal to the baseline (or reference), passing the
  non-inferiority margin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from scipy import stats

from service.contract import InvalidInput
from service.ope import asymptotic_rho
from service.protocols.criteria import Role, Spec, criteria_of
from service.protocols.schema import Direction, Protocol

MIN_N_STAR = 100
"""Lower bound on the sequence's tuning ``n_star`` (a tiny one makes it needlessly wide later)."""


def sequence_n_star(protocol: Protocol) -> float:
    """The ``n_star`` the evaluator tunes its asymptotic sequences at: fixed by the protocol."""
    return float(max(protocol.minimum_samples, MIN_N_STAR))


def half_width(n: int, sd: float, alpha: float, n_star: float) -> float:
    """``h(n)`` of the module docstring (the asymptotic sequence's half-width)."""
    r2 = asymptotic_rho(alpha, n_star) ** 2
    return sd * math.sqrt(2 * (n * r2 + 1) / (n * n * r2) * math.log(math.sqrt(n * r2 + 1) / alpha))


def samples_to_detect(
    effect: float,
    sd: float,
    alpha: float,
    n_star: float,
    power: float = 0.9,
    max_n: int = 10**9,
) -> int:
    """Smallest ``n`` with ``h(n) + z_power sd / sqrt(n) <= effect`` (module docstring).

    Raises:
        InvalidInput: a non-positive effect or sd, or no ``n <= max_n`` suffices.
    """
    if not (math.isfinite(effect) and effect > 0):
        raise InvalidInput("effect", f"must be > 0, got {effect}")
    if not (math.isfinite(sd) and sd > 0):
        raise InvalidInput("sd", f"must be > 0, got {sd}")
    if not 0 < power < 1:
        raise InvalidInput("power", f"must be in (0, 1), got {power}")
    z = float(stats.norm.ppf(power))

    def enough(n: int) -> bool:
        return half_width(n, sd, alpha, n_star) + z * sd / math.sqrt(n) <= effect

    hi = 2
    while not enough(hi):
        hi *= 2
        if hi > max_n:
            raise InvalidInput("effect", f"needs more than {max_n} samples at sd {sd}")
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


@dataclass(frozen=True, slots=True)
class CriterionPlan:
    """The samples one criterion needs to act with the planned power.

    Attributes:
        name: the criterion.
        effect: how far beyond its threshold the planned truth lies (metric units).
        planned_value: the truth planned for, ``threshold + effect`` in the worse
            (harm) or better (success) direction.
        sd: per-round standard deviation used.
        alpha: the criterion's share of the error budget.
        samples: rounds needed, at least the protocol's `minimum_samples` (None when
            the protocol declares no planning margin for the metric, or no sd was given).
        note: why there is no number.
    """

    name: str
    effect: float | None
    planned_value: float | None
    sd: float | None
    alpha: float
    samples: int | None
    note: str = ""


@dataclass(frozen=True, slots=True)
class ProtocolPlan:
    """Every criterion's plan; `samples` is what the protocol needs for all of them."""

    n_star: float
    power: float
    criteria: tuple[CriterionPlan, ...]

    def of(self, name: str) -> CriterionPlan:
        """The plan of criterion `name`."""
        for c in self.criteria:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def samples(self) -> int | None:
        """The largest planned sample size (None when nothing could be planned)."""
        known = [c.samples for c in self.criteria if c.samples is not None]
        return max(known) if known else None


def planning_margin(protocol: Protocol, metric: str) -> float | None:
    """The declared effect size to plan for on `metric` (module docstring)."""
    for g in protocol.guardrails:
        if g.metric == metric:
            return g.margin
    if protocol.primary.metric == metric:
        return protocol.primary.minimum_detectable_effect
    return None


def _plan_one(
    protocol: Protocol, spec: Spec, sd: float | None, n_star: float, power: float
) -> CriterionPlan:
    if spec.role is Role.DATA_QUALITY:
        return CriterionPlan(
            spec.name, None, None, sd, spec.alpha, None, "data quality: not planned"
        )
    if spec.role is Role.PRIMARY:
        effect: float | None = protocol.primary.minimum_detectable_effect
    else:
        effect = planning_margin(protocol, spec.metric)
    if effect is None:
        return CriterionPlan(
            spec.name, None, None, sd, spec.alpha, None, f"no margin declared for {spec.metric}"
        )
    worse = 1.0 if spec.direction is Direction.LOWER_IS_BETTER else -1.0
    toward = worse if spec.fires_on_harm else -worse
    planned = spec.threshold + toward * effect
    if sd is None:
        return CriterionPlan(spec.name, effect, planned, None, spec.alpha, None, "no sd given")
    n = max(samples_to_detect(effect, sd, spec.alpha, n_star, power), protocol.minimum_samples)
    return CriterionPlan(spec.name, effect, planned, sd, spec.alpha, n)


def plan_protocol(protocol: Protocol, sd: Mapping[str, float], power: float = 0.9) -> ProtocolPlan:
    """Plan every criterion of `protocol`.

    Args:
        protocol: the protocol.
        sd: per-round standard deviation of each metric's judged quantity (for
            baseline criteria, of the per-round difference candidate minus
            baseline), by metric name; e.g. from production's recent logs.
        power: the chance each criterion should act when the planned truth holds.
    """
    n_star = sequence_n_star(protocol)
    plans = tuple(
        _plan_one(protocol, spec, sd.get(spec.metric), n_star, power)
        for spec in criteria_of(protocol)
    )
    return ProtocolPlan(n_star, power, plans)
