"""Candidate placement policies: the Policy interface, baselines, ONNX policies, registry.

Importing this package stays light (numpy, PyYAML): the ONNX Runtime names —
`load_registry`, `Registry`, `OnnxModel`, `OnnxPolicy`, `OnnxPredictor` — are
resolved on first use, so the simulator or offline tools that only need the
baselines and `check_policy` never load onnxruntime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from service.policies.base import DecisionStatus, Policy, PolicyDecisions, ScoringBatch
from service.policies.baselines import (
    BestFit,
    FirstFit,
    LeastLoaded,
    ProductionMirror,
    RandomFeasible,
    ThroughputGreedy,
    builtin_baselines,
)
from service.policies.batching import make_batch
from service.policies.check import check_policy, check_predictor
from service.policies.errors import (
    PolicyConformanceError,
    PolicyError,
    PolicyLoadError,
    PolicyScoringError,
)
from service.policies.manifest import Manifest, ManifestKind, load_manifest
from service.policies.predictor import PREDICTION_NAMES, Predictor
from service.policies.predictor_features import PREDICTOR_FEATURES, parse_job_type
from service.policies.probabilities import ProbabilityRule, RuleKind, decide_from_scores
from service.policies.runner import PolicyRun, decide_all, decide_isolated

if TYPE_CHECKING:
    from service.policies.onnx_policy import OnnxModel, OnnxPolicy, OnnxPredictor
    from service.policies.registry import Registry, load_registry

_LAZY = {
    "OnnxModel": "service.policies.onnx_policy",
    "OnnxPolicy": "service.policies.onnx_policy",
    "OnnxPredictor": "service.policies.onnx_policy",
    "Registry": "service.policies.registry",
    "load_registry": "service.policies.registry",
}


def __getattr__(name: str) -> Any:
    """Import the ONNX Runtime side on first access."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PREDICTION_NAMES",
    "PREDICTOR_FEATURES",
    "BestFit",
    "DecisionStatus",
    "FirstFit",
    "LeastLoaded",
    "Manifest",
    "ManifestKind",
    "OnnxModel",
    "OnnxPolicy",
    "OnnxPredictor",
    "Policy",
    "PolicyConformanceError",
    "PolicyDecisions",
    "PolicyError",
    "PolicyLoadError",
    "PolicyRun",
    "PolicyScoringError",
    "Predictor",
    "ProbabilityRule",
    "ProductionMirror",
    "RandomFeasible",
    "Registry",
    "RuleKind",
    "ScoringBatch",
    "ThroughputGreedy",
    "builtin_baselines",
    "check_policy",
    "check_predictor",
    "decide_all",
    "decide_from_scores",
    "decide_isolated",
    "load_manifest",
    "load_registry",
    "make_batch",
    "parse_job_type",
]
