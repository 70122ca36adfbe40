"""Predictable outcome models for doubly-robust terms in a confidence sequence.

A confidence sequence over DR terms ``q_pi(x_t) + w_t (r_t - q(x_t, a_t))``
keeps its guarantee only if the model ``q`` used at round ``t`` was fixed
before round ``t`` was seen (a predictable sequence; Waudby-Smith et al.
2022, section 4). So both models here predict a batch from what earlier
batches taught them, and learn the batch only afterwards: `predict` first,
`learn` second.

- `LinearOutcomeModel`: ridge regression of the outcome on the option's
  features (plus an option intercept and a DEFER intercept), refit from the
  running sufficient statistics ``X'X`` and ``X'y`` after every batch;
  predictions are clipped to the outcome range seen so far. Before anything
  is learnt it predicts 0, so DR equals IPS on the first batch.
- `KnownPlusResidualModel`: for costs, the part known before the outcome
  (constraint signals of each action) plus the running mean of the rest
  (failures).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

RIDGE = 1.0
"""Ridge penalty on the summed squares; negligible once hundreds of rounds are in."""


def design(features: NDArray[np.float32]) -> NDArray[np.float64]:
    """Rows per action: ``[features, 1, 0]`` per option, ``[0, 0, 1]`` for DEFER.

    Args:
        features: ``(n, A - 1, F)`` option features.

    Returns:
        ``(n, A, F + 2)``.
    """
    n, k, f = features.shape
    x = np.zeros((n, k + 1, f + 2))
    x[:, :k, :f] = features
    x[:, :k, f] = 1.0
    x[:, k, f + 1] = 1.0
    return x


class LinearOutcomeModel:
    """Ridge regression on option features, predictable (module docstring)."""

    def __init__(self, n_features: int, ridge: float = RIDGE) -> None:
        p = n_features + 2
        self._xtx = np.zeros((p, p))
        self._xty = np.zeros(p)
        self._ridge = ridge
        self._beta: NDArray[np.float64] | None = None
        self.n = 0
        self.low, self.high = math.inf, -math.inf

    def predict(self, features: NDArray[np.float32]) -> NDArray[np.float64]:
        """``q(x_t, a)`` for every round and action, ``(n, A)``, from earlier batches only."""
        x = design(features)
        if self._beta is None:
            return np.zeros(x.shape[:2])
        q: NDArray[np.float64] = np.clip(x @ self._beta, self.low, self.high)
        return q

    def learn(
        self,
        features: NDArray[np.float32],
        action: NDArray[np.int64],
        outcome: NDArray[np.float64],
    ) -> None:
        """Add the batch's logged (action, outcome) pairs and refit."""
        if len(outcome) == 0:
            return
        x = design(features)[np.arange(len(action)), action]
        self._xtx += x.T @ x
        self._xty += x.T @ outcome
        self.n += len(outcome)
        self.low = min(self.low, float(outcome.min()))
        self.high = max(self.high, float(outcome.max()))
        penalty = self._ridge * np.eye(len(self._xty))
        beta = np.asarray(np.linalg.solve(self._xtx + penalty, self._xty), dtype=np.float64)
        self._beta = beta


class KnownPlusResidualModel:
    """``q(x, a) = known(x, a) + mean residual`` of earlier rounds (module docstring)."""

    def __init__(self) -> None:
        self._sum = 0.0
        self.n = 0

    def predict(self, known: NDArray[np.float64]) -> NDArray[np.float64]:
        """``(n, A)`` predictions from earlier batches only."""
        shift = self._sum / self.n if self.n else 0.0
        out: NDArray[np.float64] = known + shift
        return out

    def learn(
        self, known: NDArray[np.float64], action: NDArray[np.int64], outcome: NDArray[np.float64]
    ) -> None:
        """Add the batch's residuals ``outcome - known(x, a_t)``."""
        if len(outcome) == 0:
            return
        self._sum += float((outcome - known[np.arange(len(action)), action]).sum())
        self.n += len(outcome)


class MeanModel:
    """``q(x, a) = mean`` of earlier outcomes: the model when there are no features."""

    def __init__(self) -> None:
        self._sum = 0.0
        self.n = 0

    def predict(self, shape: tuple[int, int]) -> NDArray[np.float64]:
        """``(n, A)`` predictions from earlier batches only."""
        return np.full(shape, self._sum / self.n if self.n else 0.0)

    def learn(self, outcome: NDArray[np.float64]) -> None:
        """Add the batch's outcomes."""
        self._sum += float(outcome.sum())
        self.n += len(outcome)
