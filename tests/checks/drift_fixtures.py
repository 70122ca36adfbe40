"""Helpers for the drift tests: simulated request streams as arrays, windows fed through drift.

Not a conftest (another suite shares tests/ope): imported explicitly.
"""

from __future__ import annotations

import functools
import multiprocessing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np

from service.checks.drift import WindowAccumulator, WindowDrift, select_rule
from service.checks.outcome_drift import OutcomeRows, OutcomeWindow, check_window
from service.environment import simulated_episodes
from service.policies.outcome_summary import episode_rows
from service.policies.training_summary import (
    SUMMARY_FILE,
    TrainingReference,
    featurise,
    load_summary,
    request_times,
)

POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"
SIMULATED_POLICY = "iwr-scorer"
"""A policy trained on the simulator's training scenario (seed 0, episodes 0-119)."""


def shipped_summary(policy: str = SIMULATED_POLICY) -> TrainingReference:
    """The committed summary, loaded as the service loads it (feature hash checked)."""
    summary = load_summary(POLICIES_DIR / policy)
    assert summary is not None, f"policies/{policy} has no training summary"
    return summary


Chunk = tuple[np.ndarray, np.ndarray, list[tuple[frozenset[str], str]], np.ndarray, OutcomeRows]


def _chunk(scenario: str, seed: int, start: int, chunk_episodes: int) -> Chunk:
    """Episodes ``start:start + chunk_episodes`` featurised, with times and outcome rows."""
    episodes = simulated_episodes(scenario, seed, range(start, start + chunk_episodes))
    groups = [requests for requests, _ in episodes]
    x, offsets, _, cats = featurise(groups)
    return x, offsets, cats, request_times(groups), episode_rows(episodes)[0]


def stream(scenario: str, seed: int, chunk_episodes: int = 10, workers: int = 1) -> Iterator[Chunk]:
    """Every request of episodes 0, 1, ... of `scenario` under `seed`, in chunks, featurised,
    with its ``request_time`` (each episode restarts the simulator's clock), and the
    outcome rows of the chunk (request indices within the chunk).

    `workers` > 1 simulates that many chunks at a time in child processes (episodes are
    independent and seeded, so the stream is the same, in the same order): the slow
    own-traffic test simulates 400,000 requests, and on CI's two cores this halves it."""
    start = 0
    if workers <= 1:
        while True:
            yield _chunk(scenario, seed, start, chunk_episodes)
            start += chunk_episodes
    ctx = multiprocessing.get_context("spawn")  # not fork: the parent may hold threads
    with ctx.Pool(workers) as pool:
        while True:
            starts = [start + i * chunk_episodes for i in range(workers)]
            args = [(scenario, seed, s, chunk_episodes) for s in starts]
            yield from pool.starmap(_chunk, args)
            start += workers * chunk_episodes


@dataclass(frozen=True)
class CheckedWindow:
    """One window of requests under all three checks: inputs (features, novelty,
    arrival) and the outcomes of its requests."""

    inputs: WindowDrift
    outcome: OutcomeWindow | None

    @property
    def flagged(self) -> bool:
        """The drift monitor's verdict: any check flags it."""
        return self.inputs.flagged or (self.outcome is not None and self.outcome.flagged)


class _Checker:
    """One summary's windows over a stream: its accumulator and the outcome rows of its
    open window (global request index)."""

    def __init__(self, summary: TrainingReference, window: int) -> None:
        self.summary, self.window = summary, window
        self.acc = WindowAccumulator(summary.reference, select_rule(summary.rules, window), window)
        self.out: list[CheckedWindow] = []
        self.pending: list[OutcomeRows] = []

    def feed(self, chunk: Chunk, seen: int) -> None:
        """Add one chunk whose first request is the stream's request number `seen`."""
        x, offsets, cats, times, rows = chunk
        self.pending.append(OutcomeRows(rows.request_index + seen, rows.hardware, rows.cell,
                                        rows.log_throughput))  # fmt: skip
        window = self.window
        for inputs in self.acc.feed(x, offsets, cats, times=times):
            lo = len(self.out) * window
            joined = _concat(self.pending)
            inside = (joined.request_index >= lo) & (joined.request_index < lo + window)
            outcome = None
            if self.summary.outcome is not None:
                o = self.summary.outcome
                outcome = check_window(o.reference, o.rules, joined.take(np.flatnonzero(inside)))
            self.out.append(CheckedWindow(inputs, outcome))
            self.pending = [joined.take(np.flatnonzero(joined.request_index >= lo + window))]


def checked_windows_of(
    summaries: Mapping[str, TrainingReference],
    scenario: str,
    seed: int,
    window: int,
    n_windows: int,
) -> dict[str, list[CheckedWindow]]:
    """The first `n_windows` windows of `window` requests of one simulated stream, for every
    summary in `summaries` at once: each chunk is simulated and featurised once and fed to
    every summary's checks (the same windows each would get from a stream of its own)."""
    checkers = {name: _Checker(s, window) for name, s in summaries.items()}
    seen = 0  # requests fed so far
    for chunk in stream(scenario, seed, workers=2):
        for checker in checkers.values():
            checker.feed(chunk, seen)
        seen += len(chunk[1]) - 1
        if min(len(c.out) for c in checkers.values()) >= n_windows:
            return {name: c.out[:n_windows] for name, c in checkers.items()}
    raise AssertionError("unreachable: the stream is endless")


def checked_windows(
    summary: TrainingReference, scenario: str, seed: int, window: int, n_windows: int
) -> list[CheckedWindow]:
    """The first `n_windows` windows of `window` requests of a simulated stream."""
    return checked_windows_of({"": summary}, scenario, seed, window, n_windows)[""]


def shipped_summaries() -> dict[str, TrainingReference]:
    """Every committed training summary by policy name (discovered, so none is left out)."""
    files = sorted(POLICIES_DIR.glob(f"*/{SUMMARY_FILE}"))
    return {p.parent.name: shipped_summary(p.parent.name) for p in files}


@functools.cache
def shared_checked_windows(
    scenario: str, seed: int, window: int, n_windows: int
) -> Mapping[str, tuple[CheckedWindow, ...]]:
    """`checked_windows_of` every shipped summary, simulated once per test session.

    Why: the drift acceptance on training windows and the own-traffic test both judge
    the first 100 windows of scenario ``train`` under seed 1 (400,000 requests, about
    two minutes on two cores); whichever runs first simulates them, the other reads
    the same windows. Tuples, so no test can change what another one reads."""
    found = checked_windows_of(shipped_summaries(), scenario, seed, window, n_windows)
    return MappingProxyType({name: tuple(ws) for name, ws in found.items()})


def _concat(parts: list[OutcomeRows]) -> OutcomeRows:
    fields = ("request_index", "hardware", "cell", "log_throughput")
    return OutcomeRows(*(np.concatenate([getattr(p, f) for p in parts]) for f in fields))


def windows(
    summary: TrainingReference, scenario: str, seed: int, window: int, n_windows: int
) -> list[WindowDrift]:
    """The input checks of the first `n_windows` windows (`checked_windows`)."""
    return [w.inputs for w in checked_windows(summary, scenario, seed, window, n_windows)]


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
        checked = checked_windows(summary, scenario, seed, window, n)
        ws = [c.inputs for c in checked]
        flagged = sum(c.flagged for c in checked)
        by_outcome = sum(c.outcome is not None and c.outcome.flagged for c in checked)
        shifts_v100 = [c.outcome.shift("V100") for c in checked if c.outcome is not None]
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
            f" band ±{rule.arrival_threshold or float('nan'):.2f}; outcomes flagged in"
            f" {by_outcome}, V100 log-throughput shift median"
            f" {float(np.nanmedian(shifts_v100)) if shifts_v100 else float('nan'):+.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
