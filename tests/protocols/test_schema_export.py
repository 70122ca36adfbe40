"""protocols/schema.json: fresh, accepts every shipped protocol, refuses what the parser refuses."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
import yaml

from service.contract.errors import InvalidInput
from service.protocols import parse_protocol
from service.protocols.jsonschema import protocol_json_schema, render
from tests.protocols.conftest import PROTOCOLS_DIR, SHADOW_FILE

SCHEMA_FILE = PROTOCOLS_DIR / "schema.json"
_TYPES: dict[str, Any] = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
}
_ANNOTATIONS = {"description", "title", "$schema", "$id", "$defs"}


def errors(value: Any, schema: dict[str, Any], root: dict[str, Any], at: str = "$") -> list[str]:
    """A small JSON Schema (2020-12) subset validator: the keywords our schema uses, no more.

    An unknown keyword is an error, so the validator can never silently skip a rule.
    """
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        schema = {**root["$defs"][name], **{k: v for k, v in schema.items() if k != "$ref"}}
    out: list[str] = []
    for key, rule in schema.items():
        if key in _ANNOTATIONS:
            continue
        if key == "type":
            kinds = rule if isinstance(rule, list) else [rule]
            ok = any(
                isinstance(value, _TYPES[k]) and not (isinstance(value, bool) and k != "boolean")
                for k in kinds
            )
            if not ok:
                return [f"{at}: not {rule}"]
        elif key == "const" and value != rule:
            out.append(f"{at}: not {rule!r}")
        elif key == "enum" and value not in rule:
            out.append(f"{at}: {value!r} not in enum")
        elif key == "properties" and isinstance(value, dict):
            for name, sub in rule.items():
                if name in value:
                    out += errors(value[name], sub, root, f"{at}.{name}")
        elif key == "required" and isinstance(value, dict):
            out += [f"{at}.{name}: required" for name in rule if name not in value]
        elif key == "additionalProperties" and isinstance(value, dict):
            extra = [k for k in value if k not in schema.get("properties", {})]
            for k in extra:
                out += [f"{at}.{k}: not allowed"] if rule is False else errors(value[k], rule, root)
        elif key == "propertyNames" and isinstance(value, dict):
            for k in value:
                out += errors(k, rule, root, f"{at}.{k} (name)")
        elif key == "items" and isinstance(value, list):
            for i, item in enumerate(value):
                out += errors(item, rule, root, f"{at}[{i}]")
        elif key == "minItems" and isinstance(value, list) and len(value) < rule:
            out.append(f"{at}: fewer than {rule} items")
        elif (
            key == "uniqueItems"
            and isinstance(value, list)
            and len(set(map(repr, value))) < len(value)
        ):
            out.append(f"{at}: repeated items")
        elif key == "pattern" and isinstance(value, str) and not re.search(rule, value):
            out.append(f"{at}: does not match {rule}")
        elif key == "minLength" and isinstance(value, str) and len(value) < rule:
            out.append(f"{at}: too short")
        elif key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if isinstance(value, int | float) and not isinstance(value, bool):
                bad = {
                    "minimum": value < rule,
                    "maximum": value > rule,
                    "exclusiveMinimum": value <= rule,
                    "exclusiveMaximum": value >= rule,
                }[key]
                if bad:
                    out.append(f"{at}: violates {key} {rule}")
        elif key == "oneOf":
            passing = [s for s in rule if not errors(value, s, root, at)]
            if len(passing) != 1:
                out.append(f"{at}: matches {len(passing)} of oneOf")
        elif key not in {
            "properties",
            "required",
            "additionalProperties",
            "propertyNames",
            "items",
            "minItems",
            "uniqueItems",
            "pattern",
            "minLength",
            "const",
            "enum",
        }:
            raise AssertionError(f"validator does not know keyword {key!r}")
    return out


def test_committed_schema_is_fresh() -> None:
    assert SCHEMA_FILE.read_text() == render(), (
        "run: python -m service.protocols.jsonschema protocols/schema.json"
    )


@pytest.mark.parametrize("path", sorted(PROTOCOLS_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_protocol_matches_the_schema(path: Any) -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    assert errors(yaml.safe_load(path.read_text()), schema, schema) == []


BAD = [
    ("unknown key", lambda d: d.update(gaurdrails=[])),
    ("unknown metric", lambda d: d["guardrails"][1].update(metric="happiness")),
    ("alpha as text", lambda d: d.update(alpha="0.05")),
    ("alpha out of range", lambda d: d.update(alpha=1.5)),
    ("negative margin", lambda d: d["guardrails"][0].update(margin=-0.05)),
    ("missing candidate", lambda d: d.pop("candidate")),
    ("both thresholds", lambda d: d["stop"][1].update(worse_than_baseline_by=0.1)),
    ("bad duration", lambda d: d.update(max_duration="two weeks")),
    ("unknown reward field", lambda d: d["reward"].update(weights={"happiness": 1})),
    ("bool as number", lambda d: d.update(minimum_samples=True)),
]


@pytest.mark.parametrize("mutate", [pytest.param(m, id=n) for n, m in BAD])
def test_the_schema_refuses_what_the_parser_refuses(mutate: Any) -> None:
    doc = yaml.safe_load(SHADOW_FILE.read_text())
    mutate(doc)
    with pytest.raises(InvalidInput):
        parse_protocol(copy.deepcopy(doc))
    schema = protocol_json_schema()
    assert errors(doc, schema, schema) != []


def test_schema_keys_are_the_parsers() -> None:
    from service.protocols.parse import OPTIONAL, REQUIRED, SECTION_KEYS

    schema = protocol_json_schema()
    assert set(schema["properties"]) == set(REQUIRED) | set(OPTIONAL)
    assert schema["required"] == list(REQUIRED)
    authority = schema["properties"]["authority"]
    assert set(authority["properties"]) == set(SECTION_KEYS["authority"][0])
