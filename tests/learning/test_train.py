"""`understudy train`: acceptance figures, ONNX fidelity, byte-identical retraining."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.progress import Progress

from service.environment import World, load_scenario
from service.learning import assess
from service.learning.logs import collect
from service.learning.train import TrainSettings, train
from service.policies.manifest import load_manifest
from service.policies.onnx_policy import OnnxPredictor
from service.policies.registry import Registry, load_registry

from .conftest import LEARNED, POLICIES_DIR

SMALL = TrainSettings(
    episodes=8,
    held_out_episodes=3,
    scenario_episodes=1,
    pool_episodes=1,
    pool_worlds=2,
    pessimism_grid=(0.0, 1.0),
    jobs_per_episode=20,
)


def quiet() -> Progress:
    return Progress(console=Console(file=io.StringIO()), disable=True)


def evaluation(name: str) -> dict[str, Any]:
    return dict(load_manifest(POLICIES_DIR / name / "policy.yaml").evaluation)


def test_committed_manifests_record_the_acceptance_figures() -> None:
    held = evaluation("learned-outcome")["held_out"]["log_throughput"]
    assert held["pinball_ratio_vs_group_quantiles"] <= 0.9
    assert held["pinball_ratio_vs_group_mean"] <= 0.9
    assert 0.75 <= held["interval_coverage"] <= 0.85
    rows = evaluation("lcb-planner")["pessimism_on_held_out_contexts"]["by_pessimism"]
    assert rows[0]["pessimism"] == 0.0 and any(r["changed_vs_first"] > 0 for r in rows[1:])
    for name in LEARNED:
        assert max(evaluation(name)["onnx_vs_sklearn"].values()) <= 1e-4
        assert (POLICIES_DIR / name / "model.onnx").stat().st_size < 2_000_000


def test_committed_artifacts_load_and_name_their_training_data(registry: Registry) -> None:
    assert not set(LEARNED) & set(registry.refused)
    assert isinstance(registry.predictors["learned-outcome"], OnnxPredictor)
    summary = registry.manifests["lcb-planner"].training_data
    assert summary.hardware_classes == ("K80", "V100") and summary.n_rows > 5000
    assert "scenario `train`" in summary.source


@pytest.mark.slow
def test_committed_predictor_meets_the_acceptance_on_unseen_logs(registry: Registry) -> None:
    """ONNX, not the in-memory model; episodes of a seed training never touched."""
    world = World(load_scenario("train"))
    fitted_on = collect(world, seed=0, episodes=range(30))
    unseen = collect(world, seed=7, episodes=range(20))
    predictor = registry.predictors["learned-outcome"]
    assert isinstance(predictor, OnnxPredictor)
    f = assess.predictor_figures(predictor, fitted_on, unseen)["log_throughput"]
    assert f["pinball_ratio_vs_group_quantiles"] <= 0.9, f
    assert 0.75 <= f["interval_coverage"] <= 0.85, f


def shas(root: Path) -> dict[str, str]:
    return {
        p.parent.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.glob("*/model.onnx"))
    }


@pytest.mark.slow
def test_training_twice_with_one_seed_writes_the_same_bytes(tmp_path: Path) -> None:
    first = train(tmp_path / "a", SMALL, quiet())
    train(tmp_path / "b", SMALL, quiet())
    assert set(shas(tmp_path / "a")) == set(LEARNED)
    assert shas(tmp_path / "a") == shas(tmp_path / "b")
    assert max(first["fidelity"].values()) <= 1e-4
    loaded = load_registry(tmp_path / "a", include_baselines=False)
    assert dict(loaded.refused) == {} and set(loaded.policies) == {"lcb-planner", "iwr-scorer"}


@pytest.mark.slow
def test_the_committed_artifacts_are_what_train_writes(tmp_path: Path) -> None:
    train(tmp_path, TrainSettings(), quiet())
    committed = shas(POLICIES_DIR)
    assert shas(tmp_path) == {n: committed[n] for n in LEARNED}
