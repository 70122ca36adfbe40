"""``policies/<name>/policy.yaml``: what an artifact is, and how to trust it.

A manifest pins the model file by sha256, the feature definition by version
and hash, the tensor names and shapes, the providers to try, the time budget,
how scores become probabilities, the predictor a policy uses, and a summary of
the training data for later drift checks. Parsing is strict — an unknown key
is refused, so a typo cannot silently switch a setting off — and every error
names the policy and the field::

    policy `gavel-scorer`: `inputs[0].shape` must be a list, got 'N'

Example (abridged)::

    schema: understudy-policy/v1
    name: gavel-scorer
    version: 1.0.0
    kind: policy                     # or: predictor
    model: {file: model.onnx, sha256: 3f1c...}
    features: {version: features-v2, definition_hash: 9ab0...}
    inputs:  [{name: features, dtype: float32, shape: [N, 39]}]
    outputs: [{name: scores, dtype: float32, shape: [N, 1]}]
    execution_providers: [CUDAExecutionProvider, CPUExecutionProvider]
    time_budget_ms: 20
    probabilities: {rule: softmax, temperature: 0.25, epsilon: 0.0, defer_score: null}
    predictor: gavel-throughput
    training_data: {n_rows: ..., feature_means: {...}, feature_quantiles: {...},
                    hardware_classes: [K80, P100, V100], workload_kinds: [train]}
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from service.policies.errors import PolicyLoadError
from service.policies.probabilities import ProbabilityRule, RuleKind

MANIFEST_SCHEMA = "understudy-policy/v1"
MANIFEST_FILE = "policy.yaml"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_KEYS = frozenset(
    {
        "schema",
        "name",
        "version",
        "kind",
        "description",
        "model",
        "features",
        "inputs",
        "outputs",
        "execution_providers",
        "time_budget_ms",
        "probabilities",
        "predictor",
        "planning",
        "training_data",
        "evaluation",
        "build",
    }
)


class ManifestKind(StrEnum):
    """What the artifact computes."""

    POLICY = "policy"
    PREDICTOR = "predictor"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One model input or output; a string dimension (``"N"``) is the batch axis."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]

    def to_dict(self) -> dict[str, Any]:
        """YAML-ready form."""
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True, slots=True)
class PlanningSpec:
    """How a planning policy turns its own outcome predictions into scores.

    Present only on a policy that predicts with its own model instead of
    scoring contract features (`service.policies.planner`). Per option, in log
    throughput: ``score = mid - pessimism * (mid - lo) - packing_weight * free_after``.

    Attributes:
        pessimism: 0 plans on the median; 1 on the predictor's (conformal) low
            quantile; above 1 extrapolates the interval further down.
        packing_weight: a small preference for tight fits (contract feature
            ``free_after``), so near-ties go to the fuller node.
    """

    pessimism: float
    packing_weight: float = 0.0

    def to_dict(self) -> dict[str, float]:
        """YAML-ready form."""
        return {"pessimism": self.pessimism, "packing_weight": self.packing_weight}


@dataclass(frozen=True, slots=True)
class TrainingSummary:
    """What the model saw when it was fitted, for drift checks later.

    Attributes:
        source: where the rows came from, in words.
        n_rows: rows fitted on.
        feature_means: per input column name, the training mean.
        feature_quantiles: ``{"q05": {...}, "q50": {...}, "q95": {...}}`` per column.
        hardware_classes: hardware class names present in training.
        workload_kinds: workload kinds present in training.
        model_families: model families present in training.
    """

    source: str
    n_rows: int
    feature_means: Mapping[str, float]
    feature_quantiles: Mapping[str, Mapping[str, float]]
    hardware_classes: tuple[str, ...]
    workload_kinds: tuple[str, ...]
    model_families: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """YAML-ready form."""
        return {
            "source": self.source,
            "n_rows": self.n_rows,
            "feature_means": dict(self.feature_means),
            "feature_quantiles": {k: dict(v) for k, v in self.feature_quantiles.items()},
            "hardware_classes": list(self.hardware_classes),
            "workload_kinds": list(self.workload_kinds),
            "model_families": list(self.model_families),
        }


@dataclass(frozen=True)
class Manifest:
    """A parsed, schema-checked manifest. Artifact checks happen in the registry."""

    name: str
    version: str
    kind: ManifestKind
    description: str
    model_file: str
    model_sha256: str
    feature_version: str
    feature_hash: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    execution_providers: tuple[str, ...]
    time_budget_ms: float
    probabilities: ProbabilityRule | None
    predictor: str | None
    training_data: TrainingSummary
    evaluation: Mapping[str, Any] = field(default_factory=dict)
    build: Mapping[str, Any] = field(default_factory=dict)
    directory: Path = Path(".")
    planning: PlanningSpec | None = None

    @property
    def model_path(self) -> Path:
        """The model file, resolved against the manifest's directory."""
        return self.directory / self.model_file

    def to_dict(self) -> dict[str, Any]:
        """YAML-ready form; `load_manifest` of its dump gives an equal manifest."""
        rule = self.probabilities
        planning = {} if self.planning is None else {"planning": self.planning.to_dict()}
        return {
            "schema": MANIFEST_SCHEMA,
            "name": self.name,
            "version": self.version,
            "kind": str(self.kind),
            "description": self.description,
            "model": {"file": self.model_file, "sha256": self.model_sha256},
            "features": {"version": self.feature_version, "definition_hash": self.feature_hash},
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "execution_providers": list(self.execution_providers),
            "time_budget_ms": self.time_budget_ms,
            "probabilities": None
            if rule is None
            else {
                "rule": str(rule.kind),
                "temperature": rule.temperature,
                "epsilon": rule.epsilon,
                "defer_score": rule.defer_score,
            },
            "predictor": self.predictor,
            **planning,
            "training_data": self.training_data.to_dict(),
            "evaluation": dict(self.evaluation),
            "build": dict(self.build),
        }


class _Reader:
    """Typed access to a YAML mapping that raises `PolicyLoadError` naming the field."""

    def __init__(self, policy: str) -> None:
        self.policy = policy

    def fail(self, where: str, problem: str) -> PolicyLoadError:
        return PolicyLoadError(self.policy, f"`{where}` {problem}")

    def get(self, data: Mapping[str, Any], key: str, kind: type, where: str = "") -> Any:
        path = f"{where}.{key}" if where else key
        if key not in data:
            raise self.fail(path, "is required")
        value = data[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise self.fail(path, f"must be a {kind.__name__}, got {value!r}")
        return value

    def tensors(self, data: Mapping[str, Any], key: str) -> tuple[TensorSpec, ...]:
        items = self.get(data, key, list)
        if not items:
            raise self.fail(key, "must list at least one tensor")
        specs = []
        for i, item in enumerate(items):
            where = f"{key}[{i}]"
            if not isinstance(item, dict):
                raise self.fail(where, f"must be a mapping, got {item!r}")
            shape = self.get(item, "shape", list, where)
            for d, dim in enumerate(shape):
                if not (isinstance(dim, str) or (isinstance(dim, int) and dim > 0)):
                    raise self.fail(f"{where}.shape[{d}]", f"must be > 0 or a name, got {dim!r}")
            specs.append(
                TensorSpec(
                    self.get(item, "name", str, where),
                    self.get(item, "dtype", str, where),
                    tuple(shape),
                )
            )
        return tuple(specs)

    def rule(self, data: Mapping[str, Any]) -> ProbabilityRule:
        where = "probabilities"
        kind = self.get(data, "rule", str, where)
        if kind not in set(RuleKind):
            allowed = sorted(str(k) for k in RuleKind)
            raise self.fail(f"{where}.rule", f"must be one of {allowed}, got {kind!r}")
        defer = data.get("defer_score")
        if defer is not None and (isinstance(defer, bool) or not isinstance(defer, int | float)):
            raise self.fail(f"{where}.defer_score", f"must be a number or null, got {defer!r}")
        try:
            return ProbabilityRule(
                kind=RuleKind(kind),
                temperature=float(data.get("temperature", 1.0)),
                epsilon=float(data.get("epsilon", 0.0)),
                defer_score=None if defer is None else float(defer),
            )
        except (TypeError, ValueError) as exc:
            raise PolicyLoadError(self.policy, f"`{where}`: {exc}") from exc

    def planning(self, data: Mapping[str, Any]) -> PlanningSpec:
        unknown = sorted(set(data) - {"pessimism", "packing_weight"})
        if unknown:
            raise self.fail(f"planning.{unknown[0]}", "is not a planning key")
        spec = PlanningSpec(
            pessimism=self.get(data, "pessimism", float, "planning"),
            packing_weight=self.get(
                {"packing_weight": 0.0, **data}, "packing_weight", float, "planning"
            ),
        )
        for key, value in spec.to_dict().items():
            if not (math.isfinite(value) and value >= 0):
                raise self.fail(f"planning.{key}", f"must be finite and >= 0, got {value!r}")
        return spec

    def summary(self, data: Mapping[str, Any]) -> TrainingSummary:
        where = "training_data"
        means = self.get(data, "feature_means", dict, where)
        quantiles = self.get(data, "feature_quantiles", dict, where)
        return TrainingSummary(
            source=self.get(data, "source", str, where),
            n_rows=self.get(data, "n_rows", int, where),
            feature_means={str(k): float(v) for k, v in means.items()},
            feature_quantiles={
                str(q): {str(k): float(v) for k, v in cols.items()} for q, cols in quantiles.items()
            },
            hardware_classes=tuple(self.get(data, "hardware_classes", list, where)),
            workload_kinds=tuple(self.get(data, "workload_kinds", list, where)),
            model_families=tuple(data.get("model_families", [])),
        )


def parse_manifest(data: object, directory: Path) -> Manifest:
    """Check a loaded YAML document against the schema and build a `Manifest`."""
    fallback = directory.name
    if not isinstance(data, dict):
        raise PolicyLoadError(fallback, f"manifest must be a mapping, got {type(data).__name__}")
    r = _Reader(str(data.get("name", fallback)))
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise r.fail(unknown[0], f"is not a manifest key (allowed: {', '.join(sorted(_KEYS))})")
    if data.get("schema") != MANIFEST_SCHEMA:
        raise r.fail("schema", f"must be {MANIFEST_SCHEMA!r}, got {data.get('schema')!r}")
    name = r.get(data, "name", str)
    if not _NAME.match(name):
        raise r.fail("name", f"must match {_NAME.pattern}, got {name!r}")
    if name != directory.name:
        raise r.fail("name", f"must equal its directory name {directory.name!r}, got {name!r}")
    kind = r.get(data, "kind", str)
    if kind not in set(ManifestKind):
        allowed = sorted(str(k) for k in ManifestKind)
        raise r.fail("kind", f"must be one of {allowed}, got {kind!r}")
    model = r.get(data, "model", dict)
    sha = r.get(model, "sha256", str, "model")
    if not _SHA256.match(sha):
        raise r.fail("model.sha256", f"must be 64 lowercase hex digits, got {sha!r}")
    features = r.get(data, "features", dict)
    providers = r.get(data, "execution_providers", list)
    if not providers or not all(isinstance(p, str) for p in providers):
        raise r.fail("execution_providers", f"must be a non-empty list of names, got {providers!r}")
    budget = r.get(data, "time_budget_ms", float)
    if not budget > 0:
        raise r.fail("time_budget_ms", f"must be > 0, got {budget}")
    probs = data.get("probabilities")
    if kind == ManifestKind.POLICY and not isinstance(probs, dict):
        raise r.fail("probabilities", f"must be a mapping for a policy, got {probs!r}")
    predictor = data.get("predictor")
    if predictor is not None and not isinstance(predictor, str):
        raise r.fail("predictor", f"must be a predictor name or null, got {predictor!r}")
    planning = data.get("planning")
    if planning is not None and (kind != ManifestKind.POLICY or not isinstance(planning, dict)):
        raise r.fail("planning", f"must be a mapping on a policy, got {planning!r}")
    if planning is not None and predictor is not None:
        raise r.fail("predictor", "must be null on a planning policy (it predicts with its model)")
    return Manifest(
        name=name,
        version=str(r.get(data, "version", str)),
        kind=ManifestKind(kind),
        description=str(data.get("description", "")),
        model_file=r.get(model, "file", str, "model"),
        model_sha256=sha,
        feature_version=r.get(features, "version", str, "features"),
        feature_hash=r.get(features, "definition_hash", str, "features"),
        inputs=r.tensors(data, "inputs"),
        outputs=r.tensors(data, "outputs"),
        execution_providers=tuple(providers),
        time_budget_ms=budget,
        probabilities=r.rule(probs) if isinstance(probs, dict) else None,
        predictor=predictor,
        training_data=r.summary(r.get(data, "training_data", dict)),
        evaluation=dict(data.get("evaluation") or {}),
        build=dict(data.get("build") or {}),
        directory=directory,
        planning=None if planning is None else r.planning(planning),
    )


def load_manifest(path: Path) -> Manifest:
    """Read and parse ``policy.yaml`` at `path`; the policy is named after its folder."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PolicyLoadError(path.parent.name, f"cannot read {path.name}: {exc}") from exc
    return parse_manifest(data, path.parent)


def dump_manifest(manifest: Manifest) -> str:
    """The manifest as YAML text, keys in schema order."""
    return yaml.safe_dump(manifest.to_dict(), sort_keys=False, width=100)
