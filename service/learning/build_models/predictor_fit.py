"""Fit the Gavel throughput predictor and measure it honestly.

Model: three gradient-boosted quantile regressors (q10, q50, q90) of
``log(throughput)``; logs because throughput spans four orders of magnitude
across job types and errors are multiplicative. Crossing quantiles are
ordered (``lo = min(q10, q50)``, ``hi = max(q90, q50)``), then the interval is
widened by a conformal offset ``c`` in log space: conformalized quantile
regression (Romano, Patterson & Candès, NeurIPS 2019), score
``E_i = max(lo_i - y_i, y_i - hi_i)``, ``c`` = the ``ceil((n + 1)(1 - α)) / n``
empirical quantile of the scores.

Held-out protocol ("held-out scales"): a group is one (job type, scale).
For each of the 19 job types Gavel measured at several scales, its four
scales are dealt at random to four folds, so every fold holds out exactly one
scale of every such job type; the 7 single-scale job types always train.
Per fold we fit on the rest and predict the held-out groups.

- Point error: mean |log pred - log y| (a typical multiplicative error) and
  mean absolute percentage error, against the baseline the issue names: the
  per-(job type, accelerator class) mean over the job type's *other* scales
  (geometric mean for the log error, arithmetic for the percentage error).
  Rows whose job type has no other scale on that class are not scored.
- Coverage, cross-conformal: fold f's intervals use ``c`` computed from the
  out-of-fold scores of the other three folds, then coverage is counted on f.
- The shipped model is fitted on all rows; its ``c`` comes from all
  out-of-fold scores (the CV+ idea, Barber et al., Ann. Statist. 2021).

Also reported, not an acceptance gate: leave-one-family-out error, against
the per-(class, scale, consolidation) geometric mean of the other families.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sklearn.ensemble import GradientBoostingRegressor

from service.learning.build_models.gavel import GavelTable, fastest_single_gpu_class
from service.learning.build_models.support import TrainingSupport, fit_support
from service.policies.predictor_features import PREDICTOR_FEATURE_NAMES

CONSOLIDATED = PREDICTOR_FEATURE_NAMES.index("consolidated")
CONFIG_COLUMNS = PREDICTOR_FEATURE_NAMES.index("log2_accelerators") + 1
"""Columns 0-12 name a configuration (job, capabilities, GPUs); the rest is its placement."""
"""The one-server column: the shape term is gated by ``1 - x[:, CONSOLIDATED]``."""


def tree_params(
    n_estimators: int, max_depth: int, learning_rate: float, min_samples_leaf: int
) -> dict[str, Any]:
    """The boosting hyper-parameters a config sets, as `GradientBoostingRegressor` keywords.

    One place for both configs (this one and `service.learning.fit.LearningConfig`);
    the key order is the order the manifests record.
    """
    return {
        "n_estimators": n_estimators,
        "max_depth": max_depth,
        "learning_rate": learning_rate,
        "min_samples_leaf": min_samples_leaf,
    }


@dataclass(frozen=True)
class PredictorConfig:
    """Hyper-parameters; the median model is deeper so it resolves 5% gaps between classes."""

    median: dict[str, Any] = field(default_factory=lambda: tree_params(300, 8, 0.2, 1))
    bounds: dict[str, Any] = field(default_factory=lambda: tree_params(200, 3, 0.1, 3))
    shape: dict[str, Any] = field(default_factory=lambda: tree_params(500, 8, 0.2, 1))
    coverage: float = 0.8
    n_folds: int = 4
    seed: int = 0


@dataclass
class QuantileModels:
    """The three fitted regressors, the conformal offset (log space) and the training support.

    `support` (None until `with_support`) widens and flags rows outside the
    training support (`service.learning.build_models.support`).
    """

    lo: GradientBoostingRegressor
    mid: GradientBoostingRegressor
    hi: GradientBoostingRegressor
    offset: float = 0.0
    support: TrainingSupport | None = None
    shape: GradientBoostingRegressor | None = None
    """Log gang-shape factor model, added to all three quantiles (None: no shape term)."""
    mask: NDArray[np.float32] | None = None
    """Multiplies the rows the quantile trees see (0 hides a column); None: all visible."""

    def raw_log(self, x: NDArray[np.float32]) -> NDArray[np.float64]:
        """Ordered log quantiles ``(n, 3)`` before the conformal offset."""
        xq = x if self.mask is None else x * self.mask
        lo, mid, hi = (
            np.asarray(m.predict(xq), dtype=np.float64) for m in (self.lo, self.mid, self.hi)
        )
        if self.shape is not None:
            spread = 1.0 - x[:, CONSOLIDATED].astype(np.float64)
            term = np.asarray(self.shape.predict(x), dtype=np.float64) * spread
            lo, mid, hi = lo + term, mid + term, hi + term
        return np.stack([np.minimum(lo, mid), mid, np.maximum(hi, mid)], axis=1)

    def offset_log(self, x: NDArray[np.float32]) -> NDArray[np.float64]:
        """Log quantiles ``(n, 3)`` with the conformal offset, before any support widening."""
        q = self.raw_log(x)
        q[:, 0] -= self.offset
        q[:, 2] += self.offset
        return q

    def out_of_support(self, x: NDArray[np.float32]) -> NDArray[np.bool_]:
        """Rows outside the training support (none when no support is set)."""
        if self.support is None:
            return np.zeros(len(x), dtype=bool)
        return self.support.outside(x)

    def predict(self, x: NDArray[np.float32]) -> NDArray[np.float64]:
        """Quantiles ``(n, 3)`` in steps/s, offset and support applied: what the ONNX graph
        computes."""
        q = self.offset_log(x)
        if self.support is not None:
            q = self.support.widen(q, self.support.outside(x))
        return np.exp(q)

    def with_support(self, x: NDArray[np.float32]) -> QuantileModels:
        """Set `support` from training rows `x` (call after the offset is final)."""
        self.support = fit_support(x, self.offset_log(x))
        return self


def fit_models(
    x: NDArray[np.float32],
    y: NDArray[np.float64],
    config: PredictorConfig,
    log_shape: NDArray[np.float64] | None = None,
) -> QuantileModels:
    """Fit q10, q50, q90 of log throughput ``y``.

    With `log_shape` (each row's known log gang-shape factor, `shape_rows`),
    a squared-error ensemble learns that factor from the features and the
    quantile trees learn ``y - log_shape``: the shape term is a deterministic
    multiplier of the data model, and quantile-loss trees fitted to the
    product left errors (~7% at the 90th percentile in sample) larger than
    the 2-6% differences between shapes they had to order. The shape term is
    fitted on multi-server rows and applied only to them (times ``1 -
    consolidated``), so a one-server row's prediction is the quantile trees'
    alone, as before shape rows existed. The quantile trees then see only the
    configuration columns (0-12; the rest is multiplied by `mask` = 0) and are
    fitted on the one-server rows: a shape row repeats its configuration's
    consolidated target, so fitting it too would only weigh 8-GPU
    configurations (43 rows each) above 1-GPU ones (1 row) and blur the gaps
    between classes that pick the fastest one.
    """
    mask = None
    xq, target = x, y
    if log_shape is not None:  # trees see the configuration only; one row per configuration
        mask = np.ones(x.shape[1], dtype=np.float32)
        mask[CONFIG_COLUMNS:] = 0.0
        one = x[:, CONSOLIDATED] >= 0.5
        xq, target = x[one] * mask, y[one] - log_shape[one]

    def fit(alpha: float, params: dict[str, Any]) -> GradientBoostingRegressor:
        model = GradientBoostingRegressor(
            loss="quantile", alpha=alpha, random_state=config.seed, **params
        )
        return model.fit(xq, target)

    shape = None
    if log_shape is not None:
        spread = x[:, CONSOLIDATED] < 0.5
        shape = GradientBoostingRegressor(
            loss="squared_error", random_state=config.seed, **config.shape
        ).fit(x[spread], log_shape[spread])
    return QuantileModels(
        fit(0.1, config.bounds),
        fit(0.5, config.median),
        fit(0.9, config.bounds),
        shape=shape,
        mask=mask,
    )


def out_of_fold(
    x: NDArray[np.float32],
    y: NDArray[np.float64],
    fold: NDArray[np.int64],
    config: PredictorConfig,
    log_shape: NDArray[np.float64] | None = None,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Out-of-fold raw log quantiles ``(n, 3)`` and their conformity scores ``(n,)``.

    The one quantile-fit routine of both builds (the Gavel predictor here, the
    outcome predictor in `service.learning.fit`): rows of fold ``f`` in
    ``range(config.n_folds)`` are predicted by `fit_models` on every other row,
    and scored ``E_i = max(lo_i - y_i, y_i - hi_i)`` (CQR). A row of any other
    fold (``-1``: never held out) keeps quantiles of zero and a NaN score.
    """
    pred = np.zeros((len(y), 3))
    for f in range(config.n_folds):
        test = fold == f
        shape = None if log_shape is None else log_shape[~test]
        pred[test] = fit_models(x[~test], y[~test], config, shape).raw_log(x[test])
    held = (fold >= 0) & (fold < config.n_folds)
    scores = np.where(held, np.maximum(pred[:, 0] - y, y - pred[:, 2]), np.nan)
    return pred, scores


def conformal_offset(scores: NDArray[np.float64], coverage: float) -> float:
    """The finite-sample conformal quantile of `scores` for `coverage`."""
    s = np.sort(scores)
    k = min(len(s), math.ceil((len(s) + 1) * coverage))
    return float(s[k - 1])


def scale_folds(table: GavelTable, seed: int, n_folds: int = 4) -> NDArray[np.int64]:
    """Fold per row; -1 for job types measured at one scale only (always trained on)."""
    rng = np.random.default_rng(seed)
    fold = np.full(len(table), -1, dtype=np.int64)
    for job in sorted(set(table.job_type[table.scale > 1].tolist())):
        scales = sorted(set(table.scale[table.job_type == job].tolist()))
        for s, f in zip(scales, rng.permutation(len(scales)) % n_folds, strict=True):
            fold[(table.job_type == job) & (table.scale == s)] = f
    return fold


def _baseline(table: GavelTable, train: NDArray[np.bool_], row: int) -> tuple[float, float] | None:
    """(geometric, arithmetic) mean of the row's job type and class over training rows."""
    same = train & (table.job_type == table.job_type[row]) & (table.hardware == table.hardware[row])
    if not same.any():
        return None
    values = table.throughput[same]
    return float(np.exp(np.log(values).mean())), float(values.mean())


def evaluate(
    table: GavelTable, config: PredictorConfig
) -> tuple[dict[str, Any], NDArray[np.float64]]:
    """Held-out-scale error, baseline, coverage; returns (figures, out-of-fold scores)."""
    x, y = table.features, np.log(table.throughput)
    fold = scale_folds(table, config.seed, config.n_folds)
    pred, scores = out_of_fold(x, y, fold, config, table.log_shape_factor)
    held = fold >= 0
    covered = np.zeros(len(table), dtype=bool)
    for f in range(config.n_folds):
        c = conformal_offset(scores[held & (fold != f)], config.coverage)
        test = fold == f
        covered[test] = (y[test] >= pred[test, 0] - c) & (y[test] <= pred[test, 2] + c)
    err_log, base_log, err_pct, base_pct = [], [], [], []
    for row in np.flatnonzero(held):
        base = _baseline(table, ~(fold == fold[row]), int(row))
        if base is None:
            continue
        truth = table.throughput[row]
        err_log.append(abs(pred[row, 1] - y[row]))
        base_log.append(abs(math.log(base[0]) - y[row]))
        err_pct.append(abs(math.exp(pred[row, 1]) - truth) / truth)
        base_pct.append(abs(base[1] - truth) / truth)
    per_scale = {
        int(s): round(float(covered[held & (table.scale == s)].mean()), 4)
        for s in sorted(set(table.scale[held].tolist()))
    }
    figures = {
        "protocol": "held-out scales: each fold holds out one scale of every multi-scale job type",
        "held_out_rows": int(held.sum()),
        "scored_rows": len(err_log),
        "mean_abs_log_error": round(float(np.mean(err_log)), 4),
        "baseline_mean_abs_log_error": round(float(np.mean(base_log)), 4),
        "mape": round(float(np.mean(err_pct)), 4),
        "baseline_mape": round(float(np.mean(base_pct)), 4),
        "baseline": "per-(job type, accelerator class) mean over the job type's other scales",
        "interval_nominal": config.coverage,
        "interval_coverage": round(float(covered[held].mean()), 4),
        "interval_coverage_by_scale": per_scale,
        "interval_coverage_without_conformal": round(
            float(((y >= pred[:, 0]) & (y <= pred[:, 2]))[held].mean()), 4
        ),
    }
    return figures, scores[held]


def leave_one_family_out(table: GavelTable, config: PredictorConfig) -> dict[str, Any]:
    """Median-model error on each family never seen in training, vs a class/scale mean."""
    x, y = table.features, np.log(table.throughput)
    out: dict[str, Any] = {}
    for family in sorted(set(table.family.tolist())):
        test = table.family == family
        mid = GradientBoostingRegressor(
            loss="quantile", alpha=0.5, random_state=config.seed, **config.median
        ).fit(x[~test], y[~test])
        err = np.abs(np.asarray(mid.predict(x[test])) - y[test])
        base = []
        for row in np.flatnonzero(test):
            same = (
                ~test
                & (table.hardware == table.hardware[row])
                & (table.scale == table.scale[row])
                & (table.consolidated == table.consolidated[row])
            )
            base.append(abs(y[same].mean() - y[row]) if same.any() else np.nan)
        out[family] = {
            "rows": int(test.sum()),
            "mean_abs_log_error": round(float(err.mean()), 4),
            "baseline_mean_abs_log_error": round(float(np.nanmean(base)), 4),
        }
    return out


def greedy_agreement(table: GavelTable, models: QuantileModels) -> dict[str, Any]:
    """Per single-GPU job type: does the q50 argmax class equal the measured fastest?"""
    fastest = fastest_single_gpu_class(table)
    mid = models.raw_log(table.features)[:, 1]
    misses = []
    for job, best in fastest.items():
        rows = np.flatnonzero((table.job_type == job) & (table.scale == 1))
        if str(table.hardware[rows[int(np.argmax(mid[rows]))]]) != best:
            misses.append(job)
    return {"job_types": len(fastest), "misses": misses}


def support_figures(models: QuantileModels) -> dict[str, Any]:
    """The support rule's numbers, for the manifest's evaluation block."""
    support = models.support
    if support is None:
        return {}
    return {
        "rule": "outside = configuration (cols 0-12) unseen in training or any column outside"
        " its training range; then each half-width >= the widest on any training row",
        "cells": len(support.cells),
        "half_width_lo_log": round(support.half_width_lo, 6),
        "half_width_hi_log": round(support.half_width_hi, 6),
    }


def fit_predictor(
    table: GavelTable, config: PredictorConfig
) -> tuple[QuantileModels, dict[str, Any]]:
    """Evaluate, then fit on every row with the out-of-fold conformal offset."""
    figures, scores = evaluate(table, config)
    models = fit_models(table.features, np.log(table.throughput), config, table.log_shape_factor)
    models.offset = conformal_offset(scores, config.coverage)
    models.with_support(table.features)
    figures["conformal_offset_log"] = round(models.offset, 6)
    figures["support"] = support_figures(models)
    figures["in_sample_fastest_class"] = greedy_agreement(table, models)
    return models, figures
