"""Helpers for the drift tests: simulated request streams as arrays, windows fed through drift.

Not a conftest (another suite shares tests/ope): imported explicitly.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from service.ope.drift import WindowAccumulator, WindowDrift, select_rule
from service.policies.training_summary import (
    TrainingReference,
    featurise,
    load_summary,
    request_times,
    simulated_requests,
)

POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"
SIMULATED_POLICY = "iwr-scorer"
"""A policy trained on the simulator's training scenario (seed 0, episodes 0-119)."""


def shipped_summary(policy: str = SIMULATED_POLICY) -> TrainingReference:
    """The committed summary, loaded as the service loads it (feature hash checked)."""
    summary = load_summary(POLICIES_DIR / policy)
    assert summary is not None, f"policies/{policy} has no training summary"
    return summary


def stream(scenario: str, seed: int, chunk_episodes: int = 10) -> Iterator[
    tuple[np.ndarray, np.ndarray, list[tuple[frozenset[str], str]], np.ndarray]
]:  # fmt: skip
    """Every request of episodes 0, 1, ... of `scenario` under `seed`, in chunks, featurised,
    with its ``request_time`` (each episode restarts the simulator's clock)."""
    start = 0
    while True:
        groups = simulated_requests(scenario, seed, range(start, start + chunk_episodes))
        x, offsets, _, cats = featurise(groups)
        yield x, offsets, cats, request_times(groups)
        start += chunk_episodes


def windows(
    summary: TrainingReference, scenario: str, seed: int, window: int, n_windows: int
) -> list[WindowDrift]:
    """The first `n_windows` windows of `window` requests of a simulated stream."""
    acc = WindowAccumulator(summary.reference, select_rule(summary.rules, window), window)
    out: list[WindowDrift] = []
    for x, offsets, cats, times in stream(scenario, seed):
        out += acc.feed(x, offsets, cats, times=times)
        if len(out) >= n_windows:
            return out[:n_windows]
    raise AssertionError("unreachable: the stream is endless")


def main() -> None:
    """Print the flag rate of every scenario at the service's default window (docs/drift.md)."""
    from service.settings import Settings

    window = Settings.model_fields["drift_window_requests"].default
    summary = shipped_summary()
    import sys

    plan = [("train", 1, 100)] + [
        (s, 2, 20) for s in ("mix_shift", "new_class", "fragmented", "degraded", "surge")
    ]
    only = sys.argv[1:]  # scenario names to run, default all
    plan = [p for p in plan if not only or p[0] in only]
    for scenario, seed, n in plan:
        ws = windows(summary, scenario, seed, window, n)
        flagged = sum(w.flagged for w in ws)
        by_t = sum(w.statistic > w.threshold for w in ws)
        by_arrival = sum(w.arrival_flagged for w in ws)
        median_t = float(np.median([w.statistic for w in ws]))
        shifts = [w.arrival_shift for w in ws]
        rule = select_rule(summary.rules, window)
        print(
            f"{scenario:10s} seed {seed}: {flagged:3d}/{len(ws)} windows of {window} requests"
            f" flagged ({flagged / len(ws):.0%}); features T > threshold in {by_t}, median T"
            f" {median_t:.2f}, threshold {ws[0].threshold:.2f}; arrival flagged in"
            f" {by_arrival}, shift median {float(np.median(shifts)):+.2f}"
            f" (min {min(shifts):+.2f}, max {max(shifts):+.2f}),"
            f" band ±{rule.arrival_threshold or float('nan'):.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
