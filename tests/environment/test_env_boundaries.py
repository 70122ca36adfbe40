"""The simulator's boundaries: what it may import, and its public names."""

from __future__ import annotations

import ast
from pathlib import Path

import service.environment as environment

PACKAGE = Path(environment.__file__).resolve().parent
ALLOWED_PROJECT = ("service.contract", "service.policies.base", "service.environment")
FORBIDDEN = (
    "fastapi",
    "grpc",
    "sqlalchemy",
    "prometheus_client",
    "onnxruntime",
    "uvicorn",
    "psycopg",
)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_core_imports_only_the_contract_and_the_policy_interface() -> None:
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) > 5
    for path in modules:
        for name in _imports(path):
            if name == "service" or name.startswith("service."):
                assert name.startswith(ALLOWED_PROJECT), f"{path.name} imports {name}"
            assert not name.startswith(FORBIDDEN), f"{path.name} imports {name}"


def test_public_names_are_pinned() -> None:
    assert sorted(environment.__all__) == sorted(
        [
            "DATA_ENV_VAR", "ENV_ID", "OUTCOME_FIELDS", "ClusterEnv", "ContextPool",
            "EmulatorMode", "EpisodeJobs", "EpisodeLog", "Estimate", "JobOutcomes",
            "LeastLoaded", "LoggedDataset", "LoggedDecision", "NodeGroup", "OnPolicyResult",
            "ProductionConfig", "ProductionEmulator", "RandomFeasible", "Randomness",
            "Replicates", "Scenario", "SharedDataMissing", "Simulator", "ThroughputAware",
            "ThroughputTable", "Truth", "World", "build_pool", "contract_request",
            "counterfactual_outcomes", "data_dir", "job_outcomes", "load_scenario",
            "load_throughputs", "load_trace", "log_episode", "new_episode", "on_policy",
            "packing_scores", "register_envs", "run_policy", "run_production", "scenario_names",
            "simulated_episodes",
        ]
    )  # fmt: skip
    for name in environment.__all__:
        assert hasattr(environment, name), name


def test_modules_stay_small() -> None:
    for path in PACKAGE.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 420, path.name


def test_scenarios_ship_inside_the_package() -> None:
    assert sorted(p.stem for p in (PACKAGE / "scenarios").glob("*.yaml")) == sorted(
        environment.scenario_names()
    )
