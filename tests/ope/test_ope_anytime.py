"""Anytime validity: monitored streams checked after every batch rarely ever exclude the truth.

Each stream is a fresh i.i.d. log from the simulator (`tests.ope.simdata.draw`),
fed to a confidence sequence batch by batch; after every batch we ask whether
the sequence excludes the exact truth. The share of streams that ever does
must have a 99% Clopper-Pearson interval whose lower end is <= alpha. Run
with ``-s`` to see the figures (``-m slow`` for 1,000 streams).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from service.ope import (
    AsymptoticCS,
    BanditData,
    BettingCS,
    Estimator,
    Interval,
    OffPolicyBettingCS,
    ProportionCS,
    clopper_pearson,
    round_values,
)
from tests.ope.conftest import Sim
from tests.ope.simdata import dataset, draw, linear_model

ALPHA = 0.05
TARGET = "least-loaded"


@dataclass
class Monitor:
    """One confidence sequence on one stream: feed a batch, read the interval."""

    feed: Callable[[BanditData], None]
    read: Callable[[], Interval]


def monitors(stream_length: int, grid: int) -> dict[str, Callable[[], Monitor]]:
    """Fresh monitors per stream, keyed by what they bound."""

    def asymptotic(values: Callable[[BanditData], np.ndarray]) -> Callable[[], Monitor]:
        def make() -> Monitor:
            cs = AsymptoticCS(alpha=ALPHA, n_star=stream_length)
            return Monitor(lambda b: cs.update(values(b)), cs.interval)

        return make

    def off_policy() -> Monitor:
        cs = OffPolicyBettingCS(alpha=ALPHA, grid_size=grid)
        return Monitor(lambda b: cs.update(weight=b.weight, reward=b.reward), cs.interval)

    def bounded() -> Monitor:  # production's own rewards: an on-policy mean in [0, 1]
        cs = BettingCS(alpha=ALPHA, grid_size=grid)
        return Monitor(lambda b: cs.update(b.reward), cs.interval)

    def proportion() -> Monitor:  # SLO met under production: a rate
        cs = ProportionCS(alpha=ALPHA)
        return Monitor(lambda b: cs.update(b.reward.astype(bool)), cs.interval)

    return {
        "asymptotic CS, IPS": asymptotic(lambda b: round_values(b, Estimator.IPS)),
        "asymptotic CS, DR": asymptotic(lambda b: round_values(b, Estimator.DR)),
        "asymptotic CS, DR minus production": asymptotic(
            lambda b: round_values(b, Estimator.DR) - b.reward
        ),
        "off-policy betting CS, IPS": off_policy,
        "betting CS, production mean": bounded,
        "proportion CS, production SLO rate": proportion,
    }


def run_streams(sim: Sim, streams: int, length: int, batch: int, grid: int, seed: int) -> None:
    pool = sim.pool
    truth = {
        "asymptotic CS, IPS": sim.truth(TARGET),
        "asymptotic CS, DR": sim.truth(TARGET),
        "asymptotic CS, DR minus production": sim.truth(TARGET) - sim.truth("production"),
        "off-policy betting CS, IPS": sim.truth(TARGET),
        "betting CS, production mean": sim.truth("production"),
        "proportion CS, production SLO rate": sim.truth("production"),
    }
    draws = draw(pool, np.random.default_rng(seed), streams + 1, length)
    model = linear_model(pool, draws, streams)
    makers = monitors(length, grid)
    ever = dict.fromkeys(makers, 0)
    width = dict.fromkeys(makers, 0.0)
    for i in range(streams):
        data = dataset(pool, draws, i, sim.targets[TARGET], model)
        live = {name: make() for name, make in makers.items()}
        missed = dict.fromkeys(makers, False)
        for start in range(0, length, batch):
            part = data.subset(np.arange(start, min(start + batch, length)))
            for name, m in live.items():
                m.feed(part)
                missed[name] |= not m.read().contains(truth[name])
        for name, m in live.items():
            ever[name] += missed[name]
            width[name] += m.read().width / streams
    print(
        f"\n[ope] anytime validity, alpha {ALPHA}: {streams} streams x {length} rounds, "
        f"checked after every batch of {batch} ({length // batch} looks), target {TARGET}"
    )
    for name, k in ever.items():
        cp = clopper_pearson(k, streams, level=0.99)
        print(
            f"  {name:36s} ever excluded the truth {k / streams:.3f} ({k}/{streams})  "
            f"99% CP [{cp.lower:.3f}, {cp.upper:.3f}]  mean final width {width[name]:.3f}"
        )
    for name, k in ever.items():
        assert clopper_pearson(k, streams, level=0.99).lower <= ALPHA, (name, k, streams)


def test_anytime_validity_quick(sim: Sim) -> None:
    run_streams(sim, streams=200, length=500, batch=50, grid=200, seed=31)


@pytest.mark.slow
def test_anytime_validity_over_a_thousand_monitored_streams(sim: Sim) -> None:
    run_streams(sim, streams=1000, length=1000, batch=50, grid=200, seed=32)
