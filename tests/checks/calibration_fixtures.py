"""Simulator logs scored by the committed learned predictor, for the calibration tests.

`predicted_windows` runs the simulator's production emulator (the outcomes
are the simulator's: ground truth, not a model), scores the option production
chose with the committed ONNX ``learned-outcome`` predictor exactly as the
service would (the predictor's own feature function), and cuts the rows into
consecutive windows of `episodes_per_window` episodes — a window is what the
live monitor sees: a stretch of joined outcomes.

`shrunk` is the deliberate mis-calibration: every interval shrunk by half
around the predicted median in log space (``q'_tau = q50 * (q_tau / q50)^0.5``),
an over-confident predictor with the same point forecast.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from service.environment import World, load_scenario, log_episode
from service.learning.logs import collect
from service.policies.base import ScoringBatch
from service.policies.predictor import QUANTILE_LEVELS, THROUGHPUT_NAMES
from service.policies.registry import load_registry

POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"
TAUS = QUANTILE_LEVELS
PREDICTOR = "learned-outcome"


@dataclass(frozen=True, eq=False)
class Windows:
    """Rows of a simulated log with the predictor's quantiles; `window` ``(n,)`` groups them."""

    scenario: str
    quantiles: NDArray[np.float64]
    throughput: NDArray[np.float64]
    window: NDArray[np.int64]
    hardware: NDArray[np.str_]

    @property
    def n_windows(self) -> int:
        return int(self.window.max()) + 1


@cache
def _predictor() -> object:
    registry = load_registry(POLICIES_DIR, include_baselines=False)
    return registry.predictors[PREDICTOR]


def predicted_windows(
    scenario: str, seed: int, n_windows: int, episodes_per_window: int = 2
) -> Windows:
    """`n_windows` windows of `scenario` under `seed`, the predictor's quantiles per row."""
    rows = collect(
        World(load_scenario(scenario)), seed=seed, episodes=range(n_windows * episodes_per_window)
    )
    predictor = _predictor()
    q = predictor.predict_rows(rows.outcome_x).astype(np.float64)  # type: ignore[attr-defined]
    return Windows(
        scenario=scenario,
        quantiles=q,
        throughput=rows.throughput,
        window=rows.episode // episodes_per_window,
        hardware=rows.hardware,
    )


def shrunk(quantiles: NDArray[np.float64], factor: float = 0.5) -> NDArray[np.float64]:
    """Every quantile pulled toward the median by `factor` in log space (module docstring)."""
    median = quantiles[:, [1]]
    out: NDArray[np.float64] = median * (quantiles / median) ** factor
    return out


def gavel_windows(
    scenario: str, seed: int, n_windows: int, episodes_per_window: int = 6
) -> Windows:
    """Like `predicted_windows`, scored by the ``gavel-throughput`` predictor on whole batches.

    The Gavel predictor reads the contract requests (its own feature function),
    so each episode's decisions are scored as one `ScoringBatch`, as the
    scorer would, and the row of production's option is kept.
    """
    world = World(load_scenario(scenario))
    registry = load_registry(POLICIES_DIR, include_baselines=False)
    predictor = registry.predictors["gavel-throughput"]
    quantiles, throughput, window, hardware = [], [], [], []
    for e in range(n_windows * episodes_per_window):
        log = log_episode(world, seed, e)
        done = log.job_outcomes()
        row_of_job = {int(j): i for i, j in enumerate(done.job)}
        ds = log.decisions
        sizes = [len(d.features) for d in ds]
        batch = ScoringBatch(
            features=np.concatenate([d.features for d in ds]),
            offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
            mask=np.concatenate([d.mask for d in ds]),
            requests=[d.request for d in ds],
        )
        p = predictor.predict(batch)
        for k, d in enumerate(ds):
            r = int(batch.offsets[k]) + d.chosen
            quantiles.append([float(p[name][r]) for name in THROUGHPUT_NAMES])
            throughput.append(float(done.throughput[row_of_job[d.job]]))
            window.append(e // episodes_per_window)
            nodes = d.request.options.nodes_of(d.chosen)
            hardware.append(d.request.state.hardware_of(int(nodes[0])).name)
    return Windows(
        scenario=scenario,
        quantiles=np.array(quantiles, dtype=np.float64),
        throughput=np.array(throughput, dtype=np.float64),
        window=np.array(window, dtype=np.int64),
        hardware=np.array(hardware, dtype=np.str_),
    )
