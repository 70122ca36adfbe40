"""Throughput of two jobs sharing one GPU: Gavel's measured pairs, and the model where none is.

Measured (``gavel-throughputs/colocated_pair_throughputs.csv``, single-GPU
rows): the steps/s of job type ``a`` while it shares a GPU of class ``c`` with
type ``b``. Used as is; ``0.0`` is Gavel's "cannot run together" and is kept:
such a pair never co-locates.

Modelled, where the table has no entry for ``(a, b, c)`` (NaN): ``a``'s
measured alone rate on ``c`` times ``a``'s *median co-location ratio*, the
median over every positive measured pair of ``a`` (any partner, any measured
class) of ``pair / alone``; a type with no positive measured pair takes the
median ratio over all types. So a missing pair is slowed as ``a`` is typically
slowed by a partner, never silently run at its isolated rate. Without a
measured alone rate (a class Gavel never measured) nothing is modelled: the
rate stays NaN and the class is not allowed for the job.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def median_colocation_ratio(
    pair: NDArray[np.float64], alone: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Per type, the median of ``pair / alone`` over its positive measured pairs, ``(n_types,)``.

    `pair` is ``(n_types, n_types, n_classes)``, `alone` ``(n_types, n_classes)``
    (single-GPU consolidated rates); both over the measured classes only.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = pair / alone[:, None, :]
    ok = np.isfinite(ratio) & (pair > 0) & (alone[:, None, :] > 0)
    overall = float(np.median(ratio[ok])) if ok.any() else np.nan
    out = np.full(pair.shape[0], overall)
    for a in range(pair.shape[0]):
        mine = ratio[a][ok[a]]
        if len(mine):
            out[a] = float(np.median(mine))
    return out


def colocated_rates(
    pair: NDArray[np.float64], alone: NDArray[np.float64], ratio: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Pair rates with missing entries modelled, and which entries were measured.

    Args:
        pair: ``(n_types, n_types, n_classes)`` measured pair rates, NaN = no entry.
        alone: ``(n_types, n_classes)`` single-GPU alone rates on the same classes.
        ratio: ``(n_types,)`` from `median_colocation_ratio`.

    Returns:
        ``(rates, measured)``: `rates` equals `pair` where measured and
        ``alone[a, c] * ratio[a]`` where not (NaN where `alone` is NaN);
        `measured` is True where the table had the entry.
    """
    measured = np.isfinite(pair)
    modelled = np.broadcast_to((alone * ratio[:, None])[:, None, :], pair.shape)
    rates: NDArray[np.float64] = np.where(measured, pair, modelled)
    return rates, measured
