"""Criteria as pure functions: an anytime-valid interval in, value/bound/threshold/status out.

Every criterion of a protocol compares one quantity ``Q`` with a threshold
``T`` in the metric's own units. ``Q`` is the candidate's value (against a
fixed limit or a guardrail's `reference`) or the difference candidate minus
baseline. The interval around ``Q`` comes from an anytime-valid confidence
sequence (`service.ope.sequences`), so a criterion may be judged after every
batch without inflating its error (Howard, Ramdas, McAuliffe & Sekhon 2021).

=============  ==========================================  =====================
role           status FIRED / PASSED when                  T
=============  ==========================================  =====================
stop,          ``Q`` confidently *worse* than ``T``          limit, or -d / +d
rollback,                                                  (``worse_than_
data_quality                                               baseline_by: d``)
primary        difference confidently *better* than ``T``  +MDE / -MDE
guardrail      ``Q`` confidently better than ``T``         -margin / +margin,
               (one-sided non-inferiority, Spotify         or reference -+ margin
               Confidence's guardrails)                    for a fixed `reference`
=============  ==========================================  =====================

"Confidently worse than T" for a higher-is-better metric is ``upper < T``
(the `bound` reported is ``upper``); for a lower-is-better one ``lower > T``
(``bound = lower``); "better" mirrors it. The signs of T follow the
direction: a tolerated deterioration ``d`` of a higher-is-better metric is
``T = -d``.

Error budget (`alpha_allocation`): the protocol's ``alpha`` bounds the chance
of a false alarm. Stop and rollback criteria share it (Bonferroni), and so do
the data-quality criteria. Success needs the primary *and* every guardrail
(an intersection-union test, Berger 1982), so each of those is tested at the
full ``alpha`` and a false success still has probability <= alpha. Each
criterion uses the two-sided sequence at its ``alpha`` one-sidedly, which
is conservative (docs/ope.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from service.ope import Interval
from service.protocols.schema import METRICS, Against, Direction, Protocol


class Role(StrEnum):
    """Which section of the protocol a criterion comes from."""

    PRIMARY = "primary"
    GUARDRAIL = "guardrail"
    STOP = "stop"
    ROLLBACK = "rollback"
    DATA_QUALITY = "data_quality"
    LIMIT = "limit"
    """Built-in limits of every experiment: maximum duration, identifiability, authority."""


class Status(StrEnum):
    """A criterion's verdict now."""

    INSUFFICIENT = "insufficient"
    """Fewer samples than the protocol's `minimum_samples`: no verdict yet."""
    PENDING = "pending"
    """Enough samples, not decided yet."""
    FIRED = "fired"
    """A stop, rollback or data-quality condition holds (confidently worse than T)."""
    PASSED = "passed"
    """Primary: the improvement is confidently at least the MDE; guardrail: non-inferior."""
    FAILED = "failed"
    """Primary or guardrail confidently on the wrong side (reported; not itself a transition)."""
    NOT_IDENTIFIABLE = "not_identifiable"
    """The logs cannot speak for the candidate here (no overlap): no number is given."""
    UNAVAILABLE = "unavailable"
    """The input the metric needs is not reported (e.g. Runtime's request counts)."""


FIRES = frozenset({Role.STOP, Role.ROLLBACK, Role.DATA_QUALITY, Role.LIMIT})
"""Roles whose criteria fire on harm; the others pass on success."""


@dataclass(frozen=True, slots=True)
class Spec:
    """One criterion as the evaluator judges it (built from the protocol by `criteria_of`).

    Attributes:
        name: unique in the protocol (``primary:reward``, ``guardrail:cost``, a stop's name).
        role: the section it came from.
        metric: a `METRICS` name.
        against: the candidate's own value (`LIMIT`) or candidate minus baseline (`BASELINE`).
        threshold: ``T`` in metric units, signed as in the module table.
        alpha: this criterion's share of the error budget.
        reference: a guardrail's fixed comparison value; then ``Q`` is the candidate's
            value and ``T = reference -+ margin``.
    """

    name: str
    role: Role
    metric: str
    against: Against
    threshold: float
    alpha: float
    reference: float | None = None

    @property
    def direction(self) -> Direction:
        """Which way the metric improves (from the catalogue, never from the protocol)."""
        return METRICS[self.metric].direction

    @property
    def fires_on_harm(self) -> bool:
        """True for stop, rollback and data-quality criteria."""
        return self.role in FIRES


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One criterion judged at one moment: what on-call, the API and evidence show.

    Attributes:
        name, role, metric: which criterion.
        status: the verdict now.
        value: the point estimate of ``Q`` (None when there is no number to give).
        bound: the confidence-sequence bound compared with `threshold` (None: none yet).
        threshold: ``T`` in metric units.
        lower, upper: the whole interval around ``Q`` (infinite before data bounds it).
        n: samples behind it.
        alpha: the criterion's share of the error budget.
        method: how the interval was computed (an `IntervalMethod` value, or a note).
        note: why there is no number, or a caveat, in words.
    """

    name: str
    role: Role
    metric: str
    status: Status
    value: float | None
    bound: float | None
    threshold: float
    lower: float | None
    upper: float | None
    n: int
    alpha: float
    method: str
    note: str = ""

    def summary(self) -> dict[str, object]:
        """A JSON-ready snapshot (stored as an event's evidence)."""
        return {
            "criterion": self.name,
            "role": self.role.value,
            "metric": self.metric,
            "status": self.status.value,
            "value": _finite(self.value),
            "bound": _finite(self.bound),
            "threshold": self.threshold,
            "lower": _finite(self.lower),
            "upper": _finite(self.upper),
            "n": self.n,
            "alpha": self.alpha,
            "method": self.method,
            "note": self.note,
        }


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def confidently_worse(interval: Interval, direction: Direction, threshold: float) -> bool:
    """Whether the whole interval lies on the worse side of `threshold`."""
    if direction is Direction.HIGHER_IS_BETTER:
        return interval.upper < threshold
    return interval.lower > threshold


def confidently_better(interval: Interval, direction: Direction, threshold: float) -> bool:
    """Whether the whole interval lies on the better side of `threshold`."""
    if direction is Direction.HIGHER_IS_BETTER:
        return interval.lower > threshold
    return interval.upper < threshold


def judged_bound(interval: Interval, direction: Direction, role: Role) -> float:
    """The bound a criterion watches: the one that must cross the threshold for it to act."""
    harm = role in FIRES
    higher = direction is Direction.HIGHER_IS_BETTER
    return interval.upper if harm == higher else interval.lower


def judge(spec: Spec, value: float, interval: Interval, *, note: str = "") -> Evaluation:
    """Judge `spec` on the interval around its quantity (enough samples assumed).

    Args:
        spec: the criterion.
        value: the point estimate of ``Q``.
        interval: an anytime-valid interval for ``Q`` at the criterion's alpha.
        note: a caveat to carry along.
    """
    d, t = spec.direction, spec.threshold
    if spec.fires_on_harm:
        status = Status.FIRED if confidently_worse(interval, d, t) else Status.PENDING
    elif confidently_better(interval, d, t):
        status = Status.PASSED
    elif confidently_worse(interval, d, t):
        status = Status.FAILED
    else:
        status = Status.PENDING
    return Evaluation(
        name=spec.name,
        role=spec.role,
        metric=spec.metric,
        status=status,
        value=value,
        bound=judged_bound(interval, d, spec.role),
        threshold=t,
        lower=interval.lower,
        upper=interval.upper,
        n=interval.n,
        alpha=spec.alpha,
        method=interval.method.value,
        note=note,
    )


def without_number(spec: Spec, status: Status, n: int, note: str, method: str = "") -> Evaluation:
    """An evaluation that gives no number: too few samples, not identifiable, unavailable."""
    return Evaluation(
        name=spec.name,
        role=spec.role,
        metric=spec.metric,
        status=status,
        value=None,
        bound=None,
        threshold=spec.threshold,
        lower=None,
        upper=None,
        n=n,
        alpha=spec.alpha,
        method=method,
        note=note,
    )


def _signed(direction: Direction, amount: float, *, worse: bool) -> float:
    """``amount`` in the worse (or better) direction of the metric, as a threshold."""
    up = (direction is Direction.LOWER_IS_BETTER) == worse
    return amount if up or amount == 0 else -amount


def alpha_allocation(protocol: Protocol) -> Mapping[str, float]:
    """Each criterion's share of ``protocol.alpha`` (module docstring: Bonferroni + IUT)."""
    a = protocol.alpha
    harms = [c.name for c in (*protocol.stop, *protocol.rollback)]
    quality = [c.name for c in protocol.data_quality]
    out: dict[str, float] = {f"primary:{protocol.primary.metric}": a}
    out |= {g.name: a for g in protocol.guardrails}
    out |= {name: a / len(harms) for name in harms}
    out |= {name: a / len(quality) for name in quality}
    return out


def criteria_of(protocol: Protocol) -> tuple[Spec, ...]:
    """Every criterion the protocol declares, in file order, with thresholds signed."""
    alpha = alpha_allocation(protocol)
    p = protocol.primary
    primary_name = f"primary:{p.metric}"
    direction = METRICS[p.metric].direction
    out = [
        Spec(
            primary_name,
            Role.PRIMARY,
            p.metric,
            Against.BASELINE,
            _signed(direction, p.minimum_detectable_effect, worse=False),
            alpha[primary_name],
        )
    ]
    for g in protocol.guardrails:
        d = METRICS[g.metric].direction
        margin = _signed(d, g.margin, worse=True)
        against = Against.BASELINE if g.reference is None else Against.LIMIT
        threshold = margin if g.reference is None else g.reference + margin
        out.append(
            Spec(g.name, Role.GUARDRAIL, g.metric, against, threshold, alpha[g.name], g.reference)
        )
    sections = (
        (Role.STOP, protocol.stop),
        (Role.ROLLBACK, protocol.rollback),
        (Role.DATA_QUALITY, protocol.data_quality),
    )
    for role, criteria in sections:
        for c in criteria:
            d = METRICS[c.metric].direction
            threshold = (
                c.threshold if c.against is Against.LIMIT else _signed(d, c.threshold, worse=True)
            )
            out.append(Spec(c.name, role, c.metric, c.against, threshold, alpha[c.name]))
    return tuple(out)
