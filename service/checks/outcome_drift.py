"""Outcome drift: do placed jobs still run as fast as they did in training, per hardware class?

Pure numpy; imports nothing of the project but `service.contract` and the
window drawing of `service.checks.drift_calibration`.

Why a third check. The feature and arrival checks (`service.checks.drift`) see
what a request shows: the cluster state, the workload, how fast requests
come. A change in the hardware itself — a class throttled to half its
measured speed, a bad driver, a noisy neighbour — shows in none of them: the
datasheet numbers on the request are unchanged. It shows only in the
outcomes Runtime reports later. So the training summary also keeps, per
*cell* (model family x production's hardware class x accelerators
requested), the median log throughput of the placed training jobs, and a
window of joined outcomes is compared with it:

- each outcome with a positive throughput, whose request production placed
  on one option, gets a residual ``r = ln(throughput) - median_cell`` (cells
  seen fewer than `MIN_CELL_OUTCOMES` times in training are skipped and
  counted: no reference to compare with);
- per hardware class with at least `MIN_CLASS_OUTCOMES` residuals in the
  window, the median residual ``m_h`` (robust to the few jobs that shared a
  node or failed slowly): the log of "how much faster or slower than in
  training" — ``m_h = -0.69`` is half speed;
- the window statistic ``T = max_h |m_h| / s_h``, ``s_h`` the 95% quantile of
  ``|m_h|`` over training-condition windows (floored at `SCALE_FLOOR`), and
  the threshold the conformal ``ceil((B + 1)(1 - alpha))``-th smallest ``T``
  of ``B`` such windows — the construction of the feature rule, so the
  false-flag rate is at most ``alpha`` for windows exchangeable with the
  calibration ones, whatever the dependence between jobs of one episode.

The reference is built on the episodes a policy was trained on; the
calibration windows are drawn (distinct whole episodes in random order, the
first entered at a random outcome) from later episodes of the same scenario
and seed that it never saw, so no cross-fitting is needed.

Residuals are conditional on the cell, so a shift in the workload mix alone
(more of one model family) does not move ``m_h``; a change in how jobs share
nodes (packing, fragmentation) does, and is flagged — an honest finding, not
a false alarm: outcomes no longer follow training.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.checks.drift_calibration import _draw_window
from service.contract import MirrorRequest, Outcome

MIN_CELL_OUTCOMES = 5
"""Training outcomes a cell needs before its median is a reference."""
MIN_CLASS_OUTCOMES = 30
"""Residuals a hardware class needs in a window before its median counts."""
SCALE_FLOOR = 0.01
"""Smallest per-class scale ``s_h`` (log units: 1%)."""
OUTCOME_ALPHA = 0.01
"""Calibrated false-flag rate of the outcome check (the feature and arrival checks take
0.01 each: all three together stay under the 5% acceptance bound)."""
OUTCOME_WINDOW_SIZES = (100, 250, 500, 1000, 2000)
"""Window sizes (residuals) an outcome rule is calibrated for."""


@dataclass(frozen=True, eq=False)
class OutcomeRows:
    """Placed outcomes with a positive throughput, one row each; shapes ``(n,)``.

    Attributes:
        request_index: position of the outcome's request in the request sequence given.
        hardware: production's hardware class for it (``"A+B"`` for an option spanning two).
        cell: ``"<model family>|<hardware>|<accelerators>"``.
        log_throughput: ``ln(throughput)``.
    """

    request_index: NDArray[np.int64]
    hardware: NDArray[np.str_]
    cell: NDArray[np.str_]
    log_throughput: NDArray[np.float64]

    def __len__(self) -> int:
        return len(self.log_throughput)

    def take(self, index: NDArray[np.int64]) -> OutcomeRows:
        """The rows at `index`."""
        return OutcomeRows(
            self.request_index[index],
            self.hardware[index],
            self.cell[index],
            self.log_throughput[index],
        )


def option_hardware(request: MirrorRequest, option: int) -> str:
    """The hardware class(es) of `option`'s nodes, sorted and joined with ``+``."""
    state = request.state
    return "+".join(
        sorted({state.hardware_of(int(n)).name for n in request.options.nodes_of(option)})
    )


def outcome_rows(requests: Sequence[MirrorRequest], outcomes: Mapping[str, Outcome]) -> OutcomeRows:
    """The rows of `requests` whose outcome (by request id) reports a positive throughput.

    Production's option comes from the request (Runtime mirrored after deciding)
    or from the outcome (mirrored before); a deferred request has no row.
    """
    index: list[int] = []
    hardware: list[str] = []
    cells: list[str] = []
    logs: list[float] = []
    for i, request in enumerate(requests):
        outcome = outcomes.get(request.request_id)
        if outcome is None or outcome.throughput is None or not outcome.throughput > 0:
            continue
        decision = request.production or outcome.production
        if decision is None or decision.option < 0:
            continue
        hw = option_hardware(request, decision.option)
        w = request.workload
        index.append(i)
        hardware.append(hw)
        cells.append(f"{w.model_family}|{hw}|{w.accelerators}")
        logs.append(math.log(outcome.throughput))
    return OutcomeRows(
        np.array(index, dtype=np.int64),
        np.array(hardware, dtype=np.str_),
        np.array(cells, dtype=np.str_),
        np.array(logs, dtype=np.float64),
    )


@dataclass(frozen=True, eq=False)
class OutcomeReference:
    """Per cell, the training median log throughput and how many outcomes it rests on."""

    median: Mapping[str, float]
    count: Mapping[str, int]

    @property
    def hardware_classes(self) -> tuple[str, ...]:
        """Hardware classes with at least one usable cell, sorted."""
        return tuple(sorted({c.split("|")[1] for c in self.usable_cells}))

    @property
    def usable_cells(self) -> tuple[str, ...]:
        """Cells with at least `MIN_CELL_OUTCOMES` training outcomes."""
        return tuple(c for c, n in self.count.items() if n >= MIN_CELL_OUTCOMES)

    def residuals(self, rows: OutcomeRows) -> tuple[NDArray[np.bool_], NDArray[np.float64]]:
        """Which rows have a usable cell, and ``ln(throughput) - median_cell`` (NaN elsewhere)."""
        usable = set(self.usable_cells)
        centre = np.array(
            [self.median[c] if c in usable else math.nan for c in rows.cell.tolist()],
            dtype=np.float64,
        )
        known = np.isfinite(centre)
        return known, rows.log_throughput - centre


def build_outcome_reference(rows: OutcomeRows) -> OutcomeReference:
    """Medians per cell of the training outcomes."""
    median: dict[str, float] = {}
    count: dict[str, int] = {}
    cells, inverse = np.unique(rows.cell, return_inverse=True)
    for k, cell in enumerate(cells.tolist()):
        values = rows.log_throughput[inverse == k]
        median[cell] = float(np.median(values))
        count[cell] = len(values)
    return OutcomeReference(median, count)


def class_medians(
    classes: Sequence[str], hardware: NDArray[np.str_], residual: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Per class of `classes`: the median residual (NaN under `MIN_CLASS_OUTCOMES`), and counts."""
    medians = np.full(len(classes), math.nan)
    counts = np.zeros(len(classes), dtype=np.int64)
    for k, name in enumerate(classes):
        values = residual[hardware == name]
        counts[k] = len(values)
        if len(values) >= MIN_CLASS_OUTCOMES:
            medians[k] = float(np.median(values))
    return medians, counts


@dataclass(frozen=True, eq=False)
class OutcomeRule:
    """When a window of (about) `window_outcomes` residuals is flagged.

    Attributes:
        window_outcomes: the window size (residuals) it was calibrated for.
        alpha: the calibrated false-flag rate.
        classes: the hardware classes checked, in `scale`'s order.
        scale: float64 per class, ``s_h``.
        threshold: flag when ``max_h |m_h| / s_h`` exceeds it.
        calibration_windows: ``B``.
    """

    window_outcomes: int
    alpha: float
    classes: tuple[str, ...]
    scale: NDArray[np.float64]
    threshold: float
    calibration_windows: int

    def statistic(self, medians: NDArray[np.float64]) -> float:
        """``T = max_h |m_h| / s_h`` over classes with a median; NaN when none has."""
        ratio = np.abs(medians) / self.scale
        return float(np.nanmax(ratio)) if np.any(np.isfinite(ratio)) else math.nan


def calibrate_outcome(
    reference: OutcomeReference,
    rows: OutcomeRows,
    group_starts: NDArray[np.int64],
    window_outcomes: int,
    *,
    alpha: float = OUTCOME_ALPHA,
    n_windows: int = 1000,
    seed: int = 0,
) -> OutcomeRule:
    """An `OutcomeRule` from `n_windows` windows of held-out training-condition outcomes.

    Args:
        rows: outcome rows of episodes the reference was *not* built on, episodes
            concatenated in order.
        group_starts: int64 ``(n_groups + 1,)``, each episode's first row in `rows`.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"`alpha` must be in (0, 1), got {alpha}")
    if window_outcomes < MIN_CLASS_OUTCOMES or n_windows < 1:
        raise ValueError(
            f"`window_outcomes` must be >= {MIN_CLASS_OUTCOMES} and `n_windows` >= 1,"
            f" got {window_outcomes} and {n_windows}"
        )
    if len(group_starts) < 2 or int(group_starts[-1]) != len(rows):
        raise ValueError(f"`group_starts` must end at the number of rows ({len(rows)})")
    classes = reference.hardware_classes
    known, residual = reference.residuals(rows)
    rng = np.random.default_rng(seed)
    lo, hi = group_starts[:-1], group_starts[1:]
    medians = np.empty((n_windows, len(classes)))
    for b in range(n_windows):
        pick = _draw_window(rng, lo, hi, window_outcomes)
        pick = pick[known[pick]]
        medians[b] = class_medians(classes, rows.hardware[pick], residual[pick])[0]
    with np.errstate(all="ignore"):
        spread = np.nanquantile(np.abs(medians), 0.95, axis=0)
    scale = np.maximum(np.nan_to_num(spread, nan=SCALE_FLOOR), SCALE_FLOOR)
    ratio = np.abs(medians) / scale
    # a window where no class reaches MIN_CLASS_OUTCOMES is never flagged live: T = 0
    t = np.nanmax(np.nan_to_num(ratio, nan=0.0), axis=1)
    k_th = min(n_windows, math.ceil((n_windows + 1) * (1 - alpha)))
    threshold = float(np.sort(t)[k_th - 1])
    return OutcomeRule(window_outcomes, alpha, classes, scale, threshold, n_windows)


def select_outcome_rule(rules: Sequence[OutcomeRule], n_residuals: int) -> OutcomeRule | None:
    """The rule for the largest window not above `n_residuals`; None when all are larger."""
    fitting = [r for r in rules if r.window_outcomes <= n_residuals]
    return max(fitting, key=lambda r: r.window_outcomes) if fitting else None


@dataclass(frozen=True)
class OutcomeWindow:
    """One window's outcome check.

    Attributes:
        n_outcomes: placed outcomes with a throughput; n_residuals: of those, in a usable cell.
        classes, medians, counts: per checked class, ``m_h`` (NaN: too few) and residuals.
        statistic, threshold: of the rule used (NaN threshold: no rule fits, not checked).
        flagged: ``statistic > threshold``.
    """

    n_outcomes: int
    n_residuals: int
    classes: tuple[str, ...]
    medians: NDArray[np.float64]
    counts: NDArray[np.int64]
    statistic: float
    threshold: float
    flagged: bool

    def shift(self, hardware: str) -> float:
        """``m_h`` of `hardware` (log units; NaN when not checked)."""
        if hardware not in self.classes:
            return math.nan
        return float(self.medians[self.classes.index(hardware)])


def check_window(
    reference: OutcomeReference, rules: Sequence[OutcomeRule], rows: OutcomeRows
) -> OutcomeWindow:
    """The outcome check of the rows of one window."""
    known, residual = reference.residuals(rows)
    rule = select_outcome_rule(rules, int(known.sum()))
    classes = rule.classes if rule is not None else reference.hardware_classes
    medians, counts = class_medians(classes, rows.hardware[known], residual[known])
    if rule is None:
        return OutcomeWindow(
            len(rows), int(known.sum()), classes, medians, counts, math.nan, math.nan, False
        )
    statistic = rule.statistic(medians)
    flagged = math.isfinite(statistic) and statistic > rule.threshold
    return OutcomeWindow(
        len(rows), int(known.sum()), classes, medians, counts, statistic, rule.threshold, flagged
    )
