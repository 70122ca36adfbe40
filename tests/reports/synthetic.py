"""Small decision logs built in memory, with a known truth, for the report's unit tests."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from service.storage.reads.ope import OpeLog, PolicyLog

KINDS = ("train", "infer")


def policy_log(
    probabilities: list[NDArray[np.float64] | None],
    defer: list[float],
    status: list[str] | None = None,
) -> PolicyLog:
    n = len(probabilities)
    return PolicyLog(
        status=status or ["ok"] * n,
        probabilities=probabilities,
        defer_probability=np.array(defer, dtype=np.float64),
        raw_favourite_infeasible=np.zeros(n, dtype=bool),
    )


def opelog(
    *,
    n_options: list[int],
    production_option: list[int],
    production_propensity: list[float],
    slo_met: list[float],
    policies: dict[tuple[str, str], PolicyLog],
) -> OpeLog:
    n = len(n_options)
    text = np.array([KINDS[i % 2] for i in range(n)], dtype=np.str_)
    return OpeLog(
        request_id=np.array([f"r{i}" for i in range(n)], dtype=np.str_),
        received_at=np.arange(n, dtype=np.float64),
        n_options=np.array(n_options, dtype=np.int64),
        workload_kind=text,
        tenant=np.full(n, "t", dtype=np.str_),
        model_family=np.full(n, "m", dtype=np.str_),
        production_option=np.array(production_option, dtype=np.int64),
        production_propensity=np.array(production_propensity, dtype=np.float64),
        queue_delay_s=np.zeros(n),
        throughput=np.ones(n),
        completion_time_s=np.full(n, 3600.0),
        slo_met=np.array(slo_met, dtype=np.float64),
        failure=np.full(n, "none", dtype=np.str_),
        policies=policies,
    )


def bandit_log(n: int, seed: int, *, deterministic_production: bool = False) -> OpeLog:
    """Three options + DEFER; production uniform over all four (or always option 0).

    SLO met with probability (0.3, 0.6, 0.9) by option, 0.1 when deferred.
    `best@1` always takes option 2 (truth 0.9); `mixed@1` puts 0.5 on option 1
    and 0.5 on DEFER (truth 0.35).
    """
    rng = np.random.default_rng(seed)
    means = np.array([0.3, 0.6, 0.9, 0.1])
    if deterministic_production:
        action = np.zeros(n, dtype=np.int64)
        pscore = np.ones(n)
    else:
        action = rng.integers(0, 4, n)
        pscore = np.full(n, 1 / 4)
    slo = (rng.random(n) < means[action]).astype(np.float64)
    best = [np.array([0.0, 0.0, 1.0]) for _ in range(n)]
    mixed = [np.array([0.0, 0.5, 0.0]) for _ in range(n)]
    return opelog(
        n_options=[3] * n,
        production_option=np.where(action == 3, -1, action).tolist(),
        production_propensity=pscore.tolist(),
        slo_met=slo.tolist(),
        policies={
            ("best", "1"): policy_log(list(best), [0.0] * n),
            ("mixed", "1"): policy_log(list(mixed), [0.5] * n),
        },
    )
