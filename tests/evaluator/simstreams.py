"""Monitored experiments on simulated streams: the real `ExperimentMonitor`, batch by batch.

Each experiment is one replication of i.i.d. rounds drawn from the simulator
log (`tests.ope.simdata.draw`); after every batch the monitor judges every
criterion and `decide` says whether the evaluator would stop. Nothing here
is a reimplementation: the code under test is the evaluator's own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.protocols import Action, Protocol, State
from service.protocols.monitor import ExperimentMonitor
from service.protocols.rounds import JoinedRounds
from service.protocols.trackers import MeanTracker
from service.protocols.verdicts import decide
from tests.evaluator.conftest import Sim
from tests.ope.simdata import Draws, draw

BATCH = 50
"""Rounds between evaluations."""


@dataclass(frozen=True)
class Runs:
    """Where each experiment stopped (rounds seen), None when it never did."""

    stopped_at: list[int | None]

    @property
    def stops(self) -> int:
        return sum(s is not None for s in self.stopped_at)

    @property
    def samples(self) -> NDArray[np.float64]:
        return np.array([s for s in self.stopped_at if s is not None], dtype=np.float64)


def batch(sim: Sim, d: Draws, r: int, s: int, target: NDArray[np.float64]) -> JoinedRounds:
    """Rounds ``s .. s + BATCH`` of replication `r` as the evaluator's feed would give them."""
    c = d.context[r, s : s + BATCH]
    return JoinedRounds(
        reward=d.reward[r, s : s + BATCH],
        cost=np.zeros(len(c)),
        action=d.action[r, s : s + BATCH],
        pscore=d.pscore[r, s : s + BATCH],
        target=target[c],
        features=sim.pool.features[c],
    )


def monitored(
    sim: Sim,
    protocol: Protocol,
    target: NDArray[np.float64],
    experiments: int,
    rounds: int,
    seed: int,
) -> Runs:
    """`experiments` monitored runs of up to `rounds` rounds; where each one stopped."""
    d = draw(sim.pool, np.random.default_rng(seed), experiments, rounds)
    out: list[int | None] = []
    for r in range(experiments):
        monitor = ExperimentMonitor(protocol, n_features=sim.pool.features.shape[2])
        stopped = None
        for s in range(0, rounds, BATCH):
            monitor.update_joined(batch(sim, d, r, s, target))
            verdict = decide(monitor.evaluations(0.0), State.RUNNING, protocol.mode)
            if verdict is not None and verdict.action is Action.STOP:
                stopped = min(s + BATCH, rounds)
                break
        out.append(stopped)
    return Runs(out)


def pilot_sd(sim: Sim, protocol: Protocol, target: NDArray[np.float64], seed: int) -> float:
    """The per-round sd of the stop criterion's terms, from one long pilot stream."""
    rounds = 5000
    d = draw(sim.pool, np.random.default_rng(seed), 1, rounds)
    monitor = ExperimentMonitor(protocol, n_features=sim.pool.features.shape[2])
    for s in range(0, rounds, BATCH):
        monitor.update_joined(batch(sim, d, 0, s, target))
    tracker = monitor.trackers["reward-harm"]
    assert isinstance(tracker, MeanTracker)
    return tracker.std
