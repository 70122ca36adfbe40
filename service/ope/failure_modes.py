"""Failure modes of a candidate: where it disagrees, where it was unsure and wrong, where it loses.

An aggregate value can hide the cases a reviewer most needs to see. These
functions take per-round arrays (one entry per logged decision) and return
ranked tables; reading the log and decoding requests is the caller's job
(``service.reports.ope.failure_section``). Shapes: ``n`` rounds.

- `disagreements`: rounds where the candidate's choice differs from
  production's, ranked by the predicted impact of the difference,
  ``|f(candidate's option) - f(production's option)|`` for a predicted
  outcome ``f`` (e.g. log median throughput); the sign says which way.
- `uncertain_failures`: choices made under high uncertainty that went badly,
  ranked by ``width_t * badness_t`` — the predictor's interval width for the
  chosen option times how badly the realised outcome fell short (zero when it
  did not). A confidently wrong prediction and an unsure one that happened
  to be right both score low; what is left is where the model knew it did not
  know and the decision relied on it anyway.
- `label_rates`: how often each label (e.g. hardware class) appears among
  the top rows of a ranking against its base rate over all rows —
  over-representation points at a cause.
- `share_by_label`: a flag's rate per label, e.g. infeasible raw favourites
  per hardware class.
- `losing_slices`: the paired per-round difference (candidate − production,
  e.g. DR contributions minus observed reward, ``service.ope.kernels``)
  averaged per slice with a normal interval; a slice whose interval lies
  below zero is one where the candidate loses even if it wins overall.

Validation errors name the argument (`InvalidInput`), as the estimators do.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from service.contract import InvalidInput
from service.ope.intervals import check_level, normal_interval
from service.ope.results import Interval


@dataclass(frozen=True, eq=False)
class Ranked:
    """The top rows of a ranking, highest score first.

    Attributes:
        index: int64 ``(k,)`` row indices into the caller's arrays.
        score: float64 ``(k,)`` their scores (all > 0).
        eligible: rows with a positive, finite score (the ranking's population).
        n: rows given.
    """

    index: NDArray[np.int64]
    score: NDArray[np.float64]
    eligible: int
    n: int


@dataclass(frozen=True, slots=True)
class LabelRate:
    """One label's share among the top rows against its share among all rows.

    Attributes:
        label: e.g. a hardware class name.
        top_share: share of the top rows with this label.
        base_share: share of all rows with this label.
        top_count, base_count: the counts behind them.
    """

    label: Hashable
    top_share: float
    base_share: float
    top_count: int
    base_count: int

    @property
    def lift(self) -> float:
        """``top_share / base_share`` (inf when the label is absent from the base)."""
        return self.top_share / self.base_share if self.base_share > 0 else float("inf")


@dataclass(frozen=True, slots=True)
class LabelShare:
    """How often a flag was set within one label."""

    label: Hashable
    count: int
    n: int

    @property
    def share(self) -> float:
        """``count / n``."""
        return self.count / self.n if self.n else float("nan")


@dataclass(frozen=True, slots=True)
class SliceDifference:
    """The paired difference (candidate − production) in one slice.

    Attributes:
        label: the slice.
        mean: mean per-round difference.
        interval: normal interval of the mean (unbounded below two rounds).
        n: rounds in the slice.
    """

    label: Hashable
    mean: float
    interval: Interval
    n: int

    @property
    def loses(self) -> bool:
        """Whether the whole interval is below zero."""
        return self.interval.upper < 0

    @property
    def wins(self) -> bool:
        """Whether the whole interval is above zero."""
        return self.interval.lower > 0


def _floats(name: str, values: ArrayLike, n: int | None = None) -> NDArray[np.float64]:
    out = np.asarray(values, dtype=np.float64)
    if out.ndim != 1:
        raise InvalidInput(name, f"must be one-dimensional, got shape {out.shape}")
    if n is not None and len(out) != n:
        raise InvalidInput(name, f"must have shape ({n},), got {out.shape}")
    return out


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInput("k", f"must be a positive integer, got {k!r}")


def top_k(score: ArrayLike, k: int) -> Ranked:
    """The `k` rows with the largest positive finite `score` (ties keep row order)."""
    _check_k(k)
    s = _floats("score", score)
    ok = np.isfinite(s) & (s > 0)
    rows = np.flatnonzero(ok)
    order = rows[np.argsort(-s[rows], kind="stable")][:k].astype(np.int64)
    return Ranked(index=order, score=s[order], eligible=len(rows), n=len(s))


def disagreements(chosen: ArrayLike, production: ArrayLike, impact: ArrayLike, k: int) -> Ranked:
    """Rounds where `chosen` differs from `production`, ranked by ``|impact|``.

    Args:
        chosen: int ``(n,)``, the candidate's action per round.
        production: int ``(n,)``, production's action; a negative value means
            unknown and the round is skipped.
        impact: float ``(n,)``, predicted outcome of the candidate's action minus
            that of production's (NaN where it cannot be predicted: skipped).
        k: rows to return.
    """
    c = np.asarray(chosen)
    p = np.asarray(production)
    if c.ndim != 1:
        raise InvalidInput("chosen", f"must be one-dimensional, got shape {c.shape}")
    if p.shape != c.shape:
        raise InvalidInput("production", f"must have shape {c.shape}, got {p.shape}")
    d = _floats("impact", impact, len(c))
    differs = (c != p) & (p >= 0)
    return top_k(np.where(differs, np.abs(d), np.nan), k)


def uncertain_failures(width: ArrayLike, badness: ArrayLike, k: int) -> Ranked:
    """Choices ranked by ``width * badness`` (module docstring).

    Args:
        width: float ``(n,)``, the predictor's interval width for the chosen
            option (e.g. ``log q90 - log q10``); NaN where there is none.
        badness: float ``(n,)``, >= 0, how badly the realised outcome fell
            short, e.g. ``max(0, log predicted median - log realised)``; NaN
            where the outcome is not observed.
        k: rows to return.
    """
    w = _floats("width", width)
    b = _floats("badness", badness, len(w))
    if np.any(w[np.isfinite(w)] < 0):
        raise InvalidInput("width", "must be >= 0 where finite")
    if np.any(b[np.isfinite(b)] < 0):
        raise InvalidInput("badness", "must be >= 0 where finite")
    return top_k(w * b, k)


def shortfall(predicted: ArrayLike, realised: ArrayLike) -> NDArray[np.float64]:
    """``max(0, log predicted - log realised)``: how far a positive outcome fell below its
    prediction, in log units (``log 2`` = half of what was predicted); NaN where either is
    missing or not positive."""
    pred = _floats("predicted", predicted)
    real = _floats("realised", realised, len(pred))
    ok = np.isfinite(pred) & np.isfinite(real) & (pred > 0) & (real > 0)
    out = np.full(len(pred), np.nan)
    out[ok] = np.maximum(0.0, np.log(pred[ok]) - np.log(real[ok]))
    return out


def label_rates(labels: ArrayLike, ranked: Ranked) -> list[LabelRate]:
    """Each label's share among `ranked`'s rows against its share among all rows.

    Sorted by lift, then top share, descending; labels absent from the top are kept
    (a top share of 0 is information too).
    """
    lab = np.asarray(labels)
    if lab.shape != (ranked.n,):
        raise InvalidInput("labels", f"must have shape ({ranked.n},), got {lab.shape}")
    top = lab[ranked.index]
    out = []
    for value in np.unique(lab):
        base = int((lab == value).sum())
        hits = int((top == value).sum())
        out.append(
            LabelRate(
                label=value.item() if isinstance(value, np.generic) else value,
                top_share=hits / len(top) if len(top) else float("nan"),
                base_share=base / len(lab),
                top_count=hits,
                base_count=base,
            )
        )
    return sorted(out, key=lambda r: (-r.lift if r.top_count else 0.0, -r.top_count))


def share_by_label(flag: ArrayLike, labels: ArrayLike) -> list[LabelShare]:
    """Rate of `flag` (bool ``(n,)``) per label, highest share first."""
    f = np.asarray(flag, dtype=bool)
    lab = np.asarray(labels)
    if f.ndim != 1:
        raise InvalidInput("flag", f"must be one-dimensional, got shape {f.shape}")
    if lab.shape != f.shape:
        raise InvalidInput("labels", f"must have shape {f.shape}, got {lab.shape}")
    out = [
        LabelShare(
            label=value.item() if isinstance(value, np.generic) else value,
            count=int(f[lab == value].sum()),
            n=int((lab == value).sum()),
        )
        for value in np.unique(lab)
    ]
    return sorted(out, key=lambda s: (-s.share, -s.n))


def losing_slices(
    difference: ArrayLike, labels: ArrayLike, *, level: float = 0.95, min_n: int = 2
) -> list[SliceDifference]:
    """Mean paired difference per slice with a normal interval, worst upper bound first.

    Args:
        difference: float ``(n,)``, per-round candidate − production (finite).
        labels: ``(n,)``, each round's slice.
        level: nominal coverage of each slice's interval (not adjusted for the
            number of slices: read a single "loses" among many slices with care).
        min_n: slices with fewer rounds are left out.
    """
    check_level(level)
    d = _floats("difference", difference)
    if not np.isfinite(d).all():
        raise InvalidInput("difference", "must be finite")
    lab = np.asarray(labels)
    if lab.shape != d.shape:
        raise InvalidInput("labels", f"must have shape {d.shape}, got {lab.shape}")
    out = []
    for value in np.unique(lab):
        rows = d[lab == value]
        if len(rows) < min_n:
            continue
        label = value.item() if isinstance(value, np.generic) else value
        out.append(
            SliceDifference(label, float(rows.mean()), normal_interval(rows, level), len(rows))
        )
    return sorted(out, key=lambda s: (s.interval.upper, s.mean))
