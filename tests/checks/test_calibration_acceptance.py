"""Issue 9 acceptance: a mis-calibrated predictor is flagged in >= 95% of windows, a
calibrated one in <= 5% — the committed learned predictor on simulator ground truth.

Windows are 6 consecutive episodes of production logs (360 joined outcomes)
on seeds training never touched (training used seed 0, its held-out figures
seed 1). The calibrated case is the committed ``learned-outcome`` ONNX
predictor on its training condition (``train``); the mis-calibrated one is
the same predictor with every interval shrunk by half (`shrunk`). Finding:
the real predictor is not calibrated under the ``degraded`` scenario (a
hidden V100 slowdown, docs/learning.md), and the rule flags it there too.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.checks import calibration as cal
from tests.checks.calibration_fixtures import (
    TAUS,
    Windows,
    gavel_windows,
    predicted_windows,
    shrunk,
)

EPISODES_PER_WINDOW = 6


def flag_rate(w: Windows, quantiles: np.ndarray) -> float:
    flags = [
        cal.flag_window(
            cal.pit(TAUS, quantiles[w.window == k], w.throughput[w.window == k]), TAUS
        ).flagged
        for k in range(w.n_windows)
    ]
    return float(np.mean(flags))


@pytest.mark.slow
def test_calibrated_predictor_rarely_flagged_and_shrunk_one_almost_always() -> None:
    w = predicted_windows("train", seed=300, n_windows=50, episodes_per_window=EPISODES_PER_WINDOW)
    assert w.n_windows == 50 and len(w.throughput) == 50 * EPISODES_PER_WINDOW * 60
    assert flag_rate(w, w.quantiles) <= 0.05
    assert flag_rate(w, shrunk(w.quantiles)) >= 0.95


@pytest.mark.slow
def test_the_real_predictor_is_flagged_under_the_hidden_slowdown() -> None:
    w = predicted_windows(
        "degraded", seed=300, n_windows=20, episodes_per_window=EPISODES_PER_WINDOW
    )
    u = cal.pit(TAUS, w.quantiles, w.throughput)
    assert cal.coverage(u, 0.8, TAUS).observed < 0.6  # docs/learning.md: 46% on seed 2
    assert flag_rate(w, w.quantiles) >= 0.95


def test_calibrated_on_its_training_condition_in_one_window() -> None:
    """Fast version of the first test: one window of each."""
    w = predicted_windows("train", seed=301, n_windows=1, episodes_per_window=EPISODES_PER_WINDOW)
    u = cal.pit(TAUS, w.quantiles, w.throughput)
    assert not cal.flag_window(u, TAUS).flagged
    assert cal.flag_window(cal.pit(TAUS, shrunk(w.quantiles), w.throughput), TAUS).flagged


def test_gavel_predictor_is_not_calibrated_to_the_simulator() -> None:
    """Finding: the Gavel predictor (fitted on Gavel's measurements, not on the simulator's
    logs) is near its 80% coverage (83% on 1,800 outcomes, 85% on these 720: a little
    wide) but not at its quantiles on the simulator's training condition; the rule sees it."""
    w = gavel_windows("train", seed=300, n_windows=2)
    u = cal.pit(TAUS, w.quantiles, w.throughput)
    assert 0.75 <= cal.coverage(u, 0.8, TAUS).observed <= 0.90
    assert np.mean(u <= 0.5) > 0.58  # its median is too high
    assert flag_rate(w, w.quantiles) == 1.0
