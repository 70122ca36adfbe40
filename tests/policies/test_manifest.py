"""Manifest schema: round trip, and every malformed field refused by name."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.policies.errors import PolicyLoadError
from service.policies.manifest import dump_manifest, load_manifest, parse_manifest

from .conftest import POLICIES_DIR

SCORER = POLICIES_DIR / "gavel-scorer"


def scorer_yaml() -> dict[str, Any]:
    data = yaml.safe_load((SCORER / "policy.yaml").read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize(
    "folder", sorted(p.parent.name for p in POLICIES_DIR.glob("*/policy.yaml"))
)
def test_round_trip(folder: str) -> None:
    m = load_manifest(POLICIES_DIR / folder / "policy.yaml")
    again = parse_manifest(yaml.safe_load(dump_manifest(m)), m.directory)
    assert again == m


def _set(path: str, value: object) -> Any:
    def edit(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = d
        for key in parents:
            target = target[int(key)] if key.isdigit() else target[key]
        if value is _DELETE:
            del target[last]
        elif last.isdigit():
            target[int(last)] = value
        else:
            target[last] = value

    return edit


_DELETE = object()

BAD = [
    ("schema", "v0", r"`schema` must be 'understudy-policy/v1', got 'v0'"),
    ("temprature", 1.0, r"`temprature` is not a manifest key"),
    ("name", "Bad Name", r"`name` must match"),
    ("name", "other-name", r"`name` must equal its directory name 'gavel-scorer'"),
    ("kind", "ranker", r"`kind` must be one of \['policy', 'predictor'\], got 'ranker'"),
    ("model.sha256", "abc", r"`model.sha256` must be 64 lowercase hex digits, got 'abc'"),
    ("model.file", _DELETE, r"`model.file` is required"),
    ("features", _DELETE, r"`features` is required"),
    ("inputs", [], r"`inputs` must list at least one tensor"),
    ("inputs.0.shape", "N", r"`inputs\[0\].shape` must be a list, got 'N'"),
    ("inputs.0.shape.1", 0, r"`inputs\[0\].shape\[1\]` must be > 0 or a name, got 0"),
    ("execution_providers", [], r"`execution_providers` must be a non-empty list"),
    ("time_budget_ms", -1, r"`time_budget_ms` must be > 0, got -1.0"),
    ("time_budget_ms", "fast", r"`time_budget_ms` must be a float, got 'fast'"),
    ("probabilities", None, r"`probabilities` must be a mapping for a policy, got None"),
    ("probabilities.rule", "boltzmann", r"`probabilities.rule` must be one of"),
    ("probabilities.temperature", 0, r"`probabilities`: `temperature` must be finite and > 0"),
    ("probabilities.defer_score", "never", r"`probabilities.defer_score` must be a number or null"),
    ("predictor", 3, r"`predictor` must be a predictor name or null, got 3"),
    ("training_data.n_rows", _DELETE, r"`training_data.n_rows` is required"),
]


@pytest.mark.parametrize(
    ("path", "value", "message"), BAD, ids=[b[0] + "-" + str(i) for i, b in enumerate(BAD)]
)
def test_bad_field_is_refused_naming_policy_and_field(
    path: str, value: object, message: str
) -> None:
    data = copy.deepcopy(scorer_yaml())
    _set(path, value)(data)
    with pytest.raises(PolicyLoadError, match=message) as info:
        parse_manifest(data, SCORER)
    assert info.value.policy in ("gavel-scorer", "other-name", "Bad Name")


def test_not_a_mapping_and_unreadable_yaml(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match="manifest must be a mapping, got list"):
        parse_manifest([1, 2], tmp_path)
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / "policy.yaml").write_text("name: [unclosed\n")
    with pytest.raises(PolicyLoadError, match=r"policy `broken`: cannot read policy.yaml"):
        load_manifest(bad / "policy.yaml")
