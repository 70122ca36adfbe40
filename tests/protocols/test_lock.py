"""Locking: the hash ignores form and catches meaning; a change names its fields."""

from __future__ import annotations

import copy

import pytest
import yaml

from service.protocols import (
    ProtocolLocked,
    changed_fields,
    content_hash,
    load_protocol,
    parse_protocol,
    to_document,
)
from service.protocols.lock import ensure_unchanged
from tests.protocols.conftest import SHADOW_FILE, load_doc


def test_form_does_not_change_the_hash() -> None:
    doc = load_doc(SHADOW_FILE)
    digest = content_hash(parse_protocol(doc))
    same = copy.deepcopy(doc)
    same["max_duration"] = 14 * 86400  # "14d" as seconds
    same["alpha"] = 0.050
    same["minimum_samples"] = 2000
    same["guardrails"][0]["margin"] = 5e-2
    same["owners"] = ["bob", "alice"]  # a set: order carries no meaning
    reordered = dict(reversed(list(same.items())))  # key order
    text = "# a comment\n" + yaml.safe_dump(reordered, sort_keys=True)
    assert content_hash(parse_protocol(yaml.safe_load(text))) == digest
    assert content_hash(load_protocol(SHADOW_FILE)) == digest


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("alpha",), 0.01, "alpha"),
        (("guardrails", 0, "margin"), 0.06, "guardrails[0].margin"),
        (("stop", 1, "worse_than"), 0.04, "stop[1].worse_than"),
        (("hypothesis",), "Something else.", "hypothesis"),
        (("candidate", "sha256"), "1" * 64, "candidate.sha256"),
        (("reward", "weights", "slo_met"), 2.0, "reward.weights.slo_met"),
        (("owners",), ["alice"], "owners"),
    ],
)
def test_any_change_of_meaning_changes_the_hash_and_is_named(
    path: tuple[str | int, ...], value: object, field: str
) -> None:
    doc = load_doc(SHADOW_FILE)
    before = parse_protocol(doc)
    changed = copy.deepcopy(doc)
    node = changed
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    after = parse_protocol(changed)
    assert content_hash(after) != content_hash(before)
    assert field in changed_fields(to_document(before), to_document(after))
    with pytest.raises(ProtocolLocked) as caught:
        ensure_unchanged(
            before.id, before.version, to_document(before), content_hash(before), after
        )
    assert field in caught.value.fields
    assert f"`{field}`" in str(caught.value)
    assert "needs a new `version`" in str(caught.value)


def test_changed_fields_names_added_removed_and_resized_entries() -> None:
    a = {"x": 1, "g": [{"m": 1.0}], "k": {"a": True}}
    b = {"x": 1.0, "g": [{"m": 1.0}, {"m": 2.0}], "k": {"a": 1}, "new": None}
    assert changed_fields(a, b) == ["g", "k.a", "new"]
    assert changed_fields(a, a) == []


def test_unchanged_passes() -> None:
    p = load_protocol(SHADOW_FILE)
    ensure_unchanged(p.id, p.version, to_document(p), content_hash(p), p)
