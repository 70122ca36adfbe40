"""`understudy compare`: both truths, separate reward/cost/reliability, identical reruns."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from service.cli.learning import learning_app
from service.environment import ContextPool
from service.learning.compare import PRODUCTION, CompareSpec, load_candidates, verdict
from service.learning.instrument import Instrumented
from service.learning.pooled import decide_on_pool, pool_batch
from service.policies.base import PolicyDecisions, ScoringBatch
from service.policies.baselines import FirstFit
from service.policies.outcome_features import OUTCOME_FEATURES

from .conftest import POLICIES_DIR

SMALL = [
    "--scenarios", "train,new_class", "--seeds", "2", "--episodes", "1",
    "--pool-episodes", "1", "--pool-worlds", "2", "--jobs-per-episode", "12",
    "--policies", "lcb-planner,iwr-scorer,first-fit", "--planner-pessimism", "0",
]  # fmt: skip
FIGURES = {
    "per_decision", "per_decision_vs_production", "on_policy", "on_policy_vs_production", "gap",
    "cost_per_decision", "cost_on_policy", "error_rate", "raw_favourite_infeasible_rate",
    "voluntary_defer_rate", "truncated_episodes", "completion_time_s", "queue_delay_s",
}  # fmt: skip


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(learning_app, ["compare", *args])
    return result.exit_code, result.output


class Broken:
    """A policy that always raises: its decisions must count as errors, not abort the run."""

    name = "broken"
    version = "0"

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        raise RuntimeError("model file went missing")


def test_a_failing_policy_is_counted_and_defers(small_pool: ContextPool) -> None:
    pooled = decide_on_pool(Broken(), small_pool)
    assert pooled.errors == small_pool.n
    assert (pooled.action_dist[:, -1] == 1.0).all()
    probe = Instrumented(Broken(), small_pool.cost_spec)
    ok = Instrumented(FirstFit(), small_pool.cost_spec)
    for p in (probe, ok):
        p.decide(pool_batch(small_pool), np.random.default_rng(0))
    assert probe.errors == probe.requests == small_pool.n and ok.errors == 0
    assert ok.cost == 0.0 and len(ok.latency_s) == 1


def test_candidates_refuse_an_unknown_name() -> None:
    with pytest.raises(ValueError, match=r"`policies` \['no-such-policy'\] did not load"):
        load_candidates(POLICIES_DIR, ["no-such-policy"])
    names = [p.name for p in load_candidates(POLICIES_DIR, None, (0.0, 2.0))]
    assert "production-mirror" not in names
    assert names[names.index("lcb-planner") + 1 :][:2] == ["lcb-planner[k=0]", "lcb-planner[k=2]"]


def test_spec_round_trips_and_refuses_unknown_settings() -> None:
    spec = CompareSpec(seeds=(1, 2), policies=("a",))
    assert CompareSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    with pytest.raises(ValueError, match=r"`spec\.sedes` is not a compare setting"):
        CompareSpec.from_dict({"sedes": [1]})
    assert verdict({"mean": 0.2, "lo": 0.1, "hi": 0.3, "n": 3}) == "wins"
    assert verdict({"mean": -0.2, "lo": -0.3, "hi": -0.1, "n": 3}) == "loses"
    assert verdict({"mean": 0.2, "lo": -0.1, "hi": 0.5, "n": 3}) == "no difference"


def test_compare_reports_both_truths_and_reruns_identically(tmp_path: Path) -> None:
    code, output = run(*SMALL, "--policies-dir", str(POLICIES_DIR), "--out", str(tmp_path / "a"))
    assert code == 0, output
    results = json.loads((tmp_path / "a" / "results.json").read_text())
    manifest = json.loads((tmp_path / "a" / "run_manifest.json").read_text())
    assert set(results["scenarios"]) == {"train", "new_class"}
    for by_policy in results["scenarios"].values():
        assert set(by_policy) == {
            PRODUCTION,
            "lcb-planner",
            "lcb-planner[k=0]",
            "iwr-scorer",
            "first-fit",
        }
        for name, summary in by_policy.items():
            if name == PRODUCTION:
                continue
            assert set(summary["intervals"]) == FIGURES
            assert summary["intervals"]["on_policy"]["n"] == 2
            assert summary["intervals"]["on_policy"]["lo"] is not None
    assert manifest["spec"]["seeds"] == [100, 101]
    assert set(manifest["policies"]) >= {"lcb-planner", "iwr-scorer", "learned-outcome"}
    assert "gavel-throughputs/isolated_throughputs.csv" in manifest["data_files"]
    assert manifest["features"][OUTCOME_FEATURES.version]
    assert "timings" not in results and (tmp_path / "a" / "timings.json").exists()

    code, output = run("--from-manifest", str(tmp_path / "a" / "run_manifest.json"),
                       "--out", str(tmp_path / "b"))  # fmt: skip
    assert code == 0, output
    assert "identical" in output
    a, b = ((tmp_path / d / "results.json").read_bytes() for d in ("a", "b"))
    assert a == b


def test_a_rerun_on_changed_policies_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "policies"
    shutil.copytree(POLICIES_DIR, root)
    args = ["--scenarios", "train", "--seeds", "1", "--episodes", "1", "--pool-episodes", "1",
            "--pool-worlds", "2", "--jobs-per-episode", "8", "--policies", "first-fit"]  # fmt: skip
    code, output = run(*args, "--policies-dir", str(root), "--out", str(tmp_path / "a"))
    assert code == 0, output
    yaml_path = root / "iwr-scorer" / "policy.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("version: 1.0.0", "version: 1.0.1"))
    code, output = run("--from-manifest", str(tmp_path / "a" / "run_manifest.json"),
                       "--out", str(tmp_path / "b"))  # fmt: skip
    assert code == 2
    assert "`policies.iwr-scorer`" in output and "refusing to rerun" in output
