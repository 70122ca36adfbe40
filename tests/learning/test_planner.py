"""The LCB planner: pessimism (or a wider interval) moves choices; the registry loads it."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from numpy.typing import NDArray

from service.environment import ContextPool
from service.learning.pooled import decide_on_pool, pool_batch
from service.policies.check import check_policy
from service.policies.errors import PolicyLoadError
from service.policies.manifest import PlanningSpec, load_manifest, parse_manifest
from service.policies.planner import LcbPlanner
from service.policies.probabilities import ProbabilityRule, RuleKind
from service.policies.registry import Registry, probe_batch

from .conftest import POLICIES_DIR

ARGMAX = ProbabilityRule(RuleKind.ARGMAX)


class Fixed:
    """A row predictor that returns given quantiles, row by row."""

    def __init__(self, q: NDArray[np.float32]) -> None:
        self.q = q

    def predict_rows(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        return self.q[: len(x)]


class Widened:
    """Scales another predictor's interval by `factor` in log space around the median."""

    def __init__(self, inner: Any, factor: float) -> None:
        self.inner, self.factor = inner, factor

    def predict_rows(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        log_q = np.log(np.asarray(self.inner.predict_rows(x), dtype=np.float64))
        mid = log_q[:, 1:2]
        out: NDArray[np.float32] = np.exp(mid + self.factor * (log_q - mid)).astype(np.float32)
        return out


def planner(registry: Registry) -> LcbPlanner:
    p = registry.policies["lcb-planner"]
    assert isinstance(p, LcbPlanner)
    return p


def test_pessimism_trades_a_fast_uncertain_option_for_a_sure_one() -> None:
    batch = probe_batch()
    n = len(batch.mask)
    q = np.tile(np.array([[1.0, 2.0, 3.0]], dtype=np.float32), (n, 1))  # narrow-ish, median 2
    first = int(batch.offsets[0])
    q[first] = [0.5, 2.5, 4.0]  # faster median, much wider interval
    spec = PlanningSpec(pessimism=0.0)
    greedy = LcbPlanner("t", "1", Fixed(q), spec, ARGMAX)
    assert greedy.decide(batch, np.random.default_rng(0)).chosen[0] == 0
    careful = greedy.with_planning("t-careful", pessimism=1.0)
    chosen = careful.decide(batch, np.random.default_rng(0)).chosen[0]
    assert chosen != 0 and batch.mask[first + chosen]
    check_policy(careful, batch)


def test_registry_loads_the_planner_on_the_predictor_bytes(registry: Registry) -> None:
    p = planner(registry)
    manifest = registry.manifests["lcb-planner"]
    assert p.planning == manifest.planning and manifest.planning is not None
    assert manifest.planning.pessimism == 1.0
    sha = {n: registry.manifests[n].model_sha256 for n in ("lcb-planner", "learned-outcome")}
    assert sha["lcb-planner"] == sha["learned-outcome"]
    data = (POLICIES_DIR / "lcb-planner" / "model.onnx").read_bytes()
    assert hashlib.sha256(data).hexdigest() == sha["lcb-planner"]
    d = check_policy(p, probe_batch())
    assert d.predictions is not None and "throughput_q10" in d.predictions


def test_wider_uncertainty_changes_the_planners_choices(
    registry: Registry, small_pool: ContextPool
) -> None:
    p = planner(registry)
    base = decide_on_pool(p.with_planning("k0", pessimism=0.0), small_pool).chosen
    k1 = decide_on_pool(p, small_pool).chosen
    wide = LcbPlanner("wide", "1", Widened(p.predictor, 3.0), p.planning, ARGMAX)
    widened = decide_on_pool(wide, small_pool).chosen
    assert (k1 != base).any(), "pessimism 1 chose as the median planner everywhere"
    assert (widened != k1).any(), "a 3x wider interval changed no choice"
    batch = pool_batch(small_pool)
    for chosen in (k1, widened):
        rows = batch.offsets[:-1] + chosen
        assert batch.mask[rows[chosen < small_pool.defer_column]].all()


def _doc() -> dict[str, Any]:
    data = yaml.safe_load((POLICIES_DIR / "lcb-planner" / "policy.yaml").read_text())
    assert isinstance(data, dict)
    return data


def _set(path: str, value: Any) -> Any:
    def change(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for key in parents:
            d = d[key]
        if value is KeyError:
            del d[last]
        else:
            d[last] = value

    return change


PLANNING_ERRORS = [
    (_set("planning.pessimism", -1.0), "`planning.pessimism` must be finite and >= 0, got -1.0"),
    (_set("planning.pessimism", KeyError), "`planning.pessimism` is required"),
    (_set("planning.pesimism", 1.0), "`planning.pesimism` is not a planning key"),
    (_set("planning.packing_weight", "x"), "`planning.packing_weight` must be a float, got 'x'"),
    (_set("predictor", "learned-outcome"), "`predictor` must be null on a planning policy"),
    (_set("kind", "predictor"), "`planning` must be a mapping on a policy"),
]


@pytest.mark.parametrize(
    ("change", "message"), PLANNING_ERRORS, ids=[m for _, m in PLANNING_ERRORS]
)
def test_bad_planning_blocks_are_refused_naming_the_field(change: Any, message: str) -> None:
    doc = _doc()
    change(doc)
    with pytest.raises(PolicyLoadError) as err:
        parse_manifest(doc, Path("lcb-planner"))
    assert message in str(err.value)


def test_manifest_round_trip_keeps_planning() -> None:
    m = load_manifest(POLICIES_DIR / "lcb-planner" / "policy.yaml")
    again = parse_manifest(m.to_dict(), m.directory)
    assert again.planning == m.planning == PlanningSpec(1.0, 0.05)
    gavel = load_manifest(POLICIES_DIR / "gavel-scorer" / "policy.yaml")
    assert gavel.planning is None and "planning" not in gavel.to_dict()
