"""What the evaluator feeds a monitor: batches of rounds and decisions, as numpy arrays.

The service's feed (``service.pipeline.evaluator_feed``) builds these from the
decision log; the statistical tests build them from the simulator's
vectorised datasets; the monitor cannot tell the two apart. Shapes: ``n``
rounds in the batch, ``A`` action columns (the request's options, padded to
the most options in the batch, then one column for DEFER, always the last),
``F`` option features.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.contract import InvalidInput


@dataclass(frozen=True, eq=False)
class JoinedRounds:
    """Rounds with production's decision and a joined outcome: what off-policy metrics read.

    Attributes:
        reward: float64 ``(n,)``, the protocol's reward of the logged outcome (NaN:
            a weighed field was not observed; the round is left out of reward).
        cost: float64 ``(n,)``, the protocol's cost of the logged action.
        action: int64 ``(n,)``, production's action column (DEFER = ``A - 1``).
        pscore: float64 ``(n,)``, production's propensity (NaN: missing).
        target: float64 ``(n, A)``, the candidate's distribution; rows of zeros
            where the candidate has no usable decision (left out).
        baseline_target: float64 ``(n, A)`` or None, a named baseline's distribution.
        features: float32 ``(n, A - 1, F)`` or None, option features for the
            reward model (None: a constant model).
        known_cost: float64 ``(n, A)`` or None, the cost each action would incur
            from constraint signals alone (known before the outcome).
        production_infeasible: bool ``(n,)`` or None, production's choice was infeasible.
    """

    reward: NDArray[np.float64]
    cost: NDArray[np.float64]
    action: NDArray[np.int64]
    pscore: NDArray[np.float64]
    target: NDArray[np.float64]
    baseline_target: NDArray[np.float64] | None = None
    features: NDArray[np.float32] | None = None
    known_cost: NDArray[np.float64] | None = None
    production_infeasible: NDArray[np.bool_] | None = None

    def __post_init__(self) -> None:
        n = len(self.reward)
        for name in ("cost", "action", "pscore", "target"):
            if len(getattr(self, name)) != n:
                raise InvalidInput(
                    name, f"must have one entry per round ({n}), got {len(getattr(self, name))}"
                )
        if self.target.ndim != 2:
            raise InvalidInput("target", f"must be (n, A), got shape {self.target.shape}")
        a = self.target.shape[1]
        if n and (self.action.min() < 0 or self.action.max() >= a):
            raise InvalidInput("action", f"must be in [0, {a}), got {self.action.max()}")
        for name in ("baseline_target", "known_cost"):
            v = getattr(self, name)
            if v is not None and v.shape != self.target.shape:
                raise InvalidInput(
                    name, f"must have the shape of `target` {self.target.shape}, got {v.shape}"
                )
        if self.features is not None and self.features.shape[:2] != (n, a - 1):
            raise InvalidInput(
                "features", f"must be (n, A - 1, F) = ({n}, {a - 1}, F), got {self.features.shape}"
            )

    @property
    def n(self) -> int:
        """Rounds in the batch."""
        return len(self.reward)


@dataclass(frozen=True, eq=False)
class Decisions:
    """One policy's decisions on a batch of requests: what rate and latency metrics read.

    Attributes:
        error: bool ``(n,)``, status `error`.
        timeout: bool ``(n,)``, status `timeout`.
        raw_favourite_infeasible: bool ``(n,)``.
        latency_ms: float64 ``(n,)``, scoring time per request.
    """

    error: NDArray[np.bool_]
    timeout: NDArray[np.bool_]
    raw_favourite_infeasible: NDArray[np.bool_]
    latency_ms: NDArray[np.float64]

    @property
    def n(self) -> int:
        """Decisions in the batch."""
        return len(self.error)

    @staticmethod
    def empty() -> Decisions:
        """No decisions."""
        no = np.zeros(0, dtype=bool)
        return Decisions(no, no, no, np.zeros(0))


@dataclass(frozen=True, slots=True)
class QualityCounts:
    """Counts behind the data-quality metrics, as of now (not increments).

    Attributes:
        requests_due: experiment requests old enough that their outcome should be in.
        joined_due: of those, how many have a joined outcome.
        production_decisions: experiment requests with production's decision known.
        missing_propensity: of those, how many lack a propensity.
        mirrored: accepted mirrors over the experiment (None: not known).
        runtime_requests: requests Runtime reports over the experiment (None: not reported).
    """

    requests_due: int = 0
    joined_due: int = 0
    production_decisions: int = 0
    missing_propensity: int = 0
    mirrored: int | None = None
    runtime_requests: int | None = None
