"""The policy sets benchmarks score: the issue's 3 ONNX policies + 3 baselines, or fewer.

The capacity model needs points at several policy counts, so the set is cut
from the real registry (`policies/`), ONNX policies first, then baselines in
a fixed order. Nothing is synthetic: these are the artifacts the service loads.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from service.policies.onnx_policy import OnnxPolicy
from service.policies.planner import LcbPlanner
from service.policies.registry import Registry, load_registry

POLICIES_DIR = Path(__file__).resolve().parents[1] / "policies"
BASELINE_ORDER = ("production-mirror", "least-loaded", "random-feasible", "first-fit", "best-fit")


def policy_set(n_onnx: int = 3, n_baselines: int = 3, root: Path = POLICIES_DIR) -> Registry:
    """The registry cut to `n_onnx` ONNX policies and `n_baselines` baselines.

    Raises:
        ValueError: fewer policies of a kind are loaded than asked for.
    """
    full = load_registry(root)
    onnx = sorted(n for n, p in full.policies.items() if isinstance(p, OnnxPolicy | LcbPlanner))
    baselines = [n for n in BASELINE_ORDER if n in full.policies]
    if len(onnx) < n_onnx or len(baselines) < n_baselines:
        refused = "; ".join(f"{n}: {e.problem}" for n, e in full.refused.items())
        raise ValueError(
            f"asked for {n_onnx} ONNX + {n_baselines} baselines; loaded {onnx} and {baselines}"
            + (f"; refused {refused}" if refused else "")
        )
    keep = onnx[:n_onnx] + baselines[:n_baselines]
    return dataclasses.replace(full, policies={n: full.policies[n] for n in keep})
