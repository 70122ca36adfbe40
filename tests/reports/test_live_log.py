"""`understudy ope` and `understudy evidence` on a decision log made through the real service.

A simulated Runtime (the demo's: the simulator's production emulator on the
``train`` scenario, one episode in four mirrored before deciding) mirrors
through the real `MirrorClient` and reports outcomes; the committed ONNX
policies and the baselines score; the commands then read the embedded
PostgreSQL the way an operator would, through ``UNDERSTUDY_DATABASE_URL``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli.demo import simulated_runtime
from service.cli.evaluation import evaluation_app
from service.contract import Outcome
from service.server.app import Service
from service.storage import count_joined_outcomes
from tests.live_traffic import send_events, wait_for
from tests.reports.package_check import check_package, check_sections


def _logged(service: Service, outcomes: int) -> None:
    """Until the scorer drained the journal and every outcome is joined (a hang guard only)."""
    engine = service.engine
    assert engine is not None
    wait_for(
        lambda: (
            service.journal.depth_records("scorer") == 0
            and count_joined_outcomes(engine) >= outcomes
        ),
        lambda: (
            f"{count_joined_outcomes(engine)} of {outcomes} outcomes joined,"
            f" {service.journal.depth_records('scorer')} records not scored"
        ),
        timeout_s=240.0,
    )


@pytest.mark.slow  # ~20 s of CPU: the service, 4 episodes, then every evidence section
def test_ope_prints_intervals_and_evidence_writes_a_package_on_a_live_log(
    make_service: Callable[..., Service], runtime_token: str, db_url: str, tmp_path: Path
) -> None:
    service = make_service()
    events = simulated_runtime(episodes=4, seed=0)
    outcomes = sum(isinstance(e, Outcome) for e in events)
    send_events(service, runtime_token, events)
    _logged(service, outcomes)

    runner = CliRunner()
    env = {"UNDERSTUDY_DATABASE_URL": db_url, "COLUMNS": "200"}
    out = runner.invoke(evaluation_app, ["ope", "--json", str(tmp_path / "ope.json")], env=env)
    assert out.exit_code == 0, out.output
    data = json.loads((tmp_path / "ope.json").read_text())
    assert data["rounds"] == outcomes
    intervals = [
        e["interval"]
        for p in data["policies"]
        for e in p["estimates"].values()
        if e["identifiable"] and p["policy"] != "production-mirror"
    ]
    assert intervals and all(math.isfinite(i["lower"]) for i in intervals)
    first = next(p for p in data["policies"] if p["estimates"]["dr"]["identifiable"])
    lower = first["estimates"]["dr"]["interval"]["lower"]
    assert f"[{lower:.4g}," in out.output

    folder = tmp_path / "evidence"
    out = runner.invoke(
        evaluation_app, ["evidence", "--out", str(folder), "--traffic", "simulated"], env=env
    )
    assert out.exit_code == 0, out.output
    results = check_package(folder, sections=["Failure modes"])
    check_sections(results, list(results["sections"]))
    assert results["provenance"] == "simulated"
