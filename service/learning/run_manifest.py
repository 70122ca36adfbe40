"""What a `compare` or `sweep` run depended on, so it can be rerun and checked.

``run_manifest.json`` records the command's full spec (scenarios, seeds,
sizes, policies), the git commit (and whether the tree had uncommitted
changes), the sha256 of every shared data file the simulator reads for
those scenarios, of every policy's model and manifest, the feature
definitions' hashes, the package versions, and the sha256 of the
``results.json`` it wrote. Rerunning with ``--from-manifest`` takes the spec
from the file, refuses to run if a data file, policy or feature definition
differs (the result would not be the same experiment), and reports whether
the new ``results.json`` hashes the same.

Only read-only git commands are run (``rev-parse``, ``status --porcelain``);
without git the commit is null.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from service.contract import DEFAULT_FEATURES
from service.environment import data_dir
from service.environment.scenario import Scenario
from service.policies.manifest import MANIFEST_FILE
from service.policies.outcome_features import OUTCOME_FEATURES
from service.policies.predictor_features import PREDICTOR_FEATURES

SCHEMA = "understudy-run/v1"
PACKAGES = ("numpy", "scipy", "onnxruntime", "gymnasium", "PyYAML", "matplotlib")
REPO_ROOT = Path(__file__).resolve().parents[2]


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def data_files(scenarios: Iterable[Scenario]) -> dict[str, str]:
    """Relative path -> sha256 of every shared data file the scenarios' worlds read."""
    root = data_dir()
    paths = {
        "gavel-throughputs/isolated_throughputs.csv",
        "gavel-throughputs/colocated_pair_throughputs.csv",
        "alibaba-gpu-v2020-machine-spec/pai_machine_spec.csv",
    }
    for s in scenarios:
        paths.add(f"gavel-philly-derived-traces/{s.trace_vc}.trace")
        if s.surge:
            paths.add("philly-trace-pollux/philly.csv")
    return {p: sha256_file(root / p) for p in sorted(paths)}


def policy_files(policies_dir: Path) -> dict[str, dict[str, str]]:
    """Policy folder -> sha256 of its model file and of its manifest."""
    out = {}
    for manifest in sorted(policies_dir.glob(f"*/{MANIFEST_FILE}")):
        folder = manifest.parent
        models = sorted(p for p in folder.iterdir() if p.suffix == ".onnx")
        out[folder.name] = {
            "manifest_sha256": sha256_file(manifest),
            **{f"{m.name}_sha256": sha256_file(m) for m in models},
        }
    return out


def feature_hashes() -> dict[str, str]:
    """Feature version -> definition hash, for every feature function a policy may use."""
    return {
        f.version: f.definition_hash
        for f in (DEFAULT_FEATURES, PREDICTOR_FEATURES, OUTCOME_FEATURES)
    }


def git_state(repo: Path = REPO_ROOT) -> dict[str, Any]:
    """``{"commit": sha | None, "dirty": bool | None}`` from read-only git commands."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=repo, capture_output=True, text=True, check=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def package_versions() -> dict[str, str]:
    """Python and the numeric packages a run's numbers depend on."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def build(
    command: str,
    spec: dict[str, Any],
    scenarios: Iterable[Scenario],
    policies_dir: Path,
    results_sha256: str,
) -> dict[str, Any]:
    """The manifest document for one run."""
    return {
        "schema": SCHEMA,
        "command": command,
        "spec": spec,
        "git": git_state(),
        "data_files": data_files(scenarios),
        "policies": policy_files(policies_dir),
        "features": feature_hashes(),
        "packages": package_versions(),
        "results_sha256": results_sha256,
    }


def drift(recorded: dict[str, Any], scenarios: Iterable[Scenario], policies_dir: Path) -> list[str]:
    """What differs now from what `recorded` ran on: data, policies, features (empty = same)."""
    problems = []
    now: dict[str, dict[str, Any]] = {
        "data_files": data_files(scenarios),
        "policies": policy_files(policies_dir),
        "features": feature_hashes(),
    }
    for key, current in now.items():
        before = recorded.get(key, {})
        for name in sorted(set(before) | set(current)):
            if before.get(name) != current.get(name):
                problems.append(
                    f"`{key}.{name}` was {before.get(name)!r}, is {current.get(name)!r}"
                )
    return problems
