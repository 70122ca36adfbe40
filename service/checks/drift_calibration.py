"""Calibrating the drift flag rule on training-condition windows.

Windows of whole groups (episodes) drawn in random order, cross-fitted
against references built on the other folds; the threshold is a conformal
quantile (see `service.checks.drift`'s docstring and docs/drift.md).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from service.checks.drift_reference import (
    CALIBRATION_FOLDS,
    CALIBRATION_REPEATS,
    DEFAULT_ALPHA,
    SCALE_FLOOR,
    FeatureReference,
    FlagRule,
    arrival_statistic,
    build_reference,
)


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
