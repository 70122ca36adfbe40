"""The live calibration monitor on a real service, and the report section on its log.

A simulated Runtime (the demo's) mirrors through the real client and reports
outcomes; the committed policies score; the evaluator loop runs the
calibration step. The gauges must exist before any traffic and, once every
outcome is logged, equal what `read_calibration` + `service.checks.calibration`
compute from the same log.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from service.checks.calibration import LEVELS, coverage, flag_window, pit
from service.cli.demo import simulated_runtime
from service.contract import MirrorRequest, Outcome
from service.evaluator.calibration_monitor import level_label, predictor_policies
from service.reports.ope.calibration_section import build_calibration_section
from service.server.app import Service
from service.storage import count_joined_outcomes
from service.storage.reads.calibration import read_calibration
from service.storage.reads.ope import OpeFilter
from tests.live_traffic import send_events, wait_for

POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"


def test_monitor_publishes_what_the_log_says(
    make_service: Callable[..., Service], runtime_token: str
) -> None:
    service = make_service(
        evaluator_interval_s=0.3,
        evaluator_lease_ttl_s=5.0,
        calibration_interval_s=0.3,
        calibration_window_s=3600.0,
    )
    assert service.policies is not None and service.engine is not None
    names = predictor_policies(service.policies)
    assert names, "the committed policies include predictor policies"
    reg = service.metrics.registry

    def sample(metric: str, **labels: str) -> float | None:
        return reg.get_sample_value(metric, labels)

    for p in names:  # every series exists before the first window
        assert sample("understudy_calibration_flagged", policy=p) is not None
        for level in LEVELS:
            assert sample("understudy_calibration_coverage", policy=p, level=level_label(level))

    events = simulated_runtime(episodes=3, seed=0)
    outcomes = sum(isinstance(e, Outcome) for e in events)
    send_events(service, runtime_token, events)
    engine = service.engine
    wait_for(
        lambda: (
            service.journal.depth_records("scorer") == 0
            and count_joined_outcomes(engine) >= outcomes
        ),
        "the log did not take every outcome",
    )
    rows = {r.policy: r for r in read_calibration(engine, OpeFilter(policies=names))}
    assert any(r.n > 0 for r in rows.values())
    # the reads against what Runtime sent: the outcome of the request, for production's option
    sent = {e.request_id: e for e in events if isinstance(e, Outcome)}
    production = {
        e.request_id: (e.production or sent[e.request_id].production)
        for e in events
        if isinstance(e, MirrorRequest)
    }
    for r in rows.values():
        for rid, y, option in zip(r.request_id, r.outcome, r.chosen_option, strict=True):
            assert y == sent[str(rid)].throughput
            decision = production[str(rid)]
            assert decision is not None and decision.option == option
    busiest = max(rows.values(), key=lambda r: r.n + r.unmatched)
    (limited,) = read_calibration(engine, OpeFilter(policies=(busiest.policy,)), limit=5)
    assert limited.n + limited.unmatched == 5
    assert set(limited.request_id) <= set(busiest.request_id)
    for r in read_calibration(engine, OpeFilter(policies=names), target="run_time"):
        assert r.n > 0 and r.taus == (0.1, 0.5, 0.9)
        for rid, y in zip(r.request_id, r.outcome, strict=True):
            o = sent[str(rid)]
            assert o.completion_time_s is not None and o.queue_delay_s is not None
            assert y == pytest.approx(o.completion_time_s - o.queue_delay_s)
    wait_for(
        lambda: all(
            sample("understudy_calibration_outcomes", policy=p) == (rows[p].n if p in rows else 0)
            for p in names
        ),
        "the monitor did not publish the logged window",
    )
    for p in names:
        if p not in rows or rows[p].n == 0:
            continue
        r = rows[p]
        u = pit(r.taus, r.quantiles, r.outcome)
        for level in LEVELS:
            got = sample("understudy_calibration_coverage", policy=p, level=level_label(level))
            assert got is not None and math.isfinite(got)
            assert got == coverage(u, level, r.taus).observed
        flagged = sample("understudy_calibration_flagged", policy=p)
        assert flagged == (1.0 if flag_window(u, r.taus).flagged else 0.0)

    section = build_calibration_section(engine, OpeFilter(), POLICIES_DIR)
    assert section is not None and section.key == "calibration"
    measured = [p for p in section.results["policies"] if p["n"] > 0]
    assert {p["policy"] for p in measured} == {p for p, r in rows.items() if r.n > 0}
    for p in measured:
        assert p["n"] == rows[p["policy"]].n
    assert all(png.startswith(b"\x89PNG") for png in section.figures.values())
    assert all(f"figures/{name}" in section.html for name in section.figures)
    assert any("chosen option was production's" in x for x in section.limitations)
    assert "<td>" in section.html and section.markdown.count("|") > 20
    kinds = set(measured[0]["slices"])
    assert kinds == {"workload kind", "model family", "tenant", "hardware class", "time window"}
    assert "unknown" not in measured[0]["slices"]["hardware class"]
    assert np.isclose(
        sum(s["n"] for s in measured[0]["slices"]["hardware class"].values()), measured[0]["n"]
    )


def test_section_is_none_without_predictions(
    make_service: Callable[..., Service], runtime_token: str
) -> None:
    service = make_service()
    assert service.engine is not None
    assert build_calibration_section(service.engine, OpeFilter(), POLICIES_DIR) is None
