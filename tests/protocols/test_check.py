"""`check_protocol`: registered policies, production's logs, and every shipped protocol."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.contract.errors import InvalidInput
from service.protocols import (
    Finding,
    LoggingProfile,
    PolicyRef,
    ProtocolInvalid,
    Severity,
    check_protocol,
    load_protocol,
    parse_protocol,
    validate_document,
)
from service.server.policy_refs import GREEDY_PREDICTOR, policy_refs
from tests.protocols.conftest import (
    DETERMINISTIC,
    NO_PROPENSITIES,
    ONLINE_FILE,
    PROTOCOLS_DIR,
    REPO,
    SHADOW_FILE,
    STOCHASTIC,
    load_doc,
)

EXAMPLES = sorted(PROTOCOLS_DIR.glob("*.yaml"))
OTHER_SHA = "0" * 64


def test_the_shipped_protocols_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"gavel-scorer-shadow.yaml", "gavel-scorer-online.yaml"} <= names
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_check_protocol_passes_every_shipped_protocol(
    path: Path, refs: dict[str, PolicyRef]
) -> None:
    protocol = load_protocol(path)
    warnings = check_protocol(protocol, policies=refs, logging=STOCHASTIC)
    assert all(w.severity is Severity.WARNING for w in warnings)
    # Each example pins a policy that is registered now, at the declared sha256.
    assert refs[protocol.candidate.name] == protocol.candidate


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_shipped_protocol_is_refused_on_a_deterministic_production(
    path: Path, refs: dict[str, PolicyRef]
) -> None:
    with pytest.raises(ProtocolInvalid, match="deterministic"):
        check_protocol(load_protocol(path), policies=refs, logging=DETERMINISTIC)


def _doc(path: Path, **changes: Any) -> dict[str, Any]:
    doc = load_doc(path)
    for dotted, value in changes.items():
        section, _, key = dotted.partition("__")
        if key:
            doc[section][key] = value
        else:
            doc[section] = value
    return doc


CASES: list[tuple[str, dict[str, Any], LoggingProfile | None, str, str]] = [
    # (case, changes to the shadow example, production's logs, field, fragment)
    (
        "sha256 not the registered one",
        {"candidate__sha256": OTHER_SHA},
        STOCHASTIC,
        "candidate.sha256",
        "does not match the registered `gavel-scorer@1.0.0`",
    ),
    (
        "version not the registered one",
        {"candidate__version": "2.0.0"},
        STOCHASTIC,
        "candidate.version",
        "must be the registered version '1.0.0'",
    ),
    (
        "candidate not registered",
        {"candidate__policy": "gavel-scorer-2"},
        STOCHASTIC,
        "candidate.policy",
        "is not a registered policy",
    ),
    (
        "baseline not registered",
        {"baseline": {"policy": "oracle", "version": "1"}},
        STOCHASTIC,
        "baseline.policy",
        "`oracle` is not a registered policy",
    ),
    (
        "deterministic production",
        {},
        DETERMINISTIC,
        "primary.metric",
        "production is deterministic",
    ),
    (
        "production logs no propensities",
        {},
        NO_PROPENSITIES,
        "primary.metric",
        "production logs no propensities",
    ),
]


@pytest.mark.parametrize(
    ("changes", "logging", "field", "fragment"),
    [pytest.param(c, lg, f, t, id=name) for name, c, lg, f, t in CASES],
)
def test_protocols_that_cannot_run_here_are_refused_naming_the_field(
    changes: dict[str, Any],
    logging: LoggingProfile | None,
    field: str,
    fragment: str,
    refs: dict[str, PolicyRef],
) -> None:
    protocol = parse_protocol(_doc(SHADOW_FILE, **changes))
    with pytest.raises(ProtocolInvalid) as caught:
        check_protocol(protocol, policies=refs, logging=logging)
    assert caught.value.field == field
    assert fragment in str(caught.value)
    assert isinstance(caught.value, InvalidInput)


def test_a_builtin_candidate_given_a_sha256_is_refused(refs: dict[str, PolicyRef]) -> None:
    doc = load_doc(PROTOCOLS_DIR / "throughput-greedy-shadow.yaml")
    doc["candidate"]["sha256"] = OTHER_SHA
    with pytest.raises(ProtocolInvalid, match="none \\(built into the code\\)"):
        check_protocol(parse_protocol(doc), policies=refs, logging=STOCHASTIC)


def test_all_problems_are_reported_at_once(refs: dict[str, PolicyRef]) -> None:
    protocol = parse_protocol(_doc(SHADOW_FILE, candidate__sha256=OTHER_SHA))
    with pytest.raises(ProtocolInvalid) as caught:
        check_protocol(protocol, policies=refs, logging=DETERMINISTIC)
    fields = [f.field for f in caught.value.findings if f.severity is Severity.ERROR]
    assert fields == ["candidate.sha256", "primary.metric"]
    assert "(and 1 more)" in str(caught.value)


def test_deterministic_production_names_every_off_policy_criterion(
    refs: dict[str, PolicyRef],
) -> None:
    with pytest.raises(ProtocolInvalid) as caught:
        check_protocol(load_protocol(SHADOW_FILE), policies=refs, logging=DETERMINISTIC)
    message = str(caught.value)
    for field in ("`guardrails[0].metric`", "`stop[0].metric`"):
        assert field in message


def test_flag_as_declared_records_a_warning_instead(refs: dict[str, PolicyRef]) -> None:
    doc = _doc(SHADOW_FILE)
    doc["analysis"]["if_not_identifiable"] = "flag"
    warnings = check_protocol(parse_protocol(doc), policies=refs, logging=DETERMINISTIC)
    assert [w.field for w in warnings] == ["primary.metric"]
    assert "flagged as declared" in warnings[0].message


def test_model_based_estimator_needs_no_propensities_but_says_so(
    refs: dict[str, PolicyRef],
) -> None:
    doc = _doc(SHADOW_FILE)
    doc["analysis"]["estimator"] = "dm"
    warnings = check_protocol(parse_protocol(doc), policies=refs, logging=NO_PROPENSITIES)
    assert [w.field for w in warnings] == ["analysis.estimator"]
    assert "model-based" in warnings[0].message


@pytest.mark.parametrize(
    ("logging", "fragment"),
    [(None, "production's logs unknown"), (LoggingProfile(0, 0, 0), "no production decisions")],
)
def test_unknown_logs_are_a_warning(
    logging: LoggingProfile | None, fragment: str, refs: dict[str, PolicyRef]
) -> None:
    warnings = check_protocol(load_protocol(SHADOW_FILE), policies=refs, logging=logging)
    assert [fragment in w.message for w in warnings] == [True]


def test_unknown_policies_refuse_online_but_warn_in_shadow() -> None:
    shadow = check_protocol(load_protocol(SHADOW_FILE), policies=None, logging=STOCHASTIC)
    assert [w.field for w in shadow] == ["candidate"]
    with pytest.raises(ProtocolInvalid) as caught:
        check_protocol(load_protocol(ONLINE_FILE), policies=None, logging=STOCHASTIC)
    assert caught.value.field == "candidate"


def test_unknown_pool_is_flagged(refs: dict[str, PolicyRef]) -> None:
    doc = load_doc(ONLINE_FILE)
    doc["authority"]["pools"] = ["V100", "QPU-9000"]
    warnings = check_protocol(parse_protocol(doc), policies=refs, logging=STOCHASTIC)
    assert "authority.pools[0]" in [w.field for w in warnings]  # sorted: QPU-9000 first


def test_validate_document_gives_the_lock_hash(refs: dict[str, PolicyRef]) -> None:
    v = validate_document(load_doc(SHADOW_FILE), policies=refs, logging=STOCHASTIC)
    assert len(v.content_sha256) == 64 and v.warnings == ()
    assert str(Finding(Severity.WARNING, "a", "b")) == "warning: `a` b"


def test_offline_policy_refs_equal_the_loaded_registry(refs: dict[str, PolicyRef]) -> None:
    """What offline validation believes is registered is what the service registers."""
    from service.policies.registry import DEFAULT_PREDICTOR, load_registry

    assert GREEDY_PREDICTOR == DEFAULT_PREDICTOR
    registry = load_registry(REPO / "policies")
    assert policy_refs(registry) == refs
