"""Drift of live inputs against a policy's training reference: PSI, KS, novelty, support.

Pure numpy/scipy; imports nothing of the project but `service.contract`.

What is compared. A `FeatureReference` summarises the feature rows a policy
was trained on (every option row of every training request, shape
``(n_rows, F)``): per feature, PSI bins and their reference proportions, a
quantile grid with the reference CDF on it (for KS), the training min/max,
and the hardware classes and workload kinds seen. A live window (``N``
consecutive requests) is reduced to histogram counts against those edges —
one ``searchsorted`` per feature and one ``bincount`` per batch, no per-row
Python — and compared:

- PSI per feature (Siddiqi 2006, *Credit Risk Scorecards*, ch. 8)::

      PSI = sum_b (q_b - p_b) ln(q_b / p_b)

  over bins ``b`` = [below training min, the interior deciles, above
  training max], ``p`` reference and ``q`` live proportions, both floored at
  `PSI_FLOOR` so an empty bin is finite. The outer bins hold no training mass,
  so values outside the training range always add to PSI.
- KS per feature: ``D = max_j |F_live(g_j) - F_ref(g_j)|`` over the reference
  quantile grid ``g`` (`GRID_SIZE` points). It bounds the two-sample KS
  statistic ``D*`` from below, ``D* - max_j (F_ref(g_j) - F_ref(g_{j-1})) <= D <= D*``
  (within ``1/n_ref`` when the grid holds every reference value; 0.005 plus
  atoms with the default grid). `ks_pvalue` treats the reference CDF as exact (``n_ref >> n``)
  and the ``n`` live rows as independent — they are not (options of one
  request share its workload, requests of one window share cluster state), so
  the p-value is descriptive and the flag rule does not use it.
- Novelty: hardware classes (of the options' nodes) and workload kinds never
  seen in training.
- Out-of-support rows: a feature outside the training ``[min, max]`` or a row
  of a request with an unseen category.

The flag rule (`FlagRule`). Multiple features are tested at once, and rows are
strongly dependent, so neither per-feature nor iid-calibrated thresholds
control the false-flag rate. Instead the *window statistic*
``T = max_f PSI_f / s_f`` (``s_f`` the 95% quantile of feature ``f``'s PSI on
training-condition windows, floored at `SCALE_FLOOR`) is calibrated directly:
``B`` windows of ``N`` requests are drawn from the training data as distinct
whole groups (episodes) in random order, each compared with a reference built
on the other folds of groups (cross-fitted, over `CALIBRATION_REPEATS` random
deals; docs/drift.md says why each), and the threshold is the
conformal ``ceil((B + 1)(1 - alpha)) / B`` quantile of their ``T``. A new
training-condition window exchangeable with those has
``P(T > threshold) <= alpha`` (Vovk et al. 2005; Lei et al. 2018), whatever
the dependence between features — the max statistic is the multiple-testing
correction (Westfall & Young 1993). A window is flagged when ``T`` exceeds the
threshold or it contains an unseen category (never the case under training
conditions, so novelty adds no false flags).

The arrival check. Features see the cluster a request finds, not how fast
requests come; a burst of arrivals moves load features less than one training
episode differs from the next. So the window's arrival process is compared
too: `arrival_statistic` is the log of the `ARRIVAL_QUANTILE` quantile of the
*positive* gaps between consecutive request times (Runtime's clock,
``request_time``, seconds). Only positive gaps count, which makes it robust to
what real and simulated streams do: equal times (requests re-mirrored after a
forced defer, several jobs arriving together) add no gap, an out-of-order time
or a clock reset (each simulated episode restarts its clock) gives a negative
gap, which is dropped. The upper quartile rather than the median: positive
gaps mix short ones (events seconds apart around a completion or a retry)
with the gaps between arrivals, minutes apart; the median sits between the
two and moves with their mix. `calibrate_arrival` draws training-condition
windows the same way as `calibrate` (distinct whole episodes in random order)
and keeps their median (``arrival_center``) and the conformal ``1 - alpha``
quantile of ``|statistic - center|`` (``arrival_threshold``): a two-sided test
with false-flag rate at most ``alpha`` for exchangeable windows, the combined
rule (features or novelty or arrival) at most ``2 alpha``. It needs no
reference to fit, so no cross-fitting; but it needs many episodes: a few
episodes are retry storms (hundreds of re-mirrored requests seconds apart)
that dominate any window holding them, and 120 episodes under-represent them
(docs/drift.md gives the measurement).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

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
    )


def request_categories(request: MirrorRequest) -> tuple[frozenset[str], str]:
    """Hardware classes of the request's option nodes, and its workload kind."""
    state = request.state
    used = np.unique(state.node_hardware[request.options.node_index])
    return frozenset(state.hardware[int(i)].name for i in used), str(request.workload.kind)


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


def _draw_window(
    rng: np.random.Generator,
    group_lo: NDArray[np.int64],
    group_hi: NDArray[np.int64],
    n_requests: int,
) -> NDArray[np.int64]:
    """Request indices of one window: distinct groups in random order, the first entered at
    a random request. A group repeats only when the window needs more than there are: a
    repeated episode counts its cluster state twice and makes a window more variable than
    a fresh one (measured: per-feature PSI scales ~1.5x)."""
    parts: list[NDArray[np.int64]] = []
    need = n_requests
    first = True
    order: list[int] = []
    while need > 0:
        if not order:
            order = rng.permutation(len(group_lo)).tolist()
        g = order.pop()
        lo, hi = int(group_lo[g]), int(group_hi[g])
        if first:
            lo = int(rng.integers(lo, hi))
            first = False
        take = min(need, hi - lo)
        parts.append(np.arange(lo, lo + take, dtype=np.int64))
        need -= take
    return np.concatenate(parts)


def _rows(request_offsets: NDArray[np.int64], reqs: NDArray[np.int64]) -> NDArray[np.int64]:
    """Row indices of requests `reqs`, in order."""
    starts, ends = request_offsets[reqs], request_offsets[reqs + 1]
    lengths = ends - starts
    out: NDArray[np.int64] = np.repeat(ends - np.cumsum(lengths), lengths) + np.arange(
        int(lengths.sum())
    )
    return out


def calibrate(
    reference: FeatureReference,
    x: NDArray[np.floating],
    request_offsets: NDArray[np.int64],
    group_starts: NDArray[np.int64],
    window_requests: int,
    *,
    alpha: float = DEFAULT_ALPHA,
    n_windows: int = 1000,
    seed: int = 0,
    folds: int = CALIBRATION_FOLDS,
    repeats: int = CALIBRATION_REPEATS,
) -> FlagRule:
    """Calibrate the flag rule on `n_windows` training-condition windows (module docstring).

    Cross-fitted: the groups are dealt into `folds` folds; windows are drawn
    from one fold and compared with a reference built from the others, over
    `repeats` random deals (a single deal was measured to move the threshold
    by 20% and per-feature scales by 2x: a few heavy episodes dominate). A
    window drawn from the data its reference was built on is closer to it than
    a fresh one (measured: mean PSI ~10% lower), which would calibrate a
    threshold too low; a reference built on ``(folds - 1) / folds`` of the
    data is a little noisier than the full one used live, which errs the other,
    safe way (a slightly higher threshold).

    Args:
        reference: built from `x` (names and categories are taken from it).
        x: training rows ``(n_rows, F)``, requests in time order.
        request_offsets: int64 ``(n_requests + 1,)``, CSR rows of each request.
        group_starts: int64 ``(n_groups + 1,)``, first request of each group
            (an episode; a single request when requests are independent).
        window_requests: requests per window.

    The rule has no arrival check; `calibrate_arrival` adds one.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"`alpha` must be in (0, 1), got {alpha}")
    if window_requests < 1 or n_windows < 1:
        raise ValueError("`window_requests` and `n_windows` must be >= 1")
    n_groups = len(group_starts) - 1
    if n_groups < folds or folds < 2:
        raise ValueError(f"need at least `folds` ({folds}, >= 2) groups, got {n_groups}")
    x = np.asarray(x)
    rng = np.random.default_rng(seed)
    psis = np.empty((n_windows, reference.n_features))
    splits = [k for _ in range(repeats) for k in range(folds)]
    fold_of = np.empty(0, dtype=np.int64)
    for i, k in enumerate(splits):
        if k == 0:
            fold_of = rng.permutation(n_groups) % folds
        inside = np.flatnonzero(fold_of == k)
        other = np.flatnonzero(fold_of != k)
        other_reqs = np.concatenate(
            [np.arange(group_starts[g], group_starts[g + 1]) for g in other]
        ).astype(np.int64)
        ref_k = build_reference(
            x[_rows(request_offsets, other_reqs)],
            reference.names,
            reference.hardware_classes,
            reference.workload_kinds,
            grid_size=2,
        )
        codes = ref_k.psi_codes(x)
        minlength = int(ref_k._psi_offsets[-1])
        lo, hi = group_starts[inside], group_starts[inside + 1]
        for b in range(i, n_windows, len(splits)):
            rows = _rows(request_offsets, _draw_window(rng, lo, hi, window_requests))
            psis[b] = ref_k.psi(np.bincount(codes[rows].ravel(), minlength=minlength))
    scale = np.maximum(np.quantile(psis, 0.95, axis=0), SCALE_FLOOR)
    t = np.max(psis / scale, axis=1)
    k_th = min(n_windows, math.ceil((n_windows + 1) * (1 - alpha)))
    threshold = float(np.sort(t)[k_th - 1])
    return FlagRule(window_requests, alpha, scale, threshold, n_windows)


def calibrate_arrival(
    rule: FlagRule,
    request_times: NDArray[np.floating],
    group_starts: NDArray[np.int64],
    *,
    n_windows: int = 1000,
    seed: int = 0,
) -> FlagRule:
    """`rule` with its arrival check, calibrated on `n_windows` training-condition windows.

    Windows of ``rule.window_requests`` requests are drawn as in `calibrate`
    (distinct whole groups in random order, the first entered at a random
    request); the check keeps the median of their `arrival_statistic` and the
    conformal ``ceil((B + 1)(1 - alpha))``-th smallest ``|statistic - median|``.

    Args:
        rule: the feature rule of the same window size (its ``alpha`` is used).
        request_times: float ``(n_requests,)``, each request's ``request_time``,
            groups (episodes) concatenated, each possibly restarting its clock.
        group_starts: int64 ``(n_groups + 1,)``, first request of each group.
    """
    times = np.asarray(request_times, dtype=np.float64)
    if len(group_starts) < 2 or int(group_starts[-1]) != len(times):
        raise ValueError(f"`group_starts` must end at the number of request times ({len(times)})")
    rng = np.random.default_rng(seed)
    lo, hi = group_starts[:-1], group_starts[1:]
    values = np.array(
        [
            arrival_statistic(times[_draw_window(rng, lo, hi, rule.window_requests)])
            for _ in range(n_windows)
        ]
    )
    if not np.any(np.isfinite(values)):
        raise ValueError("no calibration window has two distinct request times")
    center = float(np.nanmedian(values))
    # a window without a positive gap is never flagged live, so it counts as no shift
    deviation = np.sort(np.nan_to_num(np.abs(values - center), nan=0.0))
    k_th = min(n_windows, math.ceil((n_windows + 1) * (1 - rule.alpha)))
    return replace(rule, arrival_center=center, arrival_threshold=float(deviation[k_th - 1]))


@dataclass(frozen=True)
class WindowDrift:
    """One closed window.

    Attributes:
        n_requests, n_rows: requests and option rows in the window.
        psi, ks: float64 ``(F,)`` per feature.
        statistic: ``T`` of the rule; threshold: the rule's.
        flagged: ``T > threshold``, an unseen category, or `arrival_flagged`.
        unseen_hardware, unseen_kinds: categories never seen in training.
        out_of_support_rows: rows outside the training range or of a novel request.
        decisions, out_of_support_decisions: the policy's decisions in the window,
            and those made on an out-of-support input.
        arrival: `arrival_statistic` of the window's request times (NaN: no positive gap).
        arrival_shift: ``arrival`` minus the training median (NaN: no arrival check).
        arrival_flagged: ``|arrival_shift|`` above the rule's arrival threshold.
    """

    n_requests: int
    n_rows: int
    psi: NDArray[np.float64]
    ks: NDArray[np.float64]
    statistic: float
    threshold: float
    flagged: bool
    unseen_hardware: tuple[str, ...]
    unseen_kinds: tuple[str, ...]
    out_of_support_rows: int
    decisions: int
    out_of_support_decisions: int
    arrival: float = math.nan
    arrival_shift: float = math.nan
    arrival_flagged: bool = False

    @property
    def psi_max(self) -> float:
        """Largest per-feature PSI (0 when no rows)."""
        return float(np.nanmax(self.psi)) if np.any(np.isfinite(self.psi)) else 0.0


class WindowAccumulator:
    """Counts of one open window; `close` computes its `WindowDrift` and resets."""

    def __init__(
        self, reference: FeatureReference, rule: FlagRule, window_requests: int | None = None
    ) -> None:
        self.reference = reference
        self.rule = rule
        self.window_requests = window_requests or rule.window_requests
        if self.window_requests < rule.window_requests:
            raise ValueError(
                f"`window_requests` must be >= the rule's {rule.window_requests},"
                f" got {self.window_requests}"
            )
        self._reset()

    def _reset(self) -> None:
        r = self.reference
        self.psi_counts = np.zeros(int(r._psi_offsets[-1]), dtype=np.int64)
        self.grid_counts = np.zeros(int(r._grid_offsets[-1]), dtype=np.int64)
        self.n_requests = 0
        self.n_rows = 0
        self.unseen_hardware: set[str] = set()
        self.unseen_kinds: set[str] = set()
        self.out_of_support_rows = 0
        self.decisions = 0
        self.out_of_support_decisions = 0
        self.gaps: list[NDArray[np.float64]] = []
        self.last_time: float | None = None

    def add_times(self, times: NDArray[np.floating]) -> None:
        """Add the times of the requests just added, in stream order (gaps within the window)."""
        t = np.asarray(times, dtype=np.float64)
        if len(t):
            self.gaps.append(positive_gaps(t, self.last_time))
            self.last_time = float(t[-1])

    def add(
        self,
        x: NDArray[np.floating],
        n_requests: int,
        hardware: Iterable[str] = (),
        kinds: Iterable[str] = (),
        out_of_support_rows: int = 0,
        decisions: int = 0,
        out_of_support_decisions: int = 0,
    ) -> None:
        """Add the rows `x` (``(n, F)``) of `n_requests` requests and what was seen in them."""
        r = self.reference
        if len(x):
            self.psi_counts += r.psi_counts(x)
            self.grid_counts += r.grid_counts(x)
        self.n_requests += n_requests
        self.n_rows += len(x)
        self.unseen_hardware |= set(hardware) - r.hardware_classes
        self.unseen_kinds |= set(kinds) - r.workload_kinds
        self.out_of_support_rows += out_of_support_rows
        self.decisions += decisions
        self.out_of_support_decisions += out_of_support_decisions

    def close(self) -> WindowDrift:
        """The window's drift; the accumulator starts a new window."""
        psi_values = self.reference.psi(self.psi_counts)
        statistic = self.rule.statistic(psi_values)
        novel = bool(self.unseen_hardware or self.unseen_kinds)
        arrival = gap_statistic(np.concatenate(self.gaps)) if self.gaps else math.nan
        arrival_flagged = self.rule.arrival_flagged(arrival)
        out = WindowDrift(
            n_requests=self.n_requests,
            n_rows=self.n_rows,
            psi=psi_values,
            ks=self.reference.ks(self.grid_counts),
            statistic=statistic,
            threshold=self.rule.threshold,
            flagged=novel
            or arrival_flagged
            or (math.isfinite(statistic) and statistic > self.rule.threshold),
            unseen_hardware=tuple(sorted(self.unseen_hardware)),
            unseen_kinds=tuple(sorted(self.unseen_kinds)),
            out_of_support_rows=self.out_of_support_rows,
            decisions=self.decisions,
            out_of_support_decisions=self.out_of_support_decisions,
            arrival=arrival,
            arrival_shift=self.rule.arrival_shift(arrival),
            arrival_flagged=arrival_flagged,
        )
        self._reset()
        return out

    def feed(
        self,
        x: NDArray[np.floating],
        offsets: NDArray[np.int64],
        categories: Sequence[tuple[frozenset[str], str]],
        chosen: NDArray[np.int64] | None = None,
        times: NDArray[np.floating] | None = None,
    ) -> list[WindowDrift]:
        """Add requests in CSR form; return the windows they closed (usually none).

        Args:
            x: rows ``(n_rows, F)`` of the requests, in order.
            offsets: int64 ``(n_requests + 1,)``, each request's rows.
            categories: per request, `request_categories`.
            chosen: per request, the policy's chosen option (-1: DEFER;
                `NO_DECISION`: the policy did not decide on it),
                or None when no decisions are counted. A decision is out of
                support when its chosen row is (DEFER: when any row is).
            times: per request, its ``request_time`` (the arrival check), or None
                when not known (the window's arrival statistic is then NaN).
        """
        r = self.reference
        n_req = len(offsets) - 1
        if times is not None and len(times) != n_req:
            raise ValueError(f"`times` must have one time per request ({n_req}), got {len(times)}")
        counts = np.diff(offsets)
        novel = np.array(
            [
                bool(hw - r.hardware_classes) or kind not in r.workload_kinds
                for hw, kind in categories
            ],
            dtype=bool,
        )
        oos_row = r.outside(x) | np.repeat(novel, counts)
        oos_decision = np.zeros(n_req, dtype=bool)
        decided = np.zeros(n_req, dtype=bool) if chosen is None else chosen >= DEFER_OPTION
        if chosen is not None and n_req:
            pick = chosen >= 0
            oos_decision[pick] = oos_row[offsets[:-1][pick] + chosen[pick]]
            rows_of = np.repeat(np.arange(n_req), counts)
            any_row = np.bincount(rows_of, weights=oos_row, minlength=n_req) > 0
            oos_decision[~pick] = any_row[~pick] | novel[~pick]
            oos_decision &= decided
        closed: list[WindowDrift] = []
        start = 0
        while start < n_req:
            take = min(n_req - start, self.window_requests - self.n_requests)
            end = start + take
            lo, hi = int(offsets[start]), int(offsets[end])
            self.add(
                x[lo:hi],
                take,
                hardware=set().union(*(categories[i][0] for i in range(start, end))),
                kinds={categories[i][1] for i in range(start, end)},
                out_of_support_rows=int(oos_row[lo:hi].sum()),
                decisions=int(decided[start:end].sum()),
                out_of_support_decisions=int(oos_decision[start:end].sum()),
            )
            if times is not None:
                self.add_times(times[start:end])
            if self.n_requests >= self.window_requests:
                closed.append(self.close())
            start = end
        return closed
