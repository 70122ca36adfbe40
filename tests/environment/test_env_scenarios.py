"""Scenario files: a training condition and held-out ones, each saying what is held out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from service.contract import InvalidInput
from service.environment import Scenario, World, load_scenario, scenario_names
from service.environment.scenario import scenario_from_dict

HELD_OUT = {"mix_shift", "new_class", "degraded", "surge", "fragmented"}


def test_the_training_condition_and_every_held_out_condition_ship() -> None:
    names = scenario_names()
    assert names[0] == "train"
    assert set(names) >= HELD_OUT


def _differences(a: Scenario, b: Scenario) -> set[str]:
    fields = ("trace_vc", "nodes", "degrade", "surge", "background_fraction", "draining")
    return {f for f in fields if getattr(a, f) != getattr(b, f)}


def test_each_held_out_condition_differs_from_training_and_says_how(
    scenarios: dict[str, Scenario],
) -> None:
    train = scenarios["train"]
    for name in HELD_OUT:
        s = scenarios[name]
        assert s.held_out.strip() and s.summary.strip()
        assert _differences(train, s), f"{name} is the training condition under another name"


def test_the_new_class_is_absent_from_training(worlds: dict[str, World]) -> None:
    trained = {h.name for h in worlds["train"].classes}
    new = {h.name for h in worlds["new_class"].classes} - trained
    assert new, "new_class must bring a class training never saw"


def test_mix_shift_uses_another_clusters_mix(worlds: dict[str, World]) -> None:
    a, b = worlds["train"], worlds["mix_shift"]
    share = [float((w.trace_full.gpus > 1).mean()) for w in (a, b)]
    assert a.scenario.trace_vc != b.scenario.trace_vc
    assert share[0] != pytest.approx(share[1], abs=0.05)


def test_surge_compresses_arrivals_by_the_philly_factor(worlds: dict[str, World]) -> None:
    train, surge = worlds["train"], worlds["surge"]
    assert surge.surge_factor > 1.0
    assert surge.time_scale == pytest.approx(train.time_scale / surge.surge_factor)


def _train_doc() -> dict[str, Any]:
    path = Path(__file__).resolve().parents[2] / "service/environment/scenarios/train.yaml"
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


INVALID = [
    (lambda d: d.pop("held_out"), "held_out", "is required"),
    (lambda d: d.update(colour="blue"), "colour", "is not a scenario key"),
    (lambda d: d["trace"].update(jobs_per_episode=0), "trace.jobs_per_episode", "must be >= 1"),
    (lambda d: d["trace"].update(arrival_time_scale=-1), "trace.arrival_time_scale", "> 0"),
    (lambda d: d["cluster"][0].update(hardware="Z9000"), "cluster[0].hardware", "known class"),
    (lambda d: d["cluster"][1].update(count=0), "cluster[1].count", "must be >= 1"),
    (lambda d: d.update(degrade={"V100": 1.5}), "degrade.V100", "(0, 1]"),
    (lambda d: d.update(degrade={"P100": 0.5}), "degrade.P100", "not a class of this cluster"),
    (lambda d: d.update(draining=[99]), "draining[0]", "must index a node"),
    (lambda d: d.update(background_fraction=1.0), "background_fraction", "[0, 1)"),
    (lambda d: d["production"].update(mode="greedy"), "production", "not a valid emulator"),
    (lambda d: d["production"].update(epsilon=2), "production.epsilon", "[0, 1]"),
    (lambda d: d.update(reward={"latency": 1.0}), "reward.weights.latency", "is not one of"),
]


@pytest.mark.parametrize(("mutate", "field", "message"), INVALID)
def test_invalid_scenarios_name_the_field(mutate: Any, field: str, message: str) -> None:
    doc = _train_doc()
    mutate(doc)
    with pytest.raises(InvalidInput) as info:
        scenario_from_dict(doc)
    assert info.value.field == field
    assert message in str(info.value)


def test_unknown_scenario_lists_the_known_ones() -> None:
    with pytest.raises(InvalidInput, match="train"):
        load_scenario("no-such-scenario")


def test_scenario_files_load_by_path() -> None:
    path = Path(__file__).resolve().parents[2] / "service/environment/scenarios/degraded.yaml"
    assert load_scenario(path) == load_scenario("degraded")
