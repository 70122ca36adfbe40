"""Marks on an estimate that must not be read as a plain number.

A reviewer reads a table of numbers as numbers. Two kinds are not:

- **outside the reward's range**: a value or an interval bound the reward
  cannot take (an unbiased estimator such as IPS or DR is not confined to the
  range: a DR value of -0.38 for a 0/1 reward is arithmetic, not a value the
  policy could have). The value is kept (hiding it would hide that the
  estimator misbehaves there) but marked; each bound beyond the range is
  clipped to it and marked "bound clipped". Clipping a confidence interval to
  the parameter space never lowers its coverage (the true value lies in the
  range), so the clipped interval is still a valid interval at its level.
- **too thin**: an effective sample size below `THIN_ESS`; the value and its
  interval are shown greyed with the ESS, not as a number like any other.

Where the range comes from: the reward declaration. A reward is a weighted sum
of outcome fields (``service.contract.reward.RewardSpec``); each field's
possible values are fixed by the contract (`FIELD_RANGES`), so the range is
interval arithmetic over the weights (`reward_range`). A declaration whose
range is unbounded on both sides ("range unknown") marks nothing for range;
half-bounded ranges (e.g. ``-completion hours`` <= 0) mark the bound they have.

API, for every place an estimate is shown (package tables, figures, the CLI)::

    m = mark_result(result, range_of(report.reward))   # None for a refusal
    m.value_text(), m.interval_text(), m.note          # what to print
    m.plain                                            # True: print as a number

Pure: no I/O, nothing from storage or transport.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from service.contract.reward import RewardSpec
from service.ope import Estimate, Interval, Result
from service.reports.ope.arrays import Reward

THIN_ESS = 30.0
"""Below this Kish effective sample size an estimate is marked "too thin".

The Kish ESS ``(sum w)^2 / sum w^2`` is the size of an unweighted sample
whose mean would have the same variance (Kish 1965, *Survey Sampling*;
Owen 2013, *Monte Carlo theory, methods and examples*, §9.3, eq. 9.13, who
notes that a small ESS signals trouble while a large one proves nothing).
30 is where the normal interval every estimate here uses stops being a fair
summary of so few effective observations: the Student-t quantile at ESS - 1
degrees of freedom exceeds the normal 1.96 by 4.3% at ESS 30, by 15% at 10
and by 62% at 4 (2.05, 2.26, 3.18), and for a 0/1 reward the Wald interval's
coverage is erratic and well below nominal at such sizes (Brown, Cai &
DasGupta 2001, "Interval estimation for a binomial proportion", Statistical
Science 16(2), who advise against it below n = 40). It equals the core's
``service.ope.MIN_ESS`` (where the estimator adds its "may under-cover"
caveat) on purpose: one threshold, so a caveat in the limitations and a grey
cell in a table never disagree.
"""

FIELD_RANGES: Mapping[str, tuple[float, float]] = MappingProxyType(
    {
        "slo_met": (0.0, 1.0),
        "queue_delay_s": (0.0, math.inf),
        "throughput": (0.0, math.inf),
        "completion_time_s": (0.0, math.inf),
    }
)
"""The values each outcome field (`REWARD_FIELDS`) can take, from the contract:
``slo_met`` is a bool, the others are validated finite and >= 0
(``service.contract.validation.validate_outcome``)."""

REWARD_SPECS: Mapping[Reward, RewardSpec] = MappingProxyType(
    {
        Reward.SLO_MET: RewardSpec({"slo_met": 1.0}),
        Reward.NEG_COMPLETION_HOURS: RewardSpec({"completion_time_s": -1.0 / 3600.0}),
        Reward.NEG_QUEUE_HOURS: RewardSpec({"queue_delay_s": -1.0 / 3600.0}),
    }
)
"""The rewards `understudy ope` offers, as the declarations they are (``Reward.of``)."""


@dataclass(frozen=True, slots=True)
class RewardRange:
    """The values a reward can take, ``[lower, upper]``; either side may be infinite."""

    lower: float
    upper: float

    @property
    def known(self) -> bool:
        """False when unbounded on both sides: nothing can be marked for range."""
        return math.isfinite(self.lower) or math.isfinite(self.upper)

    @property
    def bounds(self) -> tuple[float, float] | None:
        """``(lower, upper)`` when both are finite (what a betting interval needs), else None."""
        if math.isfinite(self.lower) and math.isfinite(self.upper):
            return self.lower, self.upper
        return None

    def contains(self, x: float) -> bool:
        """Whether ``lower <= x <= upper``."""
        return self.lower <= x <= self.upper

    def difference(self) -> RewardRange:
        """The range of a difference of two such rewards (policy - production)."""
        return RewardRange(self.lower - self.upper, self.upper - self.lower)

    def text(self) -> str:
        """``[0, 1]``, ``(-inf, 0]``, or ``unknown``."""
        if not self.known:
            return "unknown"
        left = f"[{_num(self.lower)}" if math.isfinite(self.lower) else "(-inf"
        right = f"{_num(self.upper)}]" if math.isfinite(self.upper) else "inf)"
        return f"{left}, {right}"


UNKNOWN_RANGE = RewardRange(-math.inf, math.inf)


def reward_range(spec: RewardSpec) -> RewardRange:
    """``sum_f w_f * FIELD_RANGES[f]`` by interval arithmetic (a weight of 0 adds nothing).

    >>> reward_range(RewardSpec({"slo_met": 1.0, "queue_delay_s": -0.001})).text()
    '(-inf, 1]'
    """
    lower = upper = 0.0
    for name, weight in spec.weights.items():
        if weight == 0:
            continue
        a, b = FIELD_RANGES[name]
        ends = (weight * a, weight * b)
        lower += min(ends)
        upper += max(ends)
    return RewardRange(lower, upper)


def range_of(reward: Reward) -> RewardRange:
    """The range of one of the CLI's rewards, from its declaration (`REWARD_SPECS`)."""
    return reward_range(REWARD_SPECS[reward])


class MarkKind(StrEnum):
    """Why a number is not shown as a plain number."""

    OUTSIDE_RANGE = "outside reward range"
    """The value is one the reward cannot take."""
    BOUND_CLIPPED = "bound clipped"
    """An interval bound lay beyond the range and is shown clipped to it."""
    TOO_THIN = "too thin"
    """The effective sample size is below `THIN_ESS`."""


@dataclass(frozen=True, slots=True)
class Mark:
    """One mark and its one-line explanation, e.g. ``too thin: ESS 2.7 < 30``."""

    kind: MarkKind
    text: str


@dataclass(frozen=True, slots=True)
class Marked:
    """An estimate as it should be shown.

    Attributes:
        value: the estimate, unchanged (never clipped).
        lower, upper: the interval as shown: clipped to the range; NaN when the
            whole interval lies outside it (nothing of it is possible).
        raw_lower, raw_upper: the interval as estimated.
        marks: why it is not a plain number; empty when it is one.
    """

    value: float
    lower: float
    upper: float
    raw_lower: float
    raw_upper: float
    marks: tuple[Mark, ...] = ()

    @property
    def plain(self) -> bool:
        """True when no mark applies: show it as a number."""
        return not self.marks

    @property
    def kinds(self) -> frozenset[MarkKind]:
        """The kinds of mark that apply."""
        return frozenset(m.kind for m in self.marks)

    @property
    def note(self) -> str:
        """Every mark's text, ``; ``-joined (empty when plain)."""
        return "; ".join(m.text for m in self.marks)

    def value_text(self, digits: int = 4) -> str:
        """The value; in parentheses when marked, so even plain text is not read as plain."""
        text = _num(self.value, digits)
        return text if self.plain else f"({text})"

    def interval_text(self, digits: int = 4) -> str:
        """``[lower, upper]`` as shown (clipped), or a note when nothing of it is possible."""
        if math.isnan(self.lower):
            return "outside the range"
        return f"[{_num(self.lower, digits)}, {_num(self.upper, digits)}]"


def mark(
    value: float,
    lower: float,
    upper: float,
    *,
    ess: float,
    reward: RewardRange,
    min_ess: float = THIN_ESS,
) -> Marked:
    """The marks that apply to an estimate `value` with interval ``[lower, upper]``.

    Args:
        value, lower, upper: the estimate and its interval (bounds may be infinite).
        ess: its effective sample size (Kish, of the importance weights; NaN = not
            known, then no thinness mark).
        reward: the range of the quantity estimated (`range_of`, or
            ``RewardRange.difference()`` for a difference to production);
            `UNKNOWN_RANGE` marks nothing for range.
        min_ess: the thinness threshold (`THIN_ESS`).
    """
    marks: list[Mark] = []
    if ess < min_ess:
        marks.append(Mark(MarkKind.TOO_THIN, f"too thin: ESS {ess:.2g} < {min_ess:g}"))
    if not reward.contains(value) and math.isfinite(value):
        marks.append(Mark(MarkKind.OUTSIDE_RANGE, f"outside reward range {reward.text()}"))
    shown_lower, shown_upper = max(lower, reward.lower), min(upper, reward.upper)
    if shown_lower > shown_upper:
        shown_lower = shown_upper = math.nan
    clipped = [
        f"{side} {_num(raw, 3)} → {_num(shown, 3)}"
        for side, raw, shown in (("lower", lower, shown_lower), ("upper", upper, shown_upper))
        if raw != shown and math.isfinite(raw) and not math.isnan(shown)
    ]
    if math.isnan(shown_lower):
        clipped = [f"[{_num(lower, 3)}, {_num(upper, 3)}] lies outside {reward.text()}"]
    if clipped:
        marks.append(Mark(MarkKind.BOUND_CLIPPED, "bound clipped: " + ", ".join(clipped)))
    return Marked(value, shown_lower, shown_upper, lower, upper, tuple(marks))


def mark_result(result: Result | None, reward: RewardRange) -> Marked | None:
    """`mark` applied to an `Estimate` (its value, interval and diagnostics' ESS);
    None for a refusal or nothing (show its reason, never a number)."""
    if not isinstance(result, Estimate):
        return None
    return mark_interval(result.value, result.interval, ess=result.diagnostics.ess, reward=reward)


def mark_interval(value: float, interval: Interval, *, ess: float, reward: RewardRange) -> Marked:
    """`mark` for a value and its `Interval`."""
    return mark(value, interval.lower, interval.upper, ess=ess, reward=reward)


def _num(x: float, digits: int = 4) -> str:
    return f"{x:.{digits}g}"


__all__ = [
    "FIELD_RANGES",
    "REWARD_SPECS",
    "THIN_ESS",
    "UNKNOWN_RANGE",
    "Mark",
    "MarkKind",
    "Marked",
    "RewardRange",
    "mark",
    "mark_interval",
    "mark_result",
    "range_of",
    "reward_range",
]
