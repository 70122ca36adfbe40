"""Issue 9 acceptance for drift, on simulator streams with fixed seeds.

The reference is the committed ``policies/iwr-scorer/training_summary.json``
(scenario ``train``, seed 0, episodes 0-119, every request). Training-condition
windows come from the same scenario under seed 1 (episodes never trained on);
held-out scenarios from seed 2. Windows are `WINDOW` consecutive requests,
the service's default (``drift_window_requests``), fed with their request times,
so the flag is the combined rule: features, novelty, or the arrival check.

Measured rates (every scenario, `NOT_MET` included): ``python -m
tests.ope.drift_fixtures``; docs/drift.md has the figures.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.settings import Settings
from tests.ope.drift_fixtures import shipped_summary, windows

WINDOW = Settings.model_fields["drift_window_requests"].default
TRAINING_WINDOWS = 100
SCENARIO_WINDOWS = 20
DETECTED = ("mix_shift", "new_class", "fragmented", "surge")
"""Held-out scenarios whose shift is in the requests the policies see (``surge``: in
their arrival times, caught by the arrival check; its load features alone flag 10%)."""
NOT_MET = ("degraded",)
"""Held-out scenarios input drift does not flag at >= 95% (docs/drift.md, "Limits"):
``degraded`` halves V100 speed while "nothing in a request shows it" (calibration
flags it, docs/calibration.md). Its rate is measured by ``python -m
tests.ope.drift_fixtures``, not asserted."""


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 400,000 simulated requests: ~7 min on one free core
def test_training_condition_windows_are_rarely_flagged() -> None:
    ws = windows(shipped_summary(), "train", seed=1, window=WINDOW, n_windows=TRAINING_WINDOWS)
    rate = float(np.mean([w.flagged for w in ws]))
    print(f"\ntrain (seed 1): {sum(w.flagged for w in ws)}/{len(ws)} windows flagged = {rate:.3f}")
    assert len(ws) >= 100
    assert not any(w.unseen_hardware or w.unseen_kinds for w in ws)
    assert all(np.isfinite(w.arrival_shift) for w in ws)  # the arrival check ran on each
    assert rate <= 0.05


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("scenario", DETECTED)
def test_held_out_scenarios_are_flagged(scenario: str) -> None:
    ws = windows(shipped_summary(), scenario, seed=2, window=WINDOW, n_windows=SCENARIO_WINDOWS)
    rate = float(np.mean([w.flagged for w in ws]))
    print(f"\n{scenario} (seed 2): {sum(w.flagged for w in ws)}/{len(ws)} flagged = {rate:.3f}")
    assert rate >= 0.95
    if scenario == "surge":  # faster arrivals: the gaps shrink
        assert np.mean([w.arrival_flagged and w.arrival_shift < 0 for w in ws]) >= 0.95
