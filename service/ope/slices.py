"""Diagnostics and estimates per slice of the log (hardware class, workload kind, tenant...).

Overlap can hold for the log as a whole and fail in one slice (a hardware
class production never uses for a workload kind), so support and ESS are
reported per slice, each slice with its own verdict. Estimates per slice are
recomputed on the slice's rounds, which for the additive estimators equals
the slice mean of the full log's per-round contributions, and for the
self-normalised ones normalises within the slice.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.contract import InvalidInput
from service.ope.data import BanditData
from service.ope.diagnostics import TAIL_THRESHOLD, diagnostics, identification_failure
from service.ope.estimators import SWITCH_TAU, estimate
from service.ope.intervals import Bootstrap
from service.ope.results import Diagnostics, Estimator, Result


@dataclass(frozen=True, slots=True)
class SliceDiagnostics:
    """Overlap in one slice of the log.

    Attributes:
        label: the slice (e.g. a hardware class or workload kind).
        diagnostics: the slice's diagnostics.
        failure: why the slice's value is not identifiable, or None.
    """

    label: Hashable
    diagnostics: Diagnostics
    failure: str | None


@dataclass(frozen=True, slots=True)
class SliceEstimate:
    """One slice's estimate (or refusal).

    Attributes:
        label: the slice.
        result: `Estimate` or `NotIdentifiable` on the slice's rounds.
    """

    label: Hashable
    result: Result


def _groups(
    data: BanditData, labels: NDArray[np.generic] | Sequence[Hashable]
) -> list[tuple[Hashable, NDArray[np.bool_]]]:
    lab = np.asarray(labels)
    if lab.shape != (data.n,):
        raise InvalidInput("labels", f"must have shape ({data.n},), got {lab.shape}")
    out: list[tuple[Hashable, NDArray[np.bool_]]] = []
    for value in np.unique(lab):
        label: Hashable = value.item() if isinstance(value, np.generic) else value
        out.append((label, lab == value))
    return out


def diagnostics_by_slice(
    data: BanditData,
    labels: NDArray[np.generic] | Sequence[Hashable],
    *,
    tail_threshold: float = TAIL_THRESHOLD,
    support_tolerance: float = 0.0,
) -> tuple[SliceDiagnostics, ...]:
    """Overlap per slice, in sorted label order.

    Args:
        data: the logged rounds (with `feasible`, support is judged on the
            per-decision feasible set).
        labels: ``(n,)``, each round's slice.
        tail_threshold: see `service.ope.diagnostics.DiagnosticSums`.
        support_tolerance: see `service.ope.diagnostics.identification_failure`.
    """
    out = []
    for label, rows in _groups(data, labels):
        d = diagnostics(data.subset(rows), tail_threshold)
        out.append(SliceDiagnostics(label, d, identification_failure(d, support_tolerance)))
    return tuple(out)


def estimate_by_slice(
    data: BanditData,
    labels: NDArray[np.generic] | Sequence[Hashable],
    estimator: Estimator | str,
    *,
    level: float = 0.95,
    tau: float = SWITCH_TAU,
    bootstrap: Bootstrap | None = None,
    support_tolerance: float = 0.0,
) -> tuple[SliceEstimate, ...]:
    """`service.ope.estimators.estimate` on each slice's rounds, in sorted label order."""
    return tuple(
        SliceEstimate(
            label,
            estimate(
                data.subset(rows),
                estimator,
                level=level,
                tau=tau,
                bootstrap=bootstrap,
                support_tolerance=support_tolerance,
            ),
        )
        for label, rows in _groups(data, labels)
    )
