"""Build time: fit the outcome predictor and the importance-weighted scorer (scikit-learn).

**Outcome predictor.** Three gradient-boosted quantile regressors (q10, q50,
q90) of log throughput over `OUTCOME_FEATURES` rows of the option production
chose — the same model class, out-of-fold fit (`out_of_fold`) and export path
as the Gavel predictor (`service.learning.build_models.predictor_fit`), fitted
on simulated logs instead of the isolated-throughput table. Its 80% interval is
conformalized (CQR, Romano, Patterson & Candès 2019) with an offset from
out-of-fold scores where the folds are whole *episodes* (rows of one episode share a cluster
history, so a row-wise split would calibrate on near-copies). The shipped
model is refitted on every row with that offset (the CV+ idea, Barber et al.
2021). An offset below zero is clipped to zero (the interval is never
narrowed below the raw quantiles, which keeps q10 <= q50 <= q90). Rows outside
the training support (a configuration the logs never held) get the widest
interval the model gives any training row, and are flagged
(`service.learning.build_models.support`): clipped to zero, the offset alone
left a zero-width interval there.

**Importance-weighted scorer (IWR).** A contextual-bandit policy learned
directly from logged feedback: regress the logged reward on the chosen
option's contract features with weights ``min(1 / propensity, clip)``, then
act greedily on the regression (Bietti, Agarwal & Langford, "A Contextual
Bandit Bake-off", JMLR 2021, where IWR is among the strongest methods). The
weights undo production's preference for tight fits, so options production
rarely picks still shape the fit; clipping bounds the variance that rare
propensities (down to ~0.002 here) would add. The contract features do not
name the job type, so the scorer ranks by hardware capabilities, load and
fit — which is exactly what it can be wrong about when the hardware changes.

Fitting is seeded and single-threaded (the caller holds ``threadpool_limits(1)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sklearn.ensemble import GradientBoostingRegressor

from service.learning.build_models.predictor_fit import (
    PredictorConfig,
    QuantileModels,
    conformal_offset,
    fit_models,
    out_of_fold,
    support_figures,
    tree_params,
)
from service.learning.logs import LoggedRows


@dataclass(frozen=True)
class LearningConfig:
    """Hyper-parameters of both models; recorded in the manifests."""

    median: dict[str, Any] = field(default_factory=lambda: tree_params(150, 4, 0.1, 20))
    bounds: dict[str, Any] = field(default_factory=lambda: tree_params(120, 3, 0.1, 20))
    coverage: float = 0.8
    n_folds: int = 3
    scorer: dict[str, Any] = field(default_factory=lambda: tree_params(150, 3, 0.1, 20))
    weight_clip: float = 20.0

    def predictor_config(self, seed: int) -> PredictorConfig:
        """The Gavel predictor's config type, with these trees."""
        return PredictorConfig(
            median=dict(self.median),
            bounds=dict(self.bounds),
            coverage=self.coverage,
            n_folds=self.n_folds,
            seed=seed,
        )


def episode_folds(episode: NDArray[np.int64], n_folds: int, seed: int) -> NDArray[np.int64]:
    """Fold per row: whole episodes dealt to folds in a seeded order."""
    unique = np.unique(episode)
    order = np.random.default_rng(seed).permutation(len(unique))
    fold_of = dict(zip(unique.tolist(), (order % n_folds).tolist(), strict=True))
    return np.array([fold_of[e] for e in episode.tolist()], dtype=np.int64)


def fit_outcome_predictor(
    rows: LoggedRows, config: LearningConfig, seed: int
) -> tuple[QuantileModels, dict[str, Any]]:
    """Out-of-fold conformal offset, then the model fitted on all rows with it."""
    pc = config.predictor_config(seed)
    x, y = rows.outcome_x, rows.log_throughput
    fold = episode_folds(rows.episode, config.n_folds, seed)
    pred, scores = out_of_fold(x, y, fold, pc)  # every row is in one of the folds
    models = fit_models(x, y, pc)
    # A negative offset would narrow the interval and could cross the median (the
    # exported graph orders the raw quantiles before the offset): keep it >= 0.
    raw_offset = conformal_offset(scores, config.coverage)
    models.offset = max(raw_offset, 0.0)
    models.with_support(x)
    figures = {
        "conformal_offset_log_unclipped": round(raw_offset, 6),
        "out_of_fold_coverage_before_conformal": round(
            float(((y >= pred[:, 0]) & (y <= pred[:, 2])).mean()), 4
        ),
        "conformal_offset_log": round(models.offset, 6),
        "folds": f"{config.n_folds} folds of whole episodes",
        "support": support_figures(models),
    }
    return models, figures


def iwr_weights(propensity: NDArray[np.float64], clip: float) -> NDArray[np.float64]:
    """``min(1 / p, clip)``, the clipped inverse-propensity weights."""
    out: NDArray[np.float64] = np.minimum(1.0 / propensity, clip)
    return out


def fit_iwr_scorer(
    rows: LoggedRows, config: LearningConfig, seed: int
) -> GradientBoostingRegressor:
    """Reward regression on chosen options' contract features, importance weighted."""
    model = GradientBoostingRegressor(loss="squared_error", random_state=seed, **config.scorer)
    weights = iwr_weights(rows.propensity, config.weight_clip)
    return model.fit(rows.contract_x, rows.reward, sample_weight=weights)
