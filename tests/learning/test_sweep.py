"""`understudy sweep`: shift conditions of a given size, and a curve with intervals per family."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from service.cli.learning import learning_app
from service.environment import World, load_scenario, new_episode
from service.learning.shifts import FAMILIES, condition
from service.learning.sweep import SweepSpec

from .conftest import POLICIES_DIR, SMALL_JOBS

JOB_FIELDS = ("type_idx", "gpus", "steps", "arrival_s", "slo_s")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_size_zero_of_every_family_is_the_training_condition(family: str) -> None:
    base = load_scenario("train").replace(jobs_per_episode=SMALL_JOBS)
    size = {"workload_mix": 0.0, "degradation": 1.0, "arrival_rate": 1.0}[family]
    cond = condition(family, size, base)
    reference = new_episode(World(base), 4, 1)
    for f in JOB_FIELDS:
        np.testing.assert_array_equal(getattr(cond.jobs(4, 1), f), getattr(reference.jobs, f))
    np.testing.assert_array_equal(cond.world.cons_rate, World(base).cons_rate)


def test_shift_sizes_move_what_they_name() -> None:
    base = load_scenario("train").replace(jobs_per_episode=40)
    train_types = set(condition("workload_mix", 0.0, base).jobs(0, 0).type_idx.tolist())
    mixed = condition("workload_mix", 1.0, base)
    assert mixed.other is not None
    assert mixed.other.scenario.trace_vc == load_scenario("mix_shift").trace_vc
    assert set(mixed.jobs(0, 0).type_idx.tolist()) != train_types
    slow = condition("degradation", 2.0, base).world
    v100 = [c.name for c in slow.classes].index("V100")
    fast = World(base)
    np.testing.assert_allclose(
        np.nan_to_num(slow.cons_rate[..., v100]), np.nan_to_num(fast.cons_rate[..., v100]) / 2
    )
    busy = condition("arrival_rate", 4.0, base).jobs(0, 0).arrival_s
    np.testing.assert_allclose(busy, condition("arrival_rate", 1.0, base).jobs(0, 0).arrival_s / 4)


@pytest.mark.parametrize(
    ("family", "size", "message"),
    [("workload_mix", 1.5, "`workload_mix` share must be in [0, 1], got 1.5"),
     ("degradation", 0.5, "`degradation` factor must be >= 1, got 0.5"),
     ("arrival_rate", 0.0, "`arrival_rate` multiplier must be > 0, got 0.0"),
     ("heat", 1.0, "`family` must be one of workload_mix, degradation, arrival_rate, got 'heat'")],
)  # fmt: skip
def test_bad_shifts_are_refused(family: str, size: float, message: str) -> None:
    with pytest.raises(ValueError) as err:
        condition(family, size)
    assert str(err.value) == message


def test_spec_round_trips() -> None:
    spec = SweepSpec(seeds=(1, 2), sizes={"degradation": (1.0, 2.0)}, families=("degradation",))
    assert SweepSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


@pytest.mark.slow
def test_sweep_draws_a_curve_with_intervals_for_every_family(tmp_path: Path) -> None:
    args = ["sweep", "--seeds", "2", "--episodes", "1", "--jobs-per-episode", "10",
            "--policies", "lcb-planner,iwr-scorer",
            "--policies-dir", str(POLICIES_DIR)]  # fmt: skip
    runner = CliRunner()
    result = runner.invoke(learning_app, [*args, "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "a" / "sweep.json").read_text())
    assert set(doc["families"]) == set(FAMILIES)
    for family, points in doc["families"].items():
        assert [p["size"] for p in points] == list(FAMILIES[family])
        for p in points:
            for name in ("lcb-planner", "iwr-scorer"):
                d = p[name]["vs_production"]
                assert d["n"] == 2 and d["lo"] is not None and d["lo"] <= d["mean"] <= d["hi"]
    csv = (tmp_path / "a" / "sweep.csv").read_text().splitlines()
    assert len(csv) == 1 + sum(len(v) for v in FAMILIES.values()) * 3
    assert (tmp_path / "a" / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    again = runner.invoke(
        learning_app,
        ["sweep", "--from-manifest", str(tmp_path / "a" / "run_manifest.json"),
         "--out", str(tmp_path / "b")],
    )  # fmt: skip
    assert again.exit_code == 0, again.output
    assert (tmp_path / "a" / "sweep.json").read_bytes() == (
        tmp_path / "b" / "sweep.json"
    ).read_bytes()
