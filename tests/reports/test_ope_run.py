"""Estimates against a known truth, verdicts, refusals, and the limitations they produce."""

from __future__ import annotations

import json

from service.ope import Estimate, Estimator, NotIdentifiable
from service.reports.ope.limitations import limitations
from service.reports.ope.ope_run import Provenance, Traffic, run_ope
from service.reports.ope.summary import report_json, result_rows
from tests.reports.synthetic import bandit_log


def test_intervals_contain_the_truth_and_the_verdicts_follow() -> None:
    report = run_ope(bandit_log(3000, seed=1))
    by = {p.policy[0]: p for p in report.policies}
    assert report.production is not None and report.production.contains(0.475)
    for name, truth in (("best", 0.9), ("mixed", 0.35)):
        for est in (Estimator.IPS, Estimator.SNIPS, Estimator.DR):
            result = by[name].results[est]
            assert isinstance(result, Estimate), (name, est)
            assert result.interval.contains(truth), (name, est, result.interval)
    assert by["best"].verdict.startswith("better than production")
    assert by["mixed"].verdict.startswith("worse than production")
    assert set(by["best"].slices["workload_kind"]) == {"train", "infer"}
    assert set(by["best"].slices) == {"workload_kind", "model_family", "time_window"}
    assert len(by["best"].slices["time_window"]) == 4
    assert report.provenance is Provenance.SHADOW_LOGGED


def test_deterministic_production_gives_no_number_and_says_why() -> None:
    report = run_ope(
        bandit_log(200, seed=2, deterministic_production=True), traffic=Traffic.SIMULATED
    )
    for p in report.policies:
        assert all(isinstance(r, NotIdentifiable) for r in p.results.values())
        assert p.verdict.startswith("not identifiable: no overlap")
        assert p.vs_production is None
    rows = [r for r in result_rows(report) if r[0] != "production (observed)"]
    assert rows and all(r[2] == "not identifiable" and r[3] == "—" for r in rows)
    found = limitations(report)
    assert "simulated traffic" in found[0]
    assert any("`best@1`" in f and ": not identifiable" in f for f in found)
    data = report_json(report)
    json.dumps(data, allow_nan=False)
    estimates = data["policies"][0]["estimates"]
    assert all("value" not in e and e["provenance"] == "simulated" for e in estimates.values())


def test_every_number_in_the_json_carries_its_provenance() -> None:
    data = report_json(run_ope(bandit_log(300, seed=3)))
    text = json.dumps(data, allow_nan=False)
    assert data["production"]["provenance"] == "shadow-logged (off-policy)"
    for p in data["policies"]:
        assert p["vs_production"]["provenance"] == "shadow-logged (off-policy)"
        for e in [*p["estimates"].values(), *p["slices"]["workload_kind"].values()]:
            assert e["provenance"] == "shadow-logged (off-policy)"
    assert "NaN" not in text
