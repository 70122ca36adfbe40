"""Drift references: what a policy's training inputs looked like, and the calibrated flag rule.

`FeatureReference` (PSI bins, KS grid, ranges, categories seen), the window
statistics (PSI, KS, the arrival statistic) and `FlagRule`; the design is in
`service.checks.drift`'s docstring and docs/drift.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from service.contract import MirrorRequest

PSI_FLOOR = 1e-4
"""Proportions are floored here before the log, so empty bins give finite PSI."""

N_BINS = 10
"""Interior PSI bins: reference deciles (fewer when a feature has few distinct values)."""

GRID_SIZE = 201
"""Reference quantile levels kept for KS (0, 0.005, ..., 1)."""

SCALE_FLOOR = 0.005
"""Smallest per-feature PSI scale: a feature constant in training still needs a
real shift (PSI 0.005 x threshold) to flag, not floating-point noise."""

CALIBRATION_FOLDS = 5
"""Cross-fitting folds of `calibrate`."""

CALIBRATION_REPEATS = 20
"""Random deals of groups into folds `calibrate` averages over."""

DEFER_OPTION = -1
"""A chosen option of -1 is a defer (`service.contract.DEFER`)."""

NO_DECISION = -2
"""A chosen option of -2: the policy has no decision on the request."""

DEFAULT_ALPHA = 0.01
"""Calibrated false-flag rate per window (the acceptance bound is 5%)."""

ARRIVAL_QUANTILE = 0.75
"""Quantile of the positive inter-request gaps the arrival statistic takes (module docstring)."""


@dataclass(frozen=True, eq=False)
class FeatureReference:
    """The training distribution of every feature, as drift needs it.

    Attributes:
        names: feature names, length ``F``.
        n_rows: training rows summarised.
        edges: per feature, sorted PSI bin edges; bin of ``x`` is
            ``searchsorted(edges, x, side="right")`` (0 = below the training min,
            ``len(edges)`` = above the training max).
        proportions: per feature, reference proportion of each bin, ``len(edges) + 1``.
        grid: per feature, sorted distinct reference quantiles (KS evaluation points).
        grid_cdf: per feature, reference ``P(X <= grid[j])``.
        low, high: float64 ``(F,)``, training min and max.
        hardware_classes, workload_kinds: categories seen in training.
        qos_classes: QoS classes seen in training (``""`` = unset); None = not
            recorded (a summary written before contract v2): QoS is then not checked.
        model_families: model families seen in training (`model_family_of`: the
            family without its batch size), from the manifest's
            ``training_data.model_families`` (`with_model_families`); None = not
            known (no manifest list): families are then not checked.
    """

    names: tuple[str, ...]
    n_rows: int
    edges: tuple[NDArray[np.float64], ...]
    proportions: tuple[NDArray[np.float64], ...]
    grid: tuple[NDArray[np.float64], ...]
    grid_cdf: tuple[NDArray[np.float64], ...]
    low: NDArray[np.float64]
    high: NDArray[np.float64]
    hardware_classes: frozenset[str]
    workload_kinds: frozenset[str]
    qos_classes: frozenset[str] | None = None
    model_families: frozenset[str] | None = None
    _psi_offsets: NDArray[np.int64] = field(init=False, repr=False)
    _grid_offsets: NDArray[np.int64] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        f = len(self.names)
        for label, seq in (("edges", self.edges), ("grid", self.grid)):
            if len(seq) != f:
                raise ValueError(f"`{label}` must have one array per feature ({f}), got {len(seq)}")
        sizes = np.array([len(e) + 1 for e in self.edges], dtype=np.int64)
        grid_sizes = np.array([len(g) + 1 for g in self.grid], dtype=np.int64)
        object.__setattr__(self, "_psi_offsets", np.concatenate([[0], np.cumsum(sizes)]))
        object.__setattr__(self, "_grid_offsets", np.concatenate([[0], np.cumsum(grid_sizes)]))

    @property
    def n_features(self) -> int:
        """``F``."""
        return len(self.names)

    def psi_codes(self, x: NDArray[np.floating]) -> NDArray[np.int64]:
        """Flat PSI bin code of every cell, ``(n, F)``; feature ``f``'s bins follow ``f-1``'s."""
        out = np.empty(x.shape, dtype=np.int64)
        for f, e in enumerate(self.edges):
            out[:, f] = np.searchsorted(e, x[:, f], side="right") + self._psi_offsets[f]
        return out

    def grid_codes(self, x: NDArray[np.floating]) -> NDArray[np.int64]:
        """Flat KS grid cell of every cell: cell ``j`` holds ``grid[j-1] < x <= grid[j]``."""
        out = np.empty(x.shape, dtype=np.int64)
        for f, g in enumerate(self.grid):
            out[:, f] = np.searchsorted(g, x[:, f], side="left") + self._grid_offsets[f]
        return out

    def psi_counts(self, x: NDArray[np.floating]) -> NDArray[np.int64]:
        """Counts of `x` (``(n, F)``) in every PSI bin, flat."""
        return np.bincount(self.psi_codes(x).ravel(), minlength=int(self._psi_offsets[-1]))

    def grid_counts(self, x: NDArray[np.floating]) -> NDArray[np.int64]:
        """Counts of `x` (``(n, F)``) in every KS grid cell, flat."""
        return np.bincount(self.grid_codes(x).ravel(), minlength=int(self._grid_offsets[-1]))

    def psi(self, counts: NDArray[np.int64]) -> NDArray[np.float64]:
        """PSI per feature from flat PSI bin counts of ``n`` rows; NaN when ``n == 0``."""
        out = np.full(self.n_features, np.nan)
        for f, p in enumerate(self.proportions):
            c = counts[self._psi_offsets[f] : self._psi_offsets[f + 1]]
            n = c.sum()
            if n:
                out[f] = psi(p, c / n)
        return out

    def ks(self, counts: NDArray[np.int64]) -> NDArray[np.float64]:
        """KS statistic per feature on the grid from flat grid counts; NaN when ``n == 0``."""
        out = np.full(self.n_features, np.nan)
        for f, ref in enumerate(self.grid_cdf):
            c = counts[self._grid_offsets[f] : self._grid_offsets[f + 1]]
            n = c.sum()
            if n:
                live = np.cumsum(c[:-1]) / n  # P_live(X <= grid[j]); the last cell is > max
                out[f] = float(np.max(np.abs(live - ref)))
        return out

    def unseen(self, categories: Categories) -> Categories:
        """The parts of one request's `categories` never seen in training (empty = none).

        Open vocabularies (issue 22): an unknown workload kind or QoS class is
        accepted by the contract and flagged here, as an unseen hardware class is;
        so is a model family outside the manifest's (issue 23).
        """
        hardware, kind, qos, family = categories
        families = self.model_families
        return Categories(
            frozenset(hardware - self.hardware_classes),
            "" if kind in self.workload_kinds else kind,
            "" if self.qos_classes is None or qos in self.qos_classes else qos or "(unset)",
            "" if families is None or family in families else family or "(unset)",
        )

    def is_novel(self, categories: Categories) -> bool:
        """Whether one request has a category never seen in training."""
        unseen = self.unseen(categories)
        return bool(unseen.hardware or unseen.kind or unseen.qos or unseen.family)

    def outside(self, x: NDArray[np.floating]) -> NDArray[np.bool_]:
        """Rows with any feature outside the training ``[min, max]``, shape ``(n,)``."""
        out: NDArray[np.bool_] = np.any((x < self.low) | (x > self.high), axis=1)
        return out


def psi(expected: NDArray[np.float64], actual: NDArray[np.float64]) -> float:
    """PSI of proportions `actual` against `expected` (same bins), both floored at `PSI_FLOOR`."""
    p = np.maximum(np.asarray(expected, dtype=np.float64), PSI_FLOOR)
    q = np.maximum(np.asarray(actual, dtype=np.float64), PSI_FLOOR)
    return float(np.sum((q - p) * np.log(q / p)))


def ks_pvalue(statistic: float, n: int) -> float:
    """One-sample KS p-value of `statistic` on `n` rows against an exact reference CDF.

    Assumes independent rows (see the module docstring): descriptive only.
    """
    if n <= 0 or not math.isfinite(statistic):
        return math.nan
    return float(stats.kstwo.sf(statistic, n))


def build_reference(
    x: NDArray[np.floating],
    names: Sequence[str],
    hardware_classes: Iterable[str],
    workload_kinds: Iterable[str],
    *,
    qos_classes: Iterable[str] | None = None,
    n_bins: int = N_BINS,
    grid_size: int = GRID_SIZE,
) -> FeatureReference:
    """Summarise training rows `x` (``(n, F)``) as a `FeatureReference`."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != len(names) or len(x) == 0:
        raise ValueError(f"`x` must have shape (n > 0, {len(names)}), got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("`x` must be finite")
    low, high = x.min(axis=0), x.max(axis=0)
    levels = np.linspace(0.0, 1.0, n_bins + 1)[1:-1]
    edges, props, grids, cdfs = [], [], [], []
    for f in range(x.shape[1]):
        col = np.sort(x[:, f])
        inner = np.quantile(col, levels)
        e = np.unique(np.concatenate([[low[f]], inner, [np.nextafter(high[f], np.inf)]]))
        counts = np.bincount(np.searchsorted(e, col, side="right"), minlength=len(e) + 1)
        g = np.unique(np.quantile(col, np.linspace(0.0, 1.0, grid_size)))
        edges.append(e)
        props.append(counts / len(col))
        grids.append(g)
        cdfs.append(np.searchsorted(col, g, side="right") / len(col))
    return FeatureReference(
        names=tuple(names),
        n_rows=len(x),
        edges=tuple(edges),
        proportions=tuple(props),
        grid=tuple(grids),
        grid_cdf=tuple(cdfs),
        low=low,
        high=high,
        hardware_classes=frozenset(hardware_classes),
        workload_kinds=frozenset(workload_kinds),
        qos_classes=None if qos_classes is None else frozenset(qos_classes),
    )


class Categories(NamedTuple):
    """What drift checks for novelty in one request (open vocabularies, issues 22, 23).

    Attributes:
        hardware: class names of the request's option nodes.
        kind: the workload kind, as sent (known or not).
        qos: the QoS class, as sent (``""`` = unset).
        family: the model family (`model_family_of`; ``""`` = unset).
    """

    hardware: frozenset[str]
    kind: str
    qos: str
    family: str = ""


def model_family_of(model_family: str) -> str:
    """The family of a workload's ``model_family``: without a ``" (batch size ...)"`` suffix.

    Gavel spells job types ``"ResNet-50 (batch size 64)"``; manifests list
    families (``ResNet-50``): a new batch size of a known model is not a new family.
    """
    return model_family.split(" (")[0].strip()


def request_categories(request: MirrorRequest) -> Categories:
    """Hardware classes of the request's option nodes, its workload kind, QoS class and family."""
    state = request.state
    used = np.unique(state.node_hardware[request.options.node_index])
    return Categories(
        frozenset(state.hardware[int(i)].name for i in used),
        str(request.workload.kind),
        str(request.workload.qos_class),
        model_family_of(str(request.workload.model_family)),
    )


def with_model_families(
    reference: FeatureReference, families: Iterable[str] | None
) -> FeatureReference:
    """`reference` checking model families against `families` (a manifest's
    ``training_data.model_families``); None or empty leaves it unchecked.

    The families live in the manifest, not in the summary file: the build that
    fitted the policy knows them (`service.learning.build_models`, `understudy train`).
    """
    names = frozenset(model_family_of(f) for f in families or ())
    return dataclasses.replace(reference, model_families=names or None)


def positive_gaps(times: NDArray[np.floating], after: float | None = None) -> NDArray[np.float64]:
    """Positive gaps between consecutive `times` (``after`` precedes the first, if given).

    Zero gaps (equal times) and negative ones (out of order, clock resets) are dropped.
    """
    t = np.asarray(times, dtype=np.float64)
    if after is not None:
        t = np.concatenate([[after], t])
    d = np.diff(t)
    out: NDArray[np.float64] = d[d > 0]
    return out


def gap_statistic(gaps: NDArray[np.floating]) -> float:
    """``log`` of the `ARRIVAL_QUANTILE` quantile of positive `gaps`; NaN when there are none."""
    g = np.asarray(gaps, dtype=np.float64)
    if len(g) == 0:
        return math.nan
    return float(np.log(np.quantile(g, ARRIVAL_QUANTILE)))


def arrival_statistic(times: NDArray[np.floating]) -> float:
    """The window's arrival statistic from its request times in stream order (module docstring)."""
    return gap_statistic(positive_gaps(times))


@dataclass(frozen=True)
class FlagRule:
    """When a window of `window_requests` requests is flagged (module docstring).

    Attributes:
        window_requests: the window size it was calibrated for.
        alpha: the calibrated false-flag rate.
        scale: float64 ``(F,)``, per-feature PSI scale ``s_f``.
        threshold: flag when ``max_f PSI_f / s_f`` exceeds it.
        calibration_windows: ``B``, training-condition windows drawn.
        arrival_center: median `arrival_statistic` of the calibration windows; None
            when the training data has no arrival process (synthetic request times).
        arrival_threshold: flag when ``|arrival_statistic - arrival_center|`` exceeds it.
    """

    window_requests: int
    alpha: float
    scale: NDArray[np.float64]
    threshold: float
    calibration_windows: int
    arrival_center: float | None = None
    arrival_threshold: float | None = None

    def arrival_shift(self, statistic: float) -> float:
        """``statistic - arrival_center``, log units (negative: faster arrivals); NaN if none."""
        if self.arrival_center is None:
            return math.nan
        return statistic - self.arrival_center

    def arrival_flagged(self, statistic: float) -> bool:
        """Whether a window's arrival statistic is outside the calibrated band."""
        shift = self.arrival_shift(statistic)
        return (
            self.arrival_threshold is not None
            and math.isfinite(shift)
            and abs(shift) > self.arrival_threshold
        )

    def statistic(self, psi_values: NDArray[np.float64]) -> float:
        """``T = max_f PSI_f / s_f`` (NaN features ignored; NaN if all are)."""
        ratio = psi_values / self.scale
        return float(np.nanmax(ratio)) if np.any(np.isfinite(ratio)) else math.nan


def select_rule(rules: Sequence[FlagRule], window_requests: int) -> FlagRule:
    """The rule calibrated for the largest window not above `window_requests`.

    A rule calibrated on smaller windows has a higher threshold than the exact
    one would (PSI noise shrinks with window size), so this errs towards fewer
    flags. Raises `ValueError` when every rule is for larger windows.
    """
    fitting = [r for r in rules if r.window_requests <= window_requests]
    if not fitting:
        sizes = sorted(r.window_requests for r in rules)
        raise ValueError(
            f"`window_requests` must be at least {sizes[0] if sizes else '?'} (the smallest"
            f" calibrated window), got {window_requests}"
        )
    return max(fitting, key=lambda r: r.window_requests)
