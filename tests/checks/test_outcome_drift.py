"""The outcome check (`service.checks.outcome_drift`) against the simulator's ground truth.

The simulator knows what changed: the ``degraded`` scenario multiplies every
V100 rate by 0.5 (``degrade: {V100: 0.5}``) and nothing else. The check must
find that shift on V100 (about ``ln 0.5``) and none on K80, flag such windows,
and stay quiet on training-condition episodes it was not calibrated on. All
on the committed ``policies/iwr-scorer/training_summary.json`` and on fresh
simulated episodes (seeds the summary never used).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from service.checks.outcome_drift import (
    MIN_CLASS_OUTCOMES,
    OutcomeRows,
    build_outcome_reference,
    calibrate_outcome,
    check_window,
    option_hardware,
    outcome_rows,
)
from service.environment import World, load_scenario, log_episode, simulated_episodes
from service.policies.outcome_summary import (
    OutcomeSummary,
    episode_rows,
    outcome_from_dict,
)
from tests.checks.drift_fixtures import shipped_summary


def _outcome_summary() -> OutcomeSummary:
    summary = shipped_summary()
    assert summary.outcome is not None, "iwr-scorer's summary has no outcome block"
    return summary.outcome


def _windows(rows: OutcomeRows, size: int) -> list[OutcomeRows]:
    return [rows.take(np.arange(s, s + size)) for s in range(0, len(rows) - size + 1, size)]


def test_rows_follow_productions_option_and_skip_what_has_no_throughput() -> None:
    world = World(load_scenario("train"))
    log = log_episode(world, seed=5, episode=0, mirror_before=True)  # option on the outcome
    requests, outcomes = list(log.requests), {o.request_id: o for o in log.outcomes}
    rows = outcome_rows(requests, outcomes)
    placed = [
        i
        for i, r in enumerate(requests)
        if (o := outcomes.get(r.request_id)) is not None
        and o.production is not None
        and o.production.option >= 0
        and (o.throughput or 0) > 0
    ]
    assert rows.request_index.tolist() == placed and len(placed) > 20
    for i, hw, cell in zip(rows.request_index, rows.hardware, rows.cell, strict=True):
        request = requests[int(i)]
        option = outcomes[request.request_id].production.option  # type: ignore[union-attr]
        node = request.options.node_index[request.options.node_offsets[option]]
        assert hw == request.state.hardware[request.state.node_hardware[node]].name
        assert cell == f"{request.workload.model_family}|{hw}|{request.workload.accelerators}"
        assert hw == option_hardware(request, option)


def test_summary_block_round_trips_through_json() -> None:
    o = _outcome_summary()
    back = outcome_from_dict(json.loads(json.dumps(o.to_dict())))
    assert back is not None
    assert back.reference.median == o.reference.median
    assert [r.threshold for r in back.rules] == [r.threshold for r in o.rules]
    assert all(np.array_equal(a.scale, b.scale) for a, b in zip(back.rules, o.rules, strict=True))
    assert o.reference.hardware_classes == ("K80", "V100")
    assert sorted(r.window_outcomes for r in o.rules) == [r.window_outcomes for r in o.rules]


def test_training_condition_windows_of_unseen_episodes_are_rarely_flagged() -> None:
    o = _outcome_summary()
    rows, _ = episode_rows(simulated_episodes("train", seed=3, episodes=range(60)))
    flags = [check_window(o.reference, o.rules, w) for w in _windows(rows, 250)]
    assert len(flags) >= 10
    assert all(math.isfinite(w.statistic) for w in flags)  # each window was checked
    assert np.mean([w.flagged for w in flags]) <= 0.1
    shifts = np.array([w.medians for w in flags])
    assert np.all(np.abs(np.nanmedian(shifts, axis=0)) < 0.1)  # no class moved


def test_degraded_v100s_are_found_at_half_speed_and_flagged() -> None:
    o = _outcome_summary()
    rows, _ = episode_rows(simulated_episodes("degraded", seed=4, episodes=range(40)))
    windows = [check_window(o.reference, o.rules, w) for w in _windows(rows, 250)]
    assert len(windows) >= 5
    assert all(w.flagged for w in windows)
    v100 = np.array([w.shift("V100") for w in windows])
    k80 = np.array([w.shift("K80") for w in windows])
    assert np.all(np.abs(v100 - math.log(0.5)) < 0.15)  # the simulator's truth: 0.5x
    # K80 untouched: small windows are noisy on it (its training spread is wide), and a
    # fuller cluster packs K80 jobs tighter, so only its typical window is near 0
    assert abs(float(np.nanmedian(k80))) < 0.1


def test_a_workload_mix_shift_alone_does_not_move_the_check() -> None:
    """Residuals are within a cell: keeping only one family's jobs changes the mix, not
    how fast each job runs for its cell."""
    o = _outcome_summary()
    rows, _ = episode_rows(simulated_episodes("train", seed=6, episodes=range(60)))
    families = np.array([c.split("|")[0] for c in rows.cell.tolist()])
    top = max(set(families.tolist()), key=lambda f: int(np.sum(families == f)))
    skewed = rows.take(np.flatnonzero(families == top))
    w = check_window(o.reference, o.rules, skewed)
    assert w.n_residuals >= MIN_CLASS_OUTCOMES
    assert np.all(np.abs(w.medians[np.isfinite(w.medians)]) < 0.2)


@pytest.mark.slow  # ~35 s: 280 simulated episodes and 400 calibration windows
def test_calibration_controls_the_false_flag_rate_on_fresh_windows() -> None:
    """Calibrated on one set of held-out episodes, checked on another."""
    trained = simulated_episodes("train", seed=10, episodes=range(40))
    reference = build_outcome_reference(episode_rows(trained)[0])
    held, starts = episode_rows(simulated_episodes("train", seed=10, episodes=range(40, 160)))
    rule = calibrate_outcome(reference, held, starts, 250, alpha=0.05, n_windows=400, seed=1)
    fresh, _ = episode_rows(simulated_episodes("train", seed=11, episodes=range(120)))
    windows = [check_window(reference, (rule,), w) for w in _windows(fresh, 250)]
    assert len(windows) >= 20
    assert np.mean([w.flagged for w in windows]) <= 0.15  # alpha 0.05, ~25 windows


def test_small_windows_are_not_checked_rather_than_guessed() -> None:
    o = _outcome_summary()
    rows, _ = episode_rows(simulated_episodes("degraded", seed=4, episodes=range(2)))
    w = check_window(o.reference, o.rules, rows.take(np.arange(min(40, len(rows)))))
    assert not w.flagged and math.isnan(w.threshold)


def test_calibration_refuses_bad_arguments() -> None:
    rows, starts = episode_rows(simulated_episodes("train", seed=12, episodes=range(3)))
    reference = build_outcome_reference(rows)
    with pytest.raises(ValueError, match="alpha"):
        calibrate_outcome(reference, rows, starts, 100, alpha=1.5)
    with pytest.raises(ValueError, match="window_outcomes"):
        calibrate_outcome(reference, rows, starts, 5)
    with pytest.raises(ValueError, match="group_starts"):
        calibrate_outcome(reference, rows, starts[:-1], 100)
