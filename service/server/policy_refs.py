"""The policies a protocol may name, as `PolicyRef`s: from a loaded registry, or offline.

Composition code: it reads the policy registry and its manifests, which the
protocols package (core) must not import — a protocol is checked against
whatever `PolicyRef`s it is handed (`service.protocols.check_protocol`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from service.policies.baselines import BASELINE_VERSION, builtin_baselines
from service.policies.errors import PolicyLoadError
from service.policies.manifest import MANIFEST_FILE, ManifestKind, load_manifest
from service.protocols.schema import PolicyRef

if TYPE_CHECKING:  # the registry imports onnxruntime; the offline path must not
    from service.policies.registry import Registry

GREEDY_PREDICTOR = "gavel-throughput"
"""`service.policies.registry.DEFAULT_PREDICTOR`, named here so offline checks skip onnxruntime."""


def policy_refs(registry: Registry) -> dict[str, PolicyRef]:
    """Registered policies of a loaded registry: ONNX ones with their sha256, baselines without."""
    out: dict[str, PolicyRef] = {}
    for name, policy in registry.policies.items():
        manifest = registry.manifests.get(name)
        out[name] = PolicyRef(name, policy.version, manifest.model_sha256 if manifest else None)
    return out


def policy_refs_from_directory(root: Path) -> dict[str, PolicyRef]:
    """What `load_registry(root)` would register, from manifests and file hashes only.

    For offline validation without starting ONNX Runtime: a manifest whose
    model file does not hash to its declared sha256 is left out, as the
    registry would refuse it. Built-in baselines are included (throughput-greedy
    only when its predictor is present).
    """
    out = {b.name: PolicyRef(b.name, BASELINE_VERSION) for b in builtin_baselines()}
    for path in sorted(root.glob(f"*/{MANIFEST_FILE}")):
        try:
            m = load_manifest(path)
            intact = hashlib.sha256(m.model_path.read_bytes()).hexdigest() == m.model_sha256
        except (PolicyLoadError, OSError):
            continue
        if not intact:
            continue
        if m.kind is ManifestKind.POLICY:
            out[m.name] = PolicyRef(m.name, m.version, m.model_sha256)
        elif m.name == GREEDY_PREDICTOR:
            out["throughput-greedy"] = PolicyRef("throughput-greedy", BASELINE_VERSION)
    return out
