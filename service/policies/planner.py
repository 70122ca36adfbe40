"""A pessimistic planning policy: plan on a lower confidence bound of predicted throughput.

The policy asks its outcome predictor (quantiles of the throughput each
option would get, `outcome_features`) and scores every option by a lower
confidence bound in log space::

    lo, mid = log q10, log q50                 (q10 already conformally widened)
    score   = mid - pessimism * (mid - lo) - packing_weight * free_after

``pessimism = 0`` trusts the median; 1 plans on the 80% interval's lower end;
larger values extrapolate further. The point of pessimism is the classic one
for acting on a model fitted to logged data (e.g. Jin, Yang & Wang, "Is
Pessimism Provably Efficient for Offline RL?", ICML 2021): where the model
is unsure — sharing a GPU, a load it rarely saw — a fast-looking median must
beat a sure option by more than its uncertainty before it is chosen. Because
the score subtracts the interval's width, making the predictor's uncertainty
wider changes choices wherever options differ in width.

``free_after`` (contract feature 13, accelerators left free on the option's
nodes / their total) breaks near-ties toward the fuller node, as production's
best fit does, so small jobs do not fragment the cluster for later gangs.

The predictor's quantiles are attached to the decisions, so logged decisions
carry the prediction they were made on. Importing this module loads neither
onnxruntime nor scikit-learn: the predictor is passed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from service.contract import FEATURE_NAMES, MirrorRequest
from service.policies.base import PolicyDecisions, ScoringBatch
from service.policies.errors import PolicyScoringError
from service.policies.manifest import PlanningSpec
from service.policies.outcome_features import OUTCOME_FEATURES
from service.policies.predictor import with_completion_time
from service.policies.probabilities import ProbabilityRule, decide_from_scores

FREE_AFTER = FEATURE_NAMES.index("free_after")


class RowPredictor(Protocol):
    """Throughput quantiles ``(n, 3)`` (q10, q50, q90; positive, ordered) for feature rows."""

    def predict_rows(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        """Quantiles for rows `x` of the planner's feature function."""
        ...


@runtime_checkable
class BatchThroughput(Protocol):
    """A `RowPredictor` that also answers per batch, from its own (cached) result."""

    @property
    def features(self) -> Callable[[Sequence[MirrorRequest]], NDArray[np.float32]]:
        """The feature function its rows come from."""
        ...

    def throughput(self, batch: ScoringBatch) -> NDArray[np.float32]:
        """Throughput quantiles ``(n_options_total, 3)`` of `batch`."""
        ...


@runtime_checkable
class SharedPredictions(BatchThroughput, Protocol):
    """A `BatchThroughput` whose per-batch predictions may carry more (``out_of_support``)."""

    def predict(self, batch: ScoringBatch) -> dict[str, NDArray[np.float32]]:
        """Predictions per option row, named."""
        ...


class LcbPlanner:
    """Argmax (or any rule) over lower-confidence-bound scores of predicted throughput."""

    def __init__(
        self,
        name: str,
        version: str,
        predictor: RowPredictor,
        planning: PlanningSpec,
        rule: ProbabilityRule,
        features: Callable[[Sequence[MirrorRequest]], NDArray[np.float32]] = OUTCOME_FEATURES,
    ) -> None:
        self._name = name
        self._version = version
        self._predictor = predictor
        self._planning = planning
        self._rule = rule
        self._features = features

    @property
    def name(self) -> str:
        """Registry name."""
        return self._name

    @property
    def version(self) -> str:
        """Artifact version."""
        return self._version

    @property
    def planning(self) -> PlanningSpec:
        """Pessimism and packing weight in use."""
        return self._planning

    @property
    def predictor(self) -> RowPredictor:
        """The outcome predictor the planner scores with."""
        return self._predictor

    def with_planning(self, name: str, **changes: float) -> LcbPlanner:
        """A copy with other planning parameters (same model), e.g. ``pessimism=0``."""
        spec = dataclasses.replace(self._planning, **changes)
        return LcbPlanner(name, self._version, self._predictor, spec, self._rule, self._features)

    def quantiles(self, batch: ScoringBatch) -> NDArray[np.float32]:
        """The predictor's throughput quantiles per option row, ``(n_options_total, 3)``.

        A predictor that serves whole batches from the same feature function
        (`BatchThroughput`: the registry shares the outcome predictor's object
        when the planner's model is the same file) answers from its per-batch
        result, so a planner and the policies using that predictor run it once.
        """
        return self._quantiles_flagged(batch)[0]

    def _quantiles_flagged(
        self, batch: ScoringBatch
    ) -> tuple[NDArray[np.float32], NDArray[np.float32] | None]:
        """`quantiles` and, when the predictor says, which rows are out of its training
        support (None when it cannot say); the shared path's flag comes with its result."""
        if isinstance(self._predictor, BatchThroughput) and (
            self._predictor.features is self._features
        ):
            return self._predictor.throughput(batch), None  # flagged in `decide`
        x = self._features(batch.requests)
        if len(x) != len(batch.mask):
            raise PolicyScoringError(
                self._name,
                f"`batch.requests` describe {len(x)} options, the batch has {len(batch.mask)} rows",
            )
        flagged = getattr(self._predictor, "predict_rows_flagged", None)
        if len(x) == 0:
            return np.zeros((0, 3), dtype=np.float32), None
        if flagged is not None:
            q, flag = flagged(x)
            return q, flag
        return self._predictor.predict_rows(x), None

    def lcb_scores(self, batch: ScoringBatch, q: NDArray[np.float32]) -> NDArray[np.float32]:
        """The module docstring's score per option row, float32."""
        log_q = np.log(q.astype(np.float64))
        mid, width = log_q[:, 1], log_q[:, 1] - log_q[:, 0]
        free_after = batch.features[:, FREE_AFTER].astype(np.float64)
        p = self._planning
        return (mid - p.pessimism * width - p.packing_weight * free_after).astype(np.float32)

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        """Predict, score by the lower bound, apply the rule, attach the predictions."""
        q, out_of_support = self._quantiles_flagged(batch)
        scores = self.lcb_scores(batch, q)
        predictions = with_completion_time(batch, q)
        shared = self._predictor
        if isinstance(shared, SharedPredictions) and shared.features is self._features:
            # The shared predictor's own result also says which rows were out of support.
            predictions = {**predictions, **shared.predict(batch)}
        elif out_of_support is not None:  # the planner's own run of a model with a support
            predictions = {**predictions, "out_of_support": out_of_support}
        return decide_from_scores(self._name, scores, batch, self._rule, rng, predictions)
