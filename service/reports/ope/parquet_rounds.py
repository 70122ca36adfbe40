"""A scanned slice's batches judged as ``arrays.policy_rounds`` judges the live log's rounds.

Per batch: the reward (``Reward.of``), production's action column and
propensity at the slice's width (most options + DEFER), which rows start a
new round, and per policy version which of its rows are usable rounds with
their target rows and feasibility. ``parquet_ope`` folds these into sums.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from service.reports.ope.arrays import (
    SUM_TOLERANCE,
    USABLE_STATUSES,
    Reward,
    feasible_columns,
    logging_rows,
)
from service.reports.ope.parquet_source import Rows, open_slice, rows_of, scan
from service.storage.reads.ope import UNKNOWN_OPTION, OpeFilter, PolicyLog


@dataclass(frozen=True, eq=False)
class Usable:
    """One policy's rows of a batch.

    Attributes:
        rows: int64 indices of its rows in the batch.
        keep: bool, per row: a usable round (reward, production decision, target).
        target: float64 ``(len(rows), width)``, its distribution, zero where unusable.
        feasible: bool ``(len(rows), width)``.
    """

    rows: NDArray[np.int64]
    keep: NDArray[np.bool_]
    target: NDArray[np.float64]
    feasible: NDArray[np.bool_]


def _production(rows: Rows, width: int) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """``arrays.production_columns`` with the slice's width instead of the batch's."""
    log = rows.log
    known = log.production_option != UNKNOWN_OPTION
    in_range = known & (log.production_option < log.n_options)
    action = np.where(log.production_option >= 0, log.production_option, width - 1)
    action = np.where(in_range, action, width - 1).astype(np.int64)
    pscore = np.where(in_range, log.production_propensity, np.nan)
    return action, pscore


def target_matrix(rows: Rows, at: NDArray[np.int64], width: int) -> NDArray[np.float64]:
    """``arrays.target_rows`` for the rows `at`, vectorised over the Arrow list layout.

    Per row: its probabilities over the options, its defer probability (0 when
    not logged) last; a zero row when the status carries no distribution, the
    list does not have one value per option, or the row does not sum to 1 or has
    a negative entry.
    """
    k = rows.log.n_options[at]
    start = rows.offsets[at]
    lengths = rows.offsets[at + 1] - start
    ok = np.isin(rows.status[at], list(USABLE_STATUSES)) & (lengths == k)
    out = np.zeros((len(at), width))
    filled = np.flatnonzero(ok)
    counts = lengths[filled]
    line = np.repeat(filled, counts)
    column = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    out[line, column] = rows.values[np.repeat(start[filled], counts) + column]
    defer = rows.defer_probability[at]
    out[filled, -1] = np.where(np.isnan(defer), 0.0, defer)[filled]
    bad = (np.abs(out.sum(axis=1) - 1.0) > SUM_TOLERANCE) | (out < 0).any(axis=1)
    out[bad] = 0.0
    return out


def usable(rows: Rows, at: NDArray[np.int64], good: NDArray[np.bool_], width: int) -> Usable:
    """The policy's rows `at`: target and feasibility as ``policy_rounds`` builds them, and
    which are usable (`good`: reward and production decision known)."""
    n_options = rows.log.n_options[at]
    target = target_matrix(rows, at, width)
    statuses = PolicyLog(
        status=[str(s) for s in rows.status[at]],
        probabilities=[None] * len(at),  # feasible_columns reads the statuses only
        defer_probability=rows.defer_probability[at],
        raw_favourite_infeasible=rows.raw_favourite_infeasible[at],
    )
    feasible = feasible_columns(statuses, n_options, width)
    target[((target > 0) & ~feasible).any(axis=1)] = 0.0
    keep = good[at] & (target.sum(axis=1) > 0)
    return Usable(at, keep, target, feasible)


@dataclass(frozen=True, eq=False)
class Batch:
    """One scanned batch, judged (module docstring)."""

    rows: Rows
    reward: NDArray[np.float64]
    action: NDArray[np.int64]
    pscore: NDArray[np.float64]
    new_round: NDArray[np.bool_]
    by_policy: dict[tuple[str, str], Usable]
    logging: NDArray[np.float64] | None = None
    """Production's distribution per row at the slice's width (``arrays.logging_rows``)."""


def batches(
    root: Path,
    where: OpeFilter,
    reward: Reward,
    width: int,
    batch_rows: int,
    memory_limit: str | None = None,
) -> Iterator[Batch]:
    """The slice's batches, judged (``parquet_source.scan`` for the arguments)."""
    last = -1
    scanned = scan(open_slice(root), where, batch_rows=batch_rows, memory_limit=memory_limit)
    for record_batch in scanned:
        rows = rows_of(record_batch)
        r = reward.of(rows.log)
        action, pscore = _production(rows, width)
        good = ~np.isnan(r) & np.isfinite(pscore) & (pscore > 0) & (pscore <= 1)
        new_round = rows.seq != np.concatenate([[last], rows.seq[:-1]])
        last = int(rows.seq[-1]) if rows.n else last
        keys = sorted(set(zip(rows.policy.tolist(), rows.version.tolist(), strict=True)))
        by_policy = {
            k: usable(
                rows, np.flatnonzero((rows.policy == k[0]) & (rows.version == k[1])), good, width
            )
            for k in keys
        }
        logging = logging_rows(rows.log, action, pscore, width)
        yield Batch(rows, r, action, pscore, new_round, by_policy, logging)
