"""Held-out figures for what `train` fits, computed on in-memory models before export.

Everything here takes a `RowPredictor` (throughput quantiles for outcome
feature rows) or a `Policy`, so it runs the same on the scikit-learn models
during training and on the loaded ONNX artifacts afterwards; it imports no
build-time library.

- `predictor_figures`: pinball loss and 80% coverage on held-out logged rows,
  for log throughput and log run time, against the per-(job type, class)
  baselines of `service.learning.quality`. Run-time quantiles are
  ``work / throughput`` quantiles (the service's ``completion_time_q*``
  minus queueing, which a placement cannot change).
- `counterfactual_coverage`: the same interval checked on *every* feasible
  option of held-out contexts — the options production did not choose, which
  are the ones a planner acts on — against the simulator's forked rollouts.
- `pessimism_figures`: how the planner's choices and per-decision value move
  as its pessimism (equivalently, the predictor's interval width) grows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.environment import ContextPool
from service.learning.logs import LoggedRows
from service.learning.pooled import decide_on_pool, pool_batch
from service.learning.quality import GroupBaseline, coverage, quality_figures
from service.policies.base import Policy, PolicyDecisions, ScoringBatch
from service.policies.outcome_features import OUTCOME_FEATURES
from service.policies.planner import LcbPlanner, RowPredictor
from service.policies.probabilities import ProbabilityRule, decide_from_scores


def log_quantiles(predictor: RowPredictor, x: NDArray[np.float32]) -> NDArray[np.float64]:
    """Log throughput quantiles ``(n, 3)``."""
    out: NDArray[np.float64] = np.log(predictor.predict_rows(x).astype(np.float64))
    return out


def predictor_figures(
    predictor: RowPredictor, train: LoggedRows, test: LoggedRows
) -> dict[str, Any]:
    """Held-out quality for throughput and run time (see the module docstring)."""
    q = log_quantiles(predictor, test.outcome_x)
    out: dict[str, Any] = {}
    for target, y_train, y_test, q_test in (
        ("log_throughput", train.log_throughput, test.log_throughput, q),
        (
            "log_run_time",
            np.log(train.run_time),
            np.log(test.run_time),
            np.log(test.work_units)[:, None] - q[:, ::-1],
        ),
    ):
        baselines = [
            GroupBaseline.fit(train.job_type, train.hardware, y_train, s)
            for s in ("mean", "quantiles")
        ]
        out[target] = quality_figures(y_test, q_test, baselines, test.job_type, test.hardware)
    return out


def counterfactual_coverage(predictor: RowPredictor, pool: ContextPool) -> dict[str, Any]:
    """80% interval coverage of throughput over every (context, feasible option, world)."""
    batch = pool_batch(pool)
    q = log_quantiles(predictor, OUTCOME_FEATURES(pool.requests))
    ys, los, his, chosen = [], [], [], []
    for t in range(pool.n):
        start = int(batch.offsets[t])
        for a in np.flatnonzero(pool.mask[t, : pool.n_options[t]]):
            y = np.log(pool.outcomes[t, a, :, 1])
            ys.append(y)
            los.append(np.full(len(y), q[start + a, 0]))
            his.append(np.full(len(y), q[start + a, 2]))
            chosen.append(np.full(len(y), a == pool.logged_action[t]))
    y_all, lo, hi = np.concatenate(ys), np.concatenate(los), np.concatenate(his)
    was_chosen = np.concatenate(chosen)
    return {
        "entries": len(y_all),
        "coverage_all_feasible_options": round(coverage(y_all, lo, hi), 4),
        "coverage_options_production_chose": round(
            coverage(y_all[was_chosen], lo[was_chosen], hi[was_chosen]), 4
        ),
        "coverage_options_production_did_not_choose": round(
            coverage(y_all[~was_chosen], lo[~was_chosen], hi[~was_chosen]), 4
        ),
    }


def pessimism_figures(
    planner: LcbPlanner, pool: ContextPool, pessimisms: Sequence[float]
) -> dict[str, Any]:
    """Choices and per-decision truth of the planner at each pessimism, on `pool`'s contexts.

    ``changed_vs_first`` is the share of contexts where the choice differs
    from the first pessimism's (0 = plan on the median).
    """
    production = pool.truth(pool.logging_probabilities).value
    first: NDArray[np.int64] | None = None
    rows = []
    for k in pessimisms:
        d = decide_on_pool(planner.with_planning(f"{planner.name}-k{k}", pessimism=k), pool)
        if first is None:
            first = d.chosen
        truth = pool.truth(d.action_dist).value
        rows.append(
            {
                "pessimism": k,
                "changed_vs_first": round(float((d.chosen != first).mean()), 4),
                "per_decision_value": round(truth.value, 4),
                "monte_carlo_se": round(truth.se, 4),
            }
        )
    return {
        "contexts": pool.n,
        "production_per_decision_value": round(production.value, 4),
        "by_pessimism": rows,
    }


def policy_value(policy: Policy, pool: ContextPool) -> dict[str, Any]:
    """Per-decision truth of `policy` and of production on `pool`'s contexts."""
    d = decide_on_pool(policy, pool)
    truth = pool.truth(d.action_dist).value
    production = pool.truth(pool.logging_probabilities).value
    return {
        "contexts": pool.n,
        "per_decision_value": round(truth.value, 4),
        "production_per_decision_value": round(production.value, 4),
        "monte_carlo_se": round(truth.se, 4),
        "raw_favourite_infeasible": d.raw_favourite_infeasible,
    }


class ScoreFnPolicy:
    """A policy from an in-memory score function over contract rows (an unexported model)."""

    def __init__(
        self,
        name: str,
        score: Callable[[NDArray[np.float32]], NDArray[np.float32]],
        rule: ProbabilityRule,
    ) -> None:
        self._name = name
        self._score = score
        self._rule = rule

    @property
    def name(self) -> str:
        """Name used in errors and figures."""
        return self._name

    @property
    def version(self) -> str:
        """In-memory: no artifact version."""
        return "in-memory"

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        """Score every row, then the rule."""
        return decide_from_scores(self._name, self._score(batch.features), batch, self._rule, rng)
