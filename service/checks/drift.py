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
- Novelty: hardware classes (of the options' nodes), workload kinds, QoS
  classes and model families never seen in training (kind and QoS are open
  vocabularies: an unknown value is accepted by the contract and flagged here;
  families come from the policy's manifest, `with_model_families`).
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
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.checks.drift_calibration import calibrate, calibrate_arrival
from service.checks.drift_reference import (
    ARRIVAL_QUANTILE,
    CALIBRATION_FOLDS,
    CALIBRATION_REPEATS,
    DEFAULT_ALPHA,
    DEFER_OPTION,
    GRID_SIZE,
    N_BINS,
    NO_DECISION,
    PSI_FLOOR,
    SCALE_FLOOR,
    Categories,
    FeatureReference,
    FlagRule,
    arrival_statistic,
    build_reference,
    gap_statistic,
    ks_pvalue,
    model_family_of,
    positive_gaps,
    psi,
    request_categories,
    select_rule,
    with_model_families,
)


@dataclass(frozen=True)
class WindowDrift:
    """One closed window.

    Attributes:
        n_requests, n_rows: requests and option rows in the window.
        psi, ks: float64 ``(F,)`` per feature.
        statistic: ``T`` of the rule; threshold: the rule's.
        flagged: ``T > threshold``, an unseen category, or `arrival_flagged`.
        unseen_hardware, unseen_kinds, unseen_qos, unseen_families: categories never
            seen in training (``"(unset)"`` in `unseen_qos`: requests without a QoS
            class, when training always had one; families are checked only when the
            reference knows them, `FeatureReference.model_families`).
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
    unseen_qos: tuple[str, ...] = ()
    unseen_families: tuple[str, ...] = ()

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
        self.unseen_qos: set[str] = set()
        self.unseen_families: set[str] = set()
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
        qos: Iterable[str] = (),
        families: Iterable[str] = (),
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
        if r.qos_classes is not None:
            self.unseen_qos |= {q or "(unset)" for q in set(qos) - r.qos_classes}
        if r.model_families is not None:
            self.unseen_families |= {f or "(unset)" for f in set(families) - r.model_families}
        self.out_of_support_rows += out_of_support_rows
        self.decisions += decisions
        self.out_of_support_decisions += out_of_support_decisions

    def close(self) -> WindowDrift:
        """The window's drift; the accumulator starts a new window."""
        psi_values = self.reference.psi(self.psi_counts)
        statistic = self.rule.statistic(psi_values)
        novel = bool(
            self.unseen_hardware or self.unseen_kinds or self.unseen_qos or self.unseen_families
        )
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
            unseen_qos=tuple(sorted(self.unseen_qos)),
            unseen_families=tuple(sorted(self.unseen_families)),
        )
        self._reset()
        return out

    def feed(
        self,
        x: NDArray[np.floating],
        offsets: NDArray[np.int64],
        categories: Sequence[Categories],
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
        novel = np.fromiter((r.is_novel(c) for c in categories), dtype=bool, count=n_req)
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
                kinds={categories[i].kind for i in range(start, end)},
                qos={categories[i].qos for i in range(start, end)},
                families={categories[i].family for i in range(start, end)},
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


__all__ = [
    "ARRIVAL_QUANTILE",
    "CALIBRATION_FOLDS",
    "CALIBRATION_REPEATS",
    "DEFAULT_ALPHA",
    "DEFER_OPTION",
    "GRID_SIZE",
    "NO_DECISION",
    "N_BINS",
    "PSI_FLOOR",
    "SCALE_FLOOR",
    "Categories",
    "FeatureReference",
    "FlagRule",
    "WindowAccumulator",
    "WindowDrift",
    "arrival_statistic",
    "build_reference",
    "calibrate",
    "calibrate_arrival",
    "gap_statistic",
    "ks_pvalue",
    "model_family_of",
    "positive_gaps",
    "psi",
    "request_categories",
    "select_rule",
    "with_model_families",
]
