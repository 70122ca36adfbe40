"""The live outcome-drift check on a real service and PostgreSQL.

A simulated Runtime mirrors ``degraded`` episodes (V100 at half speed) through
the real gRPC client, outcomes included — every fourth episode mirrored before
deciding, so production's option arrives with the outcome. The check reads the
joined outcomes back from the decision log, decodes the stored requests, and
must publish the V100 shift the simulator put there (about ``ln 0.5``) and a
flag, for each policy with an outcome reference; the training scenario must
not be flagged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from service.contract import MirrorRequest, Outcome
from service.environment import World, load_scenario, log_episode
from service.evaluator.calibration_monitor import CalibrationStep
from service.reports.ope.outcome_drift_section import build_outcome_drift_section
from service.server.app import Service
from service.server.evaluator_wiring import outcome_drift_monitor
from service.storage.reads.ope import OpeFilter
from tests.live_traffic import send_events, wait_drained

POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"

WITH_OUTCOMES = ("gavel-scorer", "iwr-scorer", "lcb-planner")
"""Every shipped ONNX policy: all are trained on simulated episodes, which carry outcomes."""


def _events(scenario: str, seed: int, episodes: int) -> list[MirrorRequest | Outcome]:
    world = World(load_scenario(scenario))
    events: list[MirrorRequest | Outcome] = []
    for e in range(episodes):
        events += log_episode(world, seed=seed, episode=e, mirror_before=e % 4 == 3).events()
    return events


@pytest.mark.parametrize(("scenario", "flagged"), [("degraded", True), ("train", False)])
def test_live_check_finds_the_simulated_slowdown(
    make_service: Callable[..., Service], runtime_token: str, scenario: str, flagged: bool
) -> None:
    service = make_service()
    monitor = outcome_drift_monitor(service)
    assert monitor is not None and set(monitor.policies) == set(WITH_OUTCOMES)
    reg = service.metrics.registry

    def sample(metric: str, **labels: str) -> float | None:
        return reg.get_sample_value(metric, labels)

    for p in WITH_OUTCOMES:  # every series exists before the first check
        assert sample("understudy_drift_outcome_flagged", policy=p) == 0.0
        shift = sample("understudy_drift_outcome_shift", policy=p, hardware="V100")
        assert shift is not None and math.isnan(shift)
    for baseline in ("first-fit", "least-loaded"):  # no training data, no series
        assert sample("understudy_drift_outcome_flagged", policy=baseline) is None
    if service.evaluator is not None:  # the evaluator loop runs it as a step
        steps, observer = [], service.evaluator.observer
        while isinstance(observer, CalibrationStep):
            steps.append(type(observer.monitor).__name__)
            observer = observer.inner
        assert "OutcomeDriftMonitor" in steps

    send_events(service, runtime_token, _events(scenario, seed=21, episodes=12))
    wait_drained(service)
    monitor.run_once()
    for p in WITH_OUTCOMES:
        residuals = sample("understudy_drift_outcome_residuals", policy=p)
        assert residuals is not None and residuals >= 250
        assert sample("understudy_drift_outcome_flagged", policy=p) == (1.0 if flagged else 0.0)
        v100 = sample("understudy_drift_outcome_shift", policy=p, hardware="V100")
        assert v100 is not None
        expected = math.log(0.5) if flagged else 0.0
        assert abs(v100 - expected) < 0.15
        assert monitor.last[p].n_residuals == residuals

    # the evidence package's section reads the same log offline, over the whole period
    assert service.engine is not None
    section = build_outcome_drift_section(service.engine, OpeFilter(), POLICIES_DIR)
    assert section is not None and section.key == "outcome_drift"
    by_policy = {r["policy"]: r for r in section.results["policies"]}
    assert set(by_policy) == set(WITH_OUTCOMES)
    for p in WITH_OUTCOMES:
        r = by_policy[p]
        assert r["residuals"] == monitor.last[p].n_residuals  # same outcomes, same reference
        assert r["period"]["V100"] == pytest.approx(monitor.last[p].shift("V100"))
        assert r["period_flagged"] is flagged
    assert all(png.startswith(b"\x89PNG") for png in section.figures.values())
    assert all(f"figures/{name}" in section.html for name in section.figures)
    assert any("V100 at" in text for text in section.limitations) is flagged
