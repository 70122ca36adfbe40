"""The protocol file format as JSON Schema (draft 2020-12), for editors.

``protocols/schema.json`` is generated from this module and committed, so an
editor (VS Code's YAML extension: ``# yaml-language-server: $schema=schema.json``)
completes keys and flags typos while a protocol is written. The parser stays
the authority — the schema cannot express every rule (e.g. a reference value
required only when the baseline is production) — but it never allows a key
the parser refuses: key sets, enums and metric names come from the parser's
own tables, and ``tests/protocols`` checks the committed file is fresh.

Regenerate::

    python -m service.protocols.jsonschema protocols/schema.json
    python -m service.protocols.jsonschema --check protocols/schema.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from service.contract.outcome import FailureKind
from service.contract.reward import COST_SIGNALS, REWARD_FIELDS
from service.contract.workload import WorkloadKind
from service.protocols.fields import (
    DURATION_PATTERN,
    ID_PATTERN,
    NAME_PATTERN,
    PRINCIPAL_PATTERN,
    SHA256_PATTERN,
)
from service.protocols.parse import OPTIONAL, REQUIRED, SECTION_KEYS
from service.protocols.schema import (
    METRICS,
    PROTOCOL_SCHEMA,
    Against,
    Estimator,
    IfNotIdentifiable,
    MetricKind,
    Mode,
    SequenceMethod,
)

SCHEMA_ID = "https://understudy.invalid/schemas/understudy-protocol-v1.json"

Schema = dict[str, Any]


def _obj(section: str, properties: Mapping[str, Schema], description: str = "") -> Schema:
    """A closed object whose keys are exactly the parser's for `section`."""
    required, optional = SECTION_KEYS[section] if section else (REQUIRED, OPTIONAL)
    if set(properties) != set(required) | set(optional):
        raise ValueError(f"schema of `{section or 'protocol'}` drifted from the parser's keys")
    out: Schema = {
        "type": "object",
        "properties": dict(properties),
        "required": list(required),
        "additionalProperties": False,
    }
    if description:
        out["description"] = description
    return out


def _enum(values: list[str], description: str = "") -> Schema:
    out: Schema = {"type": "string", "enum": values}
    if description:
        out["description"] = description
    return out


def _number(description: str, **bounds: float) -> Schema:
    return {"type": "number", "description": description, **bounds}


def _weights(names: list[str], description: str) -> Schema:
    return {
        "type": "object",
        "description": description,
        "propertyNames": {"enum": names},
        "additionalProperties": {"type": "number"},
    }


def _metrics(*, data_quality: bool) -> Schema:
    names = [
        m.name for m in METRICS.values() if (m.kind is MetricKind.DATA_QUALITY) == data_quality
    ]
    described = "; ".join(f"{n}: {METRICS[n].description} ({METRICS[n].direction})" for n in names)
    return _enum(names, f"metric (better: higher/lower) — {described}")


_DURATION: Schema = {
    "description": "seconds, or a number with a unit: s, m, h, d (e.g. '14d')",
    "oneOf": [
        {"type": "number", "exclusiveMinimum": 0},
        {"type": "string", "pattern": DURATION_PATTERN},
    ],
}

_NAMES: Schema = {"type": "array", "minItems": 1, "uniqueItems": True}


def _policy(section: str, description: str) -> Schema:
    return _obj(
        section,
        {
            "policy": {"type": "string", "pattern": NAME_PATTERN, "description": "policy name"},
            "version": {"type": ["string", "number"], "description": "registered version"},
            "sha256": {
                "type": ["string", "null"],
                "pattern": SHA256_PATTERN,
                "description": "artifact sha256; null for built-in baselines",
            },
        },
        description,
    )


def _criterion() -> Schema:
    threshold = {"type": "number"}
    return {
        **_obj(
            "criterion",
            {
                "name": {"type": "string", "pattern": NAME_PATTERN},
                "metric": _metrics(data_quality=False),
                Against.LIMIT.value: {**threshold, "description": "a fixed limit of the metric"},
                Against.BASELINE.value: {
                    **threshold,
                    "minimum": 0,
                    "description": "tolerated deterioration vs the baseline",
                },
            },
            "fires when the candidate is confidently worse than the threshold",
        ),
        "oneOf": [{"required": [Against.LIMIT.value]}, {"required": [Against.BASELINE.value]}],
    }


def protocol_json_schema() -> Schema:
    """The JSON Schema of a protocol file."""
    criteria = {"type": "array", "items": {"$ref": "#/$defs/criterion"}}
    top: dict[str, Schema] = {
        "schema": {"const": PROTOCOL_SCHEMA},
        "id": {"type": "string", "pattern": ID_PATTERN},
        "version": {"type": "integer", "minimum": 1, "description": "a change is a new version"},
        "title": {"type": "string"},
        "hypothesis": {"type": "string", "minLength": 1},
        "owners": {
            **_NAMES,
            "items": {"type": "string", "pattern": PRINCIPAL_PATTERN},
            "description": "principals accountable; none of them may approve",
        },
        "mode": _enum([m.value for m in Mode]),
        "candidate": _policy("candidate", "the policy under test, pinned"),
        "baseline": {
            "oneOf": [{"const": "production"}, _policy("baseline", "a named policy")],
        },
        "reward": _obj(
            "reward",
            {"weights": _weights(list(REWARD_FIELDS), "weights over outcome fields")},
        ),
        "cost": _obj(
            "cost",
            {
                "signal_weights": _weights(
                    list(COST_SIGNALS),
                    "per constraint signal; capacity = any of accelerator_count, "
                    "accelerator_share, cpu, memory (weighed once)",
                ),
                "failure_weights": _weights([k.value for k in FailureKind], "per failure kind"),
            },
        ),
        "primary": _obj(
            "primary",
            {
                "metric": _metrics(data_quality=False),
                "minimum_detectable_effect": _number("improvement vs baseline", exclusiveMinimum=0),
            },
        ),
        "guardrails": {
            "type": "array",
            "items": _obj(
                "guardrail",
                {
                    "metric": _metrics(data_quality=False),
                    "margin": _number("largest tolerated deterioration", exclusiveMinimum=0),
                    "reference": {
                        "type": ["number", "null"],
                        "description": "fixed comparison value; omit to compare with the baseline",
                    },
                },
                "non-inferiority test",
            ),
        },
        "stop": {**criteria, "minItems": 1},
        "rollback": {**criteria, "minItems": 1, "description": "online-bounded only"},
        "data_quality": {
            "type": "array",
            "items": _obj(
                "data_quality",
                {
                    "name": {"type": "string", "pattern": NAME_PATTERN},
                    "metric": _metrics(data_quality=True),
                    Against.LIMIT.value: _number("ends the experiment as inconclusive"),
                },
            ),
        },
        "authority": _obj(
            "authority",
            {
                "traffic_fraction": _number("share of traffic", exclusiveMinimum=0, maximum=1),
                "pools": {**_NAMES, "items": {"type": "string"}},
                "workload_kinds": {**_NAMES, "items": _enum([k.value for k in WorkloadKind])},
                "max_concurrent_placements": {"type": "integer", "minimum": 1},
                "max_duration": _DURATION,
            },
            "online-bounded only: what the candidate may do",
        ),
        "minimum_samples": {"type": "integer", "minimum": 1},
        "max_duration": _DURATION,
        "alpha": _number("error budget", exclusiveMinimum=0, exclusiveMaximum=1),
        "analysis": _obj(
            "analysis",
            {
                "estimator": _enum([e.value for e in Estimator]),
                "sequence": _enum([s.value for s in SequenceMethod]),
                "if_not_identifiable": _enum([i.value for i in IfNotIdentifiable]),
            },
        ),
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "Understudy experiment protocol",
        "description": "See docs/protocols.md. The parser is the authority; this helps editors.",
        **_obj("", top),
        "$defs": {"criterion": _criterion()},
    }


def render() -> str:
    """The committed file's exact text."""
    return json.dumps(protocol_json_schema(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the schema to a path, or with ``--check`` fail when the file is stale."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="e.g. protocols/schema.json")
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.path.read_text() if args.path.exists() else ""
        if current != text:
            print(f"{args.path} is stale; run: python -m service.protocols.jsonschema {args.path}")
            return 1
        print(f"{args.path} is up to date")
        return 0
    args.path.write_text(text)
    print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
