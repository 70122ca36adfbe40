"""Fit the demonstration scoring policy: a small MLP over contract feature rows.

What it is, plainly: not a policy learned from outcomes but a distillation.
On the simulator's training traffic (`simulated_batch`: every request of
scenario ``train``, the episodes `understudy train` fits the learned
candidates on), each option gets a target

    t = z - mean_request(z) - 0.5 * utilisation - 0.25 * queue_length

where ``z`` is the Gavel predictor's log median throughput for the option,
centred per request (only differences within a request matter to a softmax),
and ``utilisation`` / ``queue_length`` are the contract feature columns (a
busy node is penalised). A `StandardScaler` + `MLPRegressor` (32, 16) then
learns ``t`` from the contract features alone. Those features do not name
the job type (batch size is absent), so the MLP can only approximate the
predictor's ranking; the build reports how well (R^2, and how often its best
feasible option is the target's best) on requests it did not train on
(another seed of the same scenario).

Why the simulator's traffic and not `service.policies.synthetic`'s random
clusters (its training set until issue 23): a policy's drift reference is
its training data, and the traffic the demo and `compare` send it is the
simulator's. Fitted on random clusters with no share requests, per-server
queues and uniformly drawn host use, it was flagged in every window of that
traffic (docs/drift.md); fitted on the simulator, the same traffic is in its
support, and it sees the gang shapes the simulator offers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from service.contract import FEATURE_NAMES
from service.learning.build_models.predictor_fit import QuantileModels
from service.policies.base import ScoringBatch
from service.policies.batching import make_batch
from service.policies.predictor_features import PREDICTOR_FEATURES
from service.policies.probabilities import first_argmax, segment_reduce
from service.policies.synthetic import random_requests

TRAINING_SCENARIO = "train"
TRAINING_EPISODES = 120
"""Episodes 0-119 of scenario ``train``: what `understudy train` fits the learned candidates on."""
HELD_OUT_EPISODES = 40

TARGET_FORMULA = "z - mean_request(z) - 0.5 utilisation - 0.25 queue_length"
_UTIL = FEATURE_NAMES.index("utilisation")
_QUEUE = FEATURE_NAMES.index("queue_length")


def synthetic_batch(seed: int, n_requests: int) -> ScoringBatch:
    """Synthetic requests on K80/P100/V100 clusters, as one batch (tests' random clusters)."""
    return make_batch(random_requests(seed, n_requests, n_nodes=32, max_options=24))


def simulated_batch(seed: int, episodes: range) -> ScoringBatch:
    """Every mirrored request (forced defers included) of `episodes` of scenario ``train``
    under `seed`, as one batch: the requests `understudy train` logs for the same settings."""
    from service.environment import simulated_episodes  # learning may run the simulator

    groups = simulated_episodes(TRAINING_SCENARIO, seed, episodes)
    return make_batch([r for requests, _ in groups for r in requests])


def target(batch: ScoringBatch, predictor: QuantileModels) -> NDArray[np.float64]:
    """The distillation target of the module docstring, one value per option row."""
    z = predictor.raw_log(PREDICTOR_FEATURES(batch.requests))[:, 1]
    counts = np.maximum(np.diff(batch.offsets), 1).astype(np.float64)
    mean = segment_reduce(np.add, z, batch.offsets, 0.0) / counts
    f = batch.features.astype(np.float64)
    return z - mean[batch.request_of_row] - 0.5 * f[:, _UTIL] - 0.25 * f[:, _QUEUE]


def fit_scorer(batch: ScoringBatch, y: NDArray[np.float64], seed: int) -> Pipeline:
    """Scaler + MLP fitted to `y` from the batch's contract features."""
    mlp = MLPRegressor(
        hidden_layer_sizes=(32, 16),
        alpha=1e-4,
        learning_rate_init=2e-3,
        batch_size=256,
        max_iter=400,
        early_stopping=True,
        n_iter_no_change=15,
        random_state=seed,
    )
    return Pipeline([("scale", StandardScaler()), ("mlp", mlp)]).fit(batch.features, y)


def evaluate_scorer(
    pipeline: Pipeline, batch: ScoringBatch, y: NDArray[np.float64]
) -> dict[str, Any]:
    """R^2 and best-feasible-option agreement on held-out requests (another seed)."""
    pred = np.asarray(pipeline.predict(batch.features), dtype=np.float64)
    r2 = 1.0 - float(np.sum((pred - y) ** 2) / np.sum((y - y.mean()) ** 2))
    best_pred = first_argmax(pred, batch.offsets, batch.mask)
    best_true = first_argmax(y, batch.offsets, batch.mask)
    has = best_true >= 0
    regret = y[best_true[has]] - y[best_pred[has]]
    return {
        "held_out_requests": batch.n_requests,
        "held_out_rows": len(y),
        "r2": round(r2, 4),
        "best_option_agreement": round(float((best_pred[has] == best_true[has]).mean()), 4),
        "mean_regret_target_units": round(float(regret.mean()), 4),
    }
