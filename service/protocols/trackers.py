"""Running statistics behind each criterion: one anytime-valid sequence (or two) per criterion.

A tracker reads the named per-batch streams the monitor computes (e.g.
``"diff:reward"``, the per-round DR terms of the candidate minus the logged
rewards) and keeps the state of its confidence sequence from
`service.ope.sequences` — never the raw rounds. Kinds:

===================  ======================================================
`MeanTracker`        `AsymptoticCS` over one stream of per-round values
`BettingTracker`     `BettingCS` (bounded values) or `OffPolicyBettingCS`
                     (importance weights x bounded outcomes)
`PairedBettingTracker`  `PairedOffPolicyBettingCS`: the candidate's IPS value
                     minus production's logged value on the same rounds, one
                     sequence at the full alpha (no union bound)
`ProportionTracker`  `ProportionCS` over a stream of 0/1 outcomes
`DifferenceTracker`  two trackers at ``alpha / 2`` each; the difference's
                     interval is ``[lo_a - hi_b, hi_a - lo_b]`` (a union
                     bound, so it keeps ``1 - alpha`` coverage at every t)
===================  ======================================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from service.ope import (
    AsymptoticCS,
    BettingCS,
    Interval,
    IntervalMethod,
    OffPolicyBettingCS,
    PairedOffPolicyBettingCS,
    ProportionCS,
)

Streams = Mapping[str, NDArray[np.float64]]
"""One batch: stream name -> per-round values."""


class Tracker(Protocol):
    """A criterion's running statistic."""

    @property
    def n(self) -> int:
        """Samples so far."""
        ...

    @property
    def value(self) -> float:
        """The point estimate (NaN before any sample)."""
        ...

    def update(self, streams: Streams) -> None:
        """Fold in the batch's values of the streams it reads (absent: nothing new)."""
        ...

    def interval(self) -> Interval:
        """The sequence now."""
        ...


class MeanTracker:
    """`AsymptoticCS` over stream `stream`."""

    def __init__(self, stream: str, alpha: float, n_star: float) -> None:
        self.stream = stream
        self._cs = AsymptoticCS(alpha, n_star)

    @property
    def n(self) -> int:
        return self._cs.n

    @property
    def value(self) -> float:
        return self._cs.mean if self._cs.n else math.nan

    @property
    def std(self) -> float:
        """The values' sample standard deviation (what a sample-size plan needs)."""
        return self._cs.std

    def update(self, streams: Streams) -> None:
        values = streams.get(self.stream)
        if values is not None and len(values):
            self._cs.update(values)

    def interval(self) -> Interval:
        return self._cs.interval()


class BettingTracker:
    """A betting sequence on a mean in ``[lower, upper]``, or on an IPS value.

    With `weight` None the stream's values are averaged (`BettingCS`); with a
    weight stream, the stream holds outcomes and the target is the
    importance-weighted value (`OffPolicyBettingCS`).
    """

    def __init__(
        self, stream: str, alpha: float, lower: float, upper: float, weight: str | None = None
    ) -> None:
        self.stream, self.weight = stream, weight
        self._cs: BettingCS | OffPolicyBettingCS = (
            BettingCS(alpha, lower, upper)
            if weight is None
            else OffPolicyBettingCS(alpha, lower, upper)
        )
        self._sum = 0.0

    @property
    def n(self) -> int:
        return self._cs.n

    @property
    def value(self) -> float:
        return self._sum / self._cs.n if self._cs.n else math.nan

    def update(self, streams: Streams) -> None:
        values = streams.get(self.stream)
        if values is None or len(values) == 0:
            return
        if isinstance(self._cs, OffPolicyBettingCS):
            assert self.weight is not None
            w = streams[self.weight]
            self._cs.update(weight=w, reward=values)
            self._sum += float((w * values).sum())
        else:
            self._cs.update(values)
            self._sum += float(values.sum())

    def interval(self) -> Interval:
        return self._cs.interval()


class PairedBettingTracker:
    """Candidate minus production on the same logged rounds, by one paired betting sequence.

    Against production the two halves of `DifferenceTracker` (an off-policy
    betting sequence for the candidate, a plain one for the logged rewards, each
    at ``alpha / 2``) ignore that both are read off the same rounds; the paired
    sequence bets on ``D = E[w y] - E[y]`` directly (`PairedOffPolicyBettingCS`),
    so it keeps its coverage however heavy the weight tail — as the union bound
    does — and is far narrower (the OPE verdicts use the same sequence; coverage
    table in docs/ope.md).
    """

    def __init__(self, stream: str, weight: str, alpha: float, lower: float, upper: float) -> None:
        self.stream, self.weight = stream, weight
        self._cs = PairedOffPolicyBettingCS(alpha, lower, upper)
        self._sum = 0.0

    @property
    def n(self) -> int:
        return self._cs.n

    @property
    def value(self) -> float:
        """The IPS difference ``mean(w y - y)`` so far."""
        return self._sum / self._cs.n if self._cs.n else math.nan

    def update(self, streams: Streams) -> None:
        values = streams.get(self.stream)
        if values is None or len(values) == 0:
            return
        w = streams[self.weight]
        self._cs.update(weight=w, reward=values)
        self._sum += float((w * values - values).sum())

    def interval(self) -> Interval:
        return self._cs.interval()


class ProportionTracker:
    """`ProportionCS` over a stream of 0/1 values."""

    def __init__(self, stream: str, alpha: float) -> None:
        self.stream = stream
        self._cs = ProportionCS(alpha)

    @property
    def n(self) -> int:
        return self._cs.n

    @property
    def value(self) -> float:
        return self._cs.successes / self._cs.trials if self._cs.trials else math.nan

    def update(self, streams: Streams) -> None:
        values = streams.get(self.stream)
        if values is not None and len(values):
            self._cs.update_counts(int(np.count_nonzero(values)), len(values))

    def interval(self) -> Interval:
        return self._cs.interval()


class DifferenceTracker:
    """``a - b`` from two trackers built at half the criterion's alpha each."""

    def __init__(self, a: Tracker, b: Tracker) -> None:
        self.a, self.b = a, b

    @property
    def n(self) -> int:
        return min(self.a.n, self.b.n)

    @property
    def value(self) -> float:
        return self.a.value - self.b.value

    def update(self, streams: Streams) -> None:
        self.a.update(streams)
        self.b.update(streams)

    def interval(self) -> Interval:
        ia, ib = self.a.interval(), self.b.interval()
        return Interval(
            ia.lower - ib.upper,
            ia.upper - ib.lower,
            ia.level,
            ia.method,
            self.n,
        )


def snapshot_proportion(successes: int, trials: int, alpha: float) -> tuple[float, Interval]:
    """A proportion from counts as of now (data-quality metrics): estimate and sequence."""
    cs = ProportionCS(alpha)
    cs.update_counts(successes, trials)
    value = successes / trials if trials else math.nan
    return value, cs.interval()


def unbounded(alpha: float, n: int) -> Interval:
    """No bound yet."""
    return Interval.unbounded(1 - alpha, IntervalMethod.ASYMPTOTIC_CS, n)
