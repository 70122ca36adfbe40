"""False stops under the null and power at the planned sample size, on simulated streams.

The stop criterion is the hardest one a protocol can declare: ``reward-harm``
fires when the candidate is confidently worse than production at all
(``worse_than_baseline_by: 0``). The evaluator's own monitor judges it after
every batch of 50 rounds, with DR terms whose reward model is fitted only on
earlier batches. ``-s`` prints the figures.

- Null: a candidate unlike production whose value equals production's
  exactly; the 99% Clopper-Pearson interval of the false-stop rate must have
  its lower end <= alpha (0.05).
- Power: a candidate worse than production by the declared margin (the
  protocol's reward guardrail, 0.05 of SLO-met share); each run lasts the
  sample size the protocol's planner gives from a pilot's sd; it must stop
  in >= 90% of runs. Samples-to-stop are reported at 1x, 2x and 4x the margin.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.ope import clopper_pearson
from service.protocols import parse_protocol
from service.protocols.planner import plan_protocol
from tests.evaluator.conftest import MARGIN, Sim, protocol_doc
from tests.evaluator.simstreams import monitored, pilot_sd

ALPHA = 0.05


def _false_stops(sim: Sim, experiments: int, rounds: int, seed: int, label: str) -> None:
    protocol = parse_protocol(protocol_doc())
    runs = monitored(sim, protocol, sim.equal, experiments, rounds, seed)
    cp = clopper_pearson(runs.stops, experiments, level=0.99)
    print(
        f"\n[evaluator] null ({label}): candidate value {sim.value(sim.equal):.4f} = production"
        f" {sim.value(sim.production):.4f}; {experiments} experiments x {rounds} rounds, judged"
        f" after every batch of 50 from round 200: false stops {runs.stops}"
        f" ({runs.stops / experiments:.4f}), 99% CP [{cp.lower:.4f}, {cp.upper:.4f}]"
    )
    assert cp.lower <= ALPHA


def test_false_stop_rate_small(sim: Sim) -> None:
    _false_stops(sim, experiments=150, rounds=600, seed=101, label="quick")


@pytest.mark.slow
def test_false_stop_rate_1000_experiments(sim: Sim) -> None:
    _false_stops(sim, experiments=1000, rounds=1000, seed=102, label="1,000 experiments")


def _planned(sim: Sim) -> tuple[int, float]:
    protocol = parse_protocol(protocol_doc())
    sd = pilot_sd(sim, protocol, sim.harm(1), seed=7)
    plan = plan_protocol(protocol, {"reward": sd}, power=0.9)
    samples = plan.of("reward-harm").samples
    assert samples is not None and samples > protocol.minimum_samples
    return samples, sd


def _power(sim: Sim, k: float, experiments: int, rounds: int, seed: int) -> tuple[float, str]:
    protocol = parse_protocol(protocol_doc())
    runs = monitored(sim, protocol, sim.harm(k), experiments, rounds, seed)
    rate = runs.stops / experiments
    q = np.percentile(runs.samples, [50, 90]) if runs.stops else (np.nan, np.nan)
    line = (
        f"{k:g}x margin (harm {k * MARGIN:.2f}): stopped {runs.stops}/{experiments} ({rate:.3f})"
        f" within {rounds} rounds; samples to stop median {q[0]:.0f}, 90th pct {q[1]:.0f}"
    )
    return rate, line


def test_power_small(sim: Sim) -> None:
    samples, sd = _planned(sim)
    rate, line = _power(sim, 1, experiments=100, rounds=samples, seed=201)
    print(f"\n[evaluator] power (quick): planned {samples} rounds (pilot sd {sd:.3f}); {line}")
    assert rate >= 0.85


@pytest.mark.slow
def test_power_at_the_planned_sample_size_and_samples_to_stop(sim: Sim) -> None:
    samples, sd = _planned(sim)
    print(
        f"\n[evaluator] power: value production {sim.value(sim.production):.4f}; planner"
        f" (alpha 0.05, power 0.9, n_star 200, pilot sd {sd:.3f}) gives {samples} rounds"
    )
    rate, line = _power(sim, 1, experiments=500, rounds=samples, seed=202)
    print(f"[evaluator]   {line}")
    # The planner promises power 0.9, so the stop rate over 500 experiments is 0.9 give
    # or take ~0.013 of Monte Carlo error: asserting the point estimate >= 0.9 fails a
    # correct planner about half the time on a new stream. The claim tested instead:
    # power 0.9 is not refuted (the 99% Clopper-Pearson interval reaches it). A planner
    # that undersizes to power 0.85 stops ~425/500, whose interval ends near 0.89: fails.
    stops = round(rate * 500)
    assert clopper_pearson(stops, 500, level=0.99).upper >= 0.90, line
    for k, seed in ((2, 203), (4, 204)):
        rate_k, line_k = _power(sim, k, experiments=300, rounds=samples, seed=seed)
        print(f"[evaluator]   {line_k}")
        assert rate_k >= rate
