"""Reward and cost: explicit, separate weight declarations. Never merged.

A protocol declares a `RewardSpec` over outcome fields and a `CostSpec` over
constraint signals and failure kinds. They are evaluated and reported apart,
so a policy cannot buy reward with safety: a cost guardrail is its own estimate.

    reward_i = sum_f  w_f * x_{i,f}                  (f in REWARD_FIELDS)
    cost_i   = sum_s  v_s * 1[signal s fired on the chosen option]
             + v_capacity * 1[any signal of CAPACITY_GROUP fired on it]
             + sum_k  u_k * 1[failure_i == k]

``capacity`` was one signal in feasibility-v1; v2 splits it into
accelerator_count, accelerator_share, accelerator_memory, cpu and memory.
Protocols written for v1 keep their meaning: ``capacity`` is accepted as a
group weight, applied once per option when any of accelerator_count,
accelerator_share, cpu or memory fired (v1's capacity never covered
accelerator memory, which had and has its own signal).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
from numpy.typing import NDArray

from service.contract.errors import InvalidInput
from service.contract.feasibility import CAPACITY, CAPACITY_GROUP, SIGNALS
from service.contract.outcome import FailureKind

REWARD_FIELDS: tuple[str, ...] = ("queue_delay_s", "throughput", "completion_time_s", "slo_met")
"""Outcome fields a reward may weigh; a missing value makes that round's reward NaN."""


def _check_weights(where: str, weights: Mapping[str, float], allowed: tuple[str, ...]) -> None:
    for name, weight in weights.items():
        if name not in allowed:
            raise InvalidInput(f"{where}.{name}", f"is not one of {', '.join(allowed)}")
        if not np.isfinite(weight):
            raise InvalidInput(f"{where}.{name}", f"must be finite, got {weight}")


@dataclass(frozen=True)
class RewardSpec:
    """Weights over outcome fields, e.g. ``{"slo_met": 1.0, "queue_delay_s": -0.001}``."""

    weights: Mapping[str, float]

    def __post_init__(self) -> None:
        if not self.weights:
            raise InvalidInput("reward.weights", "must weigh at least one outcome field")
        _check_weights("reward.weights", self.weights, REWARD_FIELDS)
        object.__setattr__(self, "weights", MappingProxyType(dict(self.weights)))

    def evaluate(self, columns: Mapping[str, NDArray[np.float64]]) -> NDArray[np.float64]:
        """Reward per round from outcome columns (each shape ``(n,)``, NaN = missing)."""
        n = len(next(iter(columns.values()))) if columns else 0
        reward = np.zeros(n, dtype=np.float64)
        for name, weight in self.weights.items():
            if name not in columns:
                raise InvalidInput(f"outcomes.{name}", "is weighed by the reward but missing")
            reward += weight * np.asarray(columns[name], dtype=np.float64)
        return reward


COST_SIGNALS: tuple[str, ...] = (*(s.value for s in SIGNALS), CAPACITY)
"""Names a cost spec may weigh: every signal, plus the ``capacity`` group."""

_GROUP_COLUMNS = np.array([SIGNALS.index(s) for s in CAPACITY_GROUP], dtype=np.int64)


@dataclass(frozen=True)
class CostSpec:
    """Weights over constraint signals and failure kinds (non-negative by convention).

    ``signal_weights`` names signals (`SIGNALS`) or the group ``capacity``
    (any of `CAPACITY_GROUP` fired, weighed once per option).
    """

    signal_weights: Mapping[str, float] = field(default_factory=dict)
    failure_weights: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_weights("cost.signal_weights", self.signal_weights, COST_SIGNALS)
        _check_weights(
            "cost.failure_weights", self.failure_weights, tuple(k.value for k in FailureKind)
        )
        object.__setattr__(self, "signal_weights", MappingProxyType(dict(self.signal_weights)))
        object.__setattr__(self, "failure_weights", MappingProxyType(dict(self.failure_weights)))

    def signal_cost(self, violations: NDArray[np.bool_]) -> NDArray[np.float64]:
        """Signal cost per option: ``violations`` ``(..., len(SIGNALS))`` -> shape ``(...)``.

        The weighted signals that fired, plus the ``capacity`` weight once when
        any signal of its group fired.
        """
        v = np.asarray(violations, dtype=bool)
        weights = np.array([self.signal_weights.get(s.value, 0.0) for s in SIGNALS])
        cost: NDArray[np.float64] = v.astype(np.float64) @ weights
        group = self.signal_weights.get(CAPACITY, 0.0)
        if group:
            cost = cost + group * v[..., _GROUP_COLUMNS].any(axis=-1)
        return cost

    def evaluate(
        self, violations: NDArray[np.bool_], failures: NDArray[np.str_] | list[str]
    ) -> NDArray[np.float64]:
        """Cost per round.

        Args:
            violations: bool, shape ``(n, len(SIGNALS))``, signals of the chosen option.
            failures: shape ``(n,)``, `FailureKind` values.
        """
        cost = self.signal_cost(np.asarray(violations, dtype=bool).reshape(-1, len(SIGNALS)))
        kinds = np.asarray(failures, dtype=str)
        for kind, weight in self.failure_weights.items():
            cost += weight * (kinds == kind)
        return cost
