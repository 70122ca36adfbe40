"""Bad protocols, one row each: the error names the field and says what was wrong."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from service.contract.errors import InvalidInput
from service.protocols import (
    Against,
    Estimator,
    Mode,
    Protocol,
    load_protocol,
    parse_protocol,
    to_document,
)
from tests.protocols.conftest import ONLINE_FILE, PROTOCOLS_DIR, SHADOW_FILE, load_doc

Doc = dict[str, Any]
_MISSING = object()


def put(path: str, value: object = _MISSING) -> Callable[[Doc], None]:
    """A mutation: set (or with no value, delete) the dotted path, list indices as numbers."""

    def apply(doc: Doc) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        key: Any = int(last) if isinstance(node, list) else last
        if value is _MISSING:
            del node[key]
        else:
            node[key] = value

    return apply


SHADOW_CASES: list[tuple[str, Callable[[Doc], None], str, str]] = [
    # (case, mutation, field named, message fragment)
    (
        "unknown metric",
        put("guardrails.1.metric", "happiness"),
        "guardrails[1].metric",
        "is not a known metric",
    ),
    ("unknown stop metric", put("stop.0.metric", "vibes"), "stop[0].metric", "not a known metric"),
    ("alpha as text", put("alpha", "0.05"), "alpha", "must be a number, got str"),
    ("alpha is a bool", put("alpha", True), "alpha", "must be a number, got bool"),
    ("samples not integer", put("minimum_samples", 2.5), "minimum_samples", "must be an integer"),
    ("owners not a list", put("owners", "alice"), "owners", "must be a list"),
    ("version as text", put("version", "1"), "version", "must be an integer"),
    ("stop not a list", put("stop", {"name": "x"}), "stop", "must be a list"),
    ("guardrail not a mapping", put("guardrails.0", "cost"), "guardrails[0]", "must be a mapping"),
    ("negative margin", put("guardrails.0.margin", -0.05), "guardrails[0].margin", "must be > 0"),
    ("zero margin", put("guardrails.1.margin", 0), "guardrails[1].margin", "must be > 0"),
    (
        "negative tolerated harm",
        put("stop.0.worse_than_baseline_by", -0.1),
        "stop[0].worse_than_baseline_by",
        "must be >= 0",
    ),
    (
        "negative MDE",
        put("primary.minimum_detectable_effect", -0.02),
        "primary.minimum_detectable_effect",
        "must be > 0",
    ),
    ("alpha zero", put("alpha", 0), "alpha", "must be in (0, 1)"),
    ("alpha one", put("alpha", 1), "alpha", "must be in (0, 1)"),
    ("alpha above one", put("alpha", 1.5), "alpha", "must be in (0, 1)"),
    ("alpha negative", put("alpha", -0.1), "alpha", "must be in (0, 1)"),
    ("missing candidate", put("candidate"), "candidate", "is required"),
    (
        "missing candidate sha key ok, missing policy",
        put("candidate.policy"),
        "candidate.policy",
        "is required",
    ),
    ("bad sha256", put("candidate.sha256", "abc"), "candidate.sha256", "must match"),
    ("typo key", lambda d: d.update(gaurdrails=[]), "gaurdrails", "is not a known key"),
    ("typo nested key", put("primary.mde", 0.1), "primary.mde", "is not a known key"),
    (
        "shadow with authority",
        lambda d: d.update(authority={}),
        "authority",
        "applies only to `online-bounded`",
    ),
    (
        "shadow with rollback",
        lambda d: d.update(rollback=[]),
        "rollback",
        "applies only to `online-bounded`",
    ),
    (
        "data-quality metric as stop",
        put("stop.1.metric", "outcome_join_rate"),
        "stop[1].metric",
        "declare it under `data_quality`",
    ),
    (
        "reliability metric as data quality",
        put("data_quality.0.metric", "timeout_rate"),
        "data_quality[0].metric",
        "must be a data-quality metric",
    ),
    (
        "no reference for latency vs production",
        put("guardrails.4.reference"),
        "guardrails[4].reference",
        "production has no `scoring_latency_ms`",
    ),
    (
        "error rate vs production",
        lambda d: d["stop"].append(
            {"name": "e", "metric": "policy_error_rate", "worse_than_baseline_by": 0.01}
        ),
        "stop[2].worse_than_baseline_by",
        "cannot compare `policy_error_rate` with production",
    ),
    ("share above one", put("stop.1.worse_than", 1.5), "stop[1].worse_than", "must be in [0, 1]"),
    ("both thresholds", put("stop.1.worse_than_baseline_by", 0.1), "stop[1]", "exactly one of"),
    ("no threshold", put("stop.1.worse_than"), "stop[1]", "exactly one of"),
    ("no stop condition", put("stop", []), "stop", "at least one"),
    ("duplicate criterion name", put("stop.1.name", "reward-harm"), "stop[1].name", "repeats"),
    ("duplicate guardrail", put("guardrails.1.metric", "cost"), "guardrails[1].metric", "repeats"),
    ("duplicate owner", put("owners", ["alice", "alice"]), "owners[1]", "repeats"),
    ("bad owner", put("owners", ["al ice"]), "owners[0]", "must match"),
    (
        "candidate as baseline",
        put("baseline", {"policy": "gavel-scorer", "version": "1.0.0"}),
        "baseline.policy",
        "must differ from the candidate",
    ),
    ("baseline word", put("baseline", "prod"), "baseline", "must be 'production'"),
    (
        "reward field unknown",
        put("reward.weights", {"happiness": 1.0}),
        "reward.weights.happiness",
        "is not one of",
    ),
    (
        "reward weight text",
        put("reward.weights.slo_met", "high"),
        "reward.weights.slo_met",
        "must be a number",
    ),
    (
        "cost signal unknown",
        put("cost.signal_weights", {"karma": 1.0}),
        "cost.signal_weights.karma",
        "is not one of",
    ),
    ("duration words", put("max_duration", "two weeks"), "max_duration", "like '12h'"),
    ("duration zero", put("max_duration", 0), "max_duration", "must be > 0"),
    ("duration too long", put("max_duration", "400d"), "max_duration", "must be <="),
    (
        "unknown estimator",
        put("analysis.estimator", "vibes"),
        "analysis.estimator",
        "must be one of dm, ips",
    ),
    (
        "unknown identifiability rule",
        put("analysis.if_not_identifiable", "ignore"),
        "analysis.if_not_identifiable",
        "must be one of refuse, flag",
    ),
    ("wrong schema", put("schema", "understudy-protocol/v0"), "schema", "must be"),
    ("bad id", put("id", "Gavel Scorer"), "id", "must match"),
    ("empty hypothesis", put("hypothesis", "  "), "hypothesis", "must say something"),
    ("empty document", lambda d: d.clear(), "schema", "is required"),
]

ONLINE_CASES: list[tuple[str, Callable[[Doc], None], str, str]] = [
    ("online without authority", put("authority"), "authority", "is required for `online-bounded`"),
    ("online without rollback", put("rollback"), "rollback", "is required for `online-bounded`"),
    ("online with empty rollback", put("rollback", []), "rollback", "is required"),
    ("online without sha256", put("candidate.sha256"), "candidate.sha256", "is required online"),
    (
        "traffic fraction zero",
        put("authority.traffic_fraction", 0),
        "authority.traffic_fraction",
        "must be in (0, 1]",
    ),
    (
        "traffic fraction above one",
        put("authority.traffic_fraction", 1.01),
        "authority.traffic_fraction",
        "must be in (0, 1]",
    ),
    (
        "unknown workload kind",
        put("authority.workload_kinds", ["batch", "crypto"]),
        "authority.workload_kinds[1]",
        "must be one of train",
    ),
    ("no pools", put("authority.pools", []), "authority.pools", "at least one"),
    (
        "zero concurrency",
        put("authority.max_concurrent_placements", 0),
        "authority.max_concurrent_placements",
        "must be >= 1",
    ),
    (
        "authority outlasts protocol",
        put("authority.max_duration", "8d"),
        "authority.max_duration",
        "must be <= `max_duration`",
    ),
    (
        "rollback name clashes with stop",
        put("rollback.0.name", "error-spike"),
        "rollback[0].name",
        "repeats the name of `stop[1].name`",
    ),
]


def _refused(doc: Doc, mutate: Callable[[Doc], None]) -> InvalidInput:
    bad = copy.deepcopy(doc)
    mutate(bad)
    with pytest.raises(InvalidInput) as caught:
        parse_protocol(bad)
    return caught.value


@pytest.mark.parametrize(
    ("mutate", "field", "fragment"),
    [pytest.param(m, f, t, id=c) for c, m, f, t in SHADOW_CASES],
)
def test_bad_shadow_protocol_names_the_field(
    mutate: Callable[[Doc], None], field: str, fragment: str
) -> None:
    error = _refused(load_doc(SHADOW_FILE), mutate)
    assert error.field == field
    assert fragment in str(error)
    assert f"`{field}`" in str(error)


@pytest.mark.parametrize(
    ("mutate", "field", "fragment"),
    [pytest.param(m, f, t, id=c) for c, m, f, t in ONLINE_CASES],
)
def test_bad_online_protocol_names_the_field(
    mutate: Callable[[Doc], None], field: str, fragment: str
) -> None:
    error = _refused(load_doc(ONLINE_FILE), mutate)
    assert error.field == field
    assert fragment in str(error)


def test_a_document_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(InvalidInput, match="`protocol` must be a mapping, got list"):
        parse_protocol(["schema"])


def test_the_examples_parse_into_what_they_say() -> None:
    shadow = load_protocol(SHADOW_FILE)
    assert shadow.mode is Mode.SHADOW and shadow.authority is None and shadow.rollback == ()
    assert shadow.baseline.is_production
    assert shadow.max_duration_s == 14 * 86400
    assert shadow.analysis.estimator is Estimator.SNIPS
    assert shadow.guardrails[4].reference == 0.0 and shadow.guardrails[0].reference is None
    assert shadow.stop[0].against is Against.BASELINE and shadow.stop[1].against is Against.LIMIT
    online = load_protocol(ONLINE_FILE)
    assert online.authority is not None
    assert online.authority.pools == ("P100", "V100")  # sorted: order carries no meaning
    assert online.authority.max_duration_s == 3 * 86400
    assert [c.name for c in online.data_quality] == [
        "outcome_join_rate",
        "missing_propensity_rate",
        "mirror_coverage",
    ]


@pytest.mark.parametrize("path", sorted(PROTOCOLS_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_canonical_document_reads_back_equal(path: Any) -> None:
    protocol = load_protocol(path)
    again = parse_protocol(to_document(protocol))
    assert isinstance(again, Protocol)
    assert again == protocol


def test_off_policy_fields_are_the_reward_and_cost_criteria() -> None:
    shadow = load_protocol(SHADOW_FILE)
    assert shadow.off_policy_fields() == [
        "primary.metric",
        "guardrails[0].metric",
        "stop[0].metric",
    ]
