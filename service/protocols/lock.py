"""Locking: a protocol's canonical content hash, and what changed when it differs.

"Predeclared" means nothing if the file can be edited after the data came in.
The store records the canonical document and its hash the first time an
``(id, version)`` is seen; any later document under the same key must hash
the same, or it is refused with `ProtocolLocked` naming the changed fields. A
changed protocol is a new version, which is a new experiment.

The hash is over the *parsed* protocol, not the file's bytes: comments,
key order, ``14d`` vs ``1209600`` and ``1`` vs ``1.0`` do not count as
changes; any change of meaning does. Canonical JSON: keys sorted, no
whitespace, UTF-8, no NaN::

    content_sha256 = sha256(json.dumps(document, sort_keys=True, separators=(",", ":")))
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from service.contract.errors import Conflict
from service.protocols.schema import PROTOCOL_SCHEMA, Criterion, PolicyRef, Protocol


class ProtocolLocked(Conflict):
    """Raised when a document differs from the one recorded under the same id and version."""

    def __init__(
        self, protocol_id: str, version: int, recorded: str, given: str, fields: list[str]
    ) -> None:
        self.protocol_id = protocol_id
        self.version = version
        self.fields = tuple(fields)
        named = ", ".join(f"`{f}`" for f in fields[:12]) + (" …" if len(fields) > 12 else "")
        super().__init__(
            f"protocol `{protocol_id}` version {version} is locked (sha256 {recorded[:12]}); "
            f"this document (sha256 {given[:12]}) changes {named}; "
            "a changed protocol needs a new `version`"
        )


def _policy(ref: PolicyRef) -> dict[str, Any]:
    return {"policy": ref.name, "version": ref.version, "sha256": ref.sha256}


def _criterion(c: Criterion) -> dict[str, Any]:
    return {"name": c.name, "metric": c.metric, c.against.value: c.threshold}


def to_document(protocol: Protocol) -> dict[str, Any]:
    """The canonical document: YAML keys, normalised values; `parse_protocol` reads it back."""
    p = protocol
    doc: dict[str, Any] = {
        "schema": PROTOCOL_SCHEMA,
        "id": p.id,
        "version": p.version,
        "title": p.title,
        "hypothesis": p.hypothesis,
        "owners": list(p.owners),
        "mode": p.mode.value,
        "candidate": _policy(p.candidate),
        "baseline": "production" if p.baseline.policy is None else _policy(p.baseline.policy),
        "reward": {"weights": dict(p.reward.weights)},
        "cost": {
            "signal_weights": dict(p.cost.signal_weights),
            "failure_weights": dict(p.cost.failure_weights),
        },
        "primary": {
            "metric": p.primary.metric,
            "minimum_detectable_effect": p.primary.minimum_detectable_effect,
        },
        "guardrails": [
            {"metric": g.metric, "margin": g.margin, "reference": g.reference} for g in p.guardrails
        ],
        "stop": [_criterion(c) for c in p.stop],
        "data_quality": [_criterion(c) for c in p.data_quality],
        "minimum_samples": p.minimum_samples,
        "max_duration": p.max_duration_s,
        "alpha": p.alpha,
        "analysis": {
            "estimator": p.analysis.estimator.value,
            "sequence": p.analysis.sequence.value,
            "if_not_identifiable": p.analysis.if_not_identifiable.value,
        },
    }
    if p.authority is not None:
        a = p.authority
        doc["rollback"] = [_criterion(c) for c in p.rollback]
        doc["authority"] = {
            "traffic_fraction": a.traffic_fraction,
            "pools": list(a.pools),
            "workload_kinds": list(a.workload_kinds),
            "max_concurrent_placements": a.max_concurrent_placements,
            "max_duration": a.max_duration_s,
        }
    return doc


def canonical_json(document: Mapping[str, Any]) -> bytes:
    """The bytes that are hashed."""
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def content_hash(protocol: Protocol) -> str:
    """sha256 hex of the canonical document."""
    return hashlib.sha256(canonical_json(to_document(protocol))).hexdigest()


def changed_fields(recorded: object, given: object, path: str = "") -> list[str]:
    """Dotted paths where two canonical documents differ, e.g. ``guardrails[0].margin``.

    A key present on one side only counts as changed; lists of different
    length name the list itself plus the differing common entries.
    """
    if isinstance(recorded, Mapping) and isinstance(given, Mapping):
        out: list[str] = []
        for key in sorted(set(recorded) | set(given), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in recorded or key not in given:
                out.append(sub)
            else:
                out.extend(changed_fields(recorded[key], given[key], sub))
        return out
    if isinstance(recorded, list) and isinstance(given, list):
        out = [path] if len(recorded) != len(given) else []
        for i, (a, b) in enumerate(zip(recorded, given, strict=False)):
            out.extend(changed_fields(a, b, f"{path}[{i}]"))
        return out
    same = type(recorded) is type(given) and recorded == given
    numbers = isinstance(recorded, int | float) and isinstance(given, int | float)
    if same or (numbers and not isinstance(recorded, bool) and recorded == given):
        return []
    return [path or "protocol"]


def ensure_unchanged(
    protocol_id: str, version: int, recorded: Mapping[str, Any], recorded_hash: str, given: Protocol
) -> None:
    """Raise `ProtocolLocked` unless `given` hashes to `recorded_hash`."""
    digest = content_hash(given)
    if digest != recorded_hash:
        fields = changed_fields(recorded, to_document(given)) or ["protocol"]
        raise ProtocolLocked(protocol_id, version, recorded_hash, digest, fields)
