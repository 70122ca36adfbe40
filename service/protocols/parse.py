"""YAML (or any mapping) -> `Protocol`, refusing with the exact field at fault.

Parsing is strict — an unknown key is refused, so a typo cannot silently drop a
stop condition — and checks everything the protocol can know about itself:
types, ranges, metric names, which sections a metric may appear in, signs of
margins, mode-specific sections. What needs the outside world (registered
policies, production's logs) is `check_protocol`'s job. Every refusal is an
`InvalidInput` whose `field` is the dotted path in the file::

    `guardrails[1].margin` must be > 0 (the largest tolerated deterioration), got -0.01
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from service.contract.errors import InvalidInput
from service.contract.reward import CostSpec, RewardSpec
from service.contract.workload import WorkloadKind
from service.protocols.fields import (
    ID_PATTERN,
    NAME_PATTERN,
    PRINCIPAL_PATTERN,
    SHA256_PATTERN,
    check_keys,
    enum_value,
    integer,
    items,
    mapping,
    names,
    number,
    parse_duration,
    string,
    text,
)
from service.protocols.schema import (
    METRICS,
    PROTOCOL_SCHEMA,
    Against,
    Analysis,
    Authority,
    Baseline,
    Criterion,
    Estimator,
    Guardrail,
    IfNotIdentifiable,
    MetricKind,
    Mode,
    PolicyRef,
    PrimaryMeasure,
    Protocol,
    SequenceMethod,
)

REQUIRED = (
    "schema",
    "id",
    "version",
    "hypothesis",
    "owners",
    "mode",
    "candidate",
    "baseline",
    "reward",
    "primary",
    "stop",
    "minimum_samples",
    "max_duration",
    "alpha",
    "analysis",
)
OPTIONAL = ("title", "cost", "guardrails", "rollback", "data_quality", "authority")
SECTION_KEYS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "candidate": (("policy", "version"), ("sha256",)),
    "baseline": (("policy", "version"), ("sha256",)),
    "reward": (("weights",), ()),
    "cost": ((), ("signal_weights", "failure_weights")),
    "primary": (("metric", "minimum_detectable_effect"), ()),
    "guardrail": (("metric", "margin"), ("reference",)),
    "criterion": (("name", "metric"), (Against.LIMIT.value, Against.BASELINE.value)),
    "data_quality": (("metric", Against.LIMIT.value), ("name",)),
    "authority": (
        (
            "traffic_fraction",
            "pools",
            "workload_kinds",
            "max_concurrent_placements",
            "max_duration",
        ),
        (),
    ),
    "analysis": (("estimator",), ("sequence", "if_not_identifiable")),
}
"""Per section: (required keys, optional keys). The JSON Schema export mirrors these."""


def _keys(data: Mapping[str, Any], path: str, section: str) -> None:
    required, optional = SECTION_KEYS[section]
    check_keys(data, path, required, optional)


def _policy(value: object, path: str) -> PolicyRef:
    data = mapping(value, path)
    _keys(data, path, "candidate")
    version = data["version"]
    if isinstance(version, int | float) and not isinstance(version, bool):
        version = str(version)  # YAML reads `version: 1.0` as a number
    sha = data.get("sha256")
    return PolicyRef(
        name=string(data["policy"], f"{path}.policy", NAME_PATTERN),
        version=string(version, f"{path}.version"),
        sha256=None if sha is None else string(sha, f"{path}.sha256", SHA256_PATTERN),
    )


def _baseline(value: object) -> Baseline:
    if value == "production":
        return Baseline()
    if isinstance(value, str):
        raise InvalidInput("baseline", f"must be 'production' or a policy mapping, got {value!r}")
    return Baseline(_policy(value, "baseline"))


def _metric(value: object, path: str, *, data_quality: bool) -> str:
    name = string(value, path)
    if name not in METRICS:
        raise InvalidInput(path, f"is not a known metric ({', '.join(METRICS)}), got {name!r}")
    is_dq = METRICS[name].kind is MetricKind.DATA_QUALITY
    if is_dq and not data_quality:
        raise InvalidInput(
            path, f"`{name}` is a data-quality metric; declare it under `data_quality`"
        )
    if data_quality and not is_dq:
        dq = [m.name for m in METRICS.values() if m.kind is MetricKind.DATA_QUALITY]
        raise InvalidInput(path, f"must be a data-quality metric ({', '.join(dq)}), got {name!r}")
    return name


def _limit(metric: str, value: object, path: str) -> float:
    """A fixed value of `metric`: shares lie in [0, 1], everything else is >= 0 except reward."""
    kind = METRICS[metric].kind
    if kind in (MetricKind.PROPORTION, MetricKind.DATA_QUALITY):
        return number(value, path, low=0.0, high=1.0, why=f" (`{metric}` is a share)")
    if metric == "reward":
        return number(value, path)
    return number(value, path, low=0.0)


class _Parser:
    """One protocol document; remembers the baseline for cross-field rules."""

    def __init__(self, baseline: Baseline) -> None:
        self.baseline = baseline

    def _needs_reference(self, metric: str) -> bool:
        return self.baseline.is_production and not METRICS[metric].observed_for_production

    def primary(self, value: object) -> PrimaryMeasure:
        data = mapping(value, "primary")
        _keys(data, "primary", "primary")
        metric = _metric(data["metric"], "primary.metric", data_quality=False)
        if self._needs_reference(metric):
            raise InvalidInput(
                "primary.metric", f"`{metric}` has no value for production, the baseline"
            )
        mde = number(
            data["minimum_detectable_effect"],
            "primary.minimum_detectable_effect",
            low=0.0,
            open_low=True,
            why=" (an improvement, in the metric's better direction)",
        )
        return PrimaryMeasure(metric, mde)

    def guardrails(self, value: object) -> tuple[Guardrail, ...]:
        out: list[Guardrail] = []
        for i, item in enumerate(items(value, "guardrails")):
            path = f"guardrails[{i}]"
            data = mapping(item, path)
            _keys(data, path, "guardrail")
            metric = _metric(data["metric"], f"{path}.metric", data_quality=False)
            if any(g.metric == metric for g in out):
                raise InvalidInput(
                    f"{path}.metric", f"repeats `{metric}`: one guardrail per metric"
                )
            margin = number(
                data["margin"],
                f"{path}.margin",
                low=0.0,
                open_low=True,
                why=" (the largest tolerated deterioration)",
            )
            reference = data.get("reference")
            if reference is None and self._needs_reference(metric):
                raise InvalidInput(
                    f"{path}.reference",
                    f"is required: production has no `{metric}`, so give the value to compare with",
                )
            ref = None if reference is None else _limit(metric, reference, f"{path}.reference")
            out.append(Guardrail(metric, margin, ref))
        return tuple(out)

    def criteria(self, value: object, section: str, *, required: bool) -> tuple[Criterion, ...]:
        out: list[Criterion] = []
        for i, item in enumerate(items(value, section, non_empty=required)):
            path = f"{section}[{i}]"
            data = mapping(item, path)
            _keys(data, path, "criterion")
            name = string(data["name"], f"{path}.name", NAME_PATTERN)
            metric = _metric(data["metric"], f"{path}.metric", data_quality=False)
            given = [a for a in Against if a.value in data]
            if len(given) != 1:
                raise InvalidInput(
                    path, f"must give exactly one of `{Against.LIMIT}`, `{Against.BASELINE}`"
                )
            against = given[0]
            where = f"{path}.{against.value}"
            if against is Against.LIMIT:
                threshold = _limit(metric, data[against.value], where)
            else:
                if self._needs_reference(metric):
                    raise InvalidInput(
                        where, f"cannot compare `{metric}` with production, which has none"
                    )
                threshold = number(
                    data[against.value], where, low=0.0, why=" (a tolerated deterioration)"
                )
            out.append(Criterion(name, metric, against, threshold))
        return tuple(out)

    @staticmethod
    def data_quality(value: object) -> tuple[Criterion, ...]:
        out: list[Criterion] = []
        for i, item in enumerate(items(value, "data_quality")):
            path = f"data_quality[{i}]"
            data = mapping(item, path)
            _keys(data, path, "data_quality")
            metric = _metric(data["metric"], f"{path}.metric", data_quality=True)
            name = string(data.get("name", metric), f"{path}.name", NAME_PATTERN)
            limit = _limit(metric, data[Against.LIMIT.value], f"{path}.{Against.LIMIT}")
            out.append(Criterion(name, metric, Against.LIMIT, limit))
        return tuple(out)


def _authority(value: object, max_duration_s: float) -> Authority:
    data = mapping(value, "authority")
    _keys(data, "authority", "authority")
    kinds = names(data["workload_kinds"], "authority.workload_kinds", r".*", WorkloadKind)
    duration = parse_duration(data["max_duration"], "authority.max_duration")
    if duration > max_duration_s:
        raise InvalidInput(
            "authority.max_duration",
            f"must be <= `max_duration` ({max_duration_s:g} s), got {duration:g} s",
        )
    return Authority(
        traffic_fraction=number(
            data["traffic_fraction"], "authority.traffic_fraction", low=0.0, high=1.0, open_low=True
        ),
        pools=names(data["pools"], "authority.pools", r"^\S+$"),
        workload_kinds=kinds,
        max_concurrent_placements=integer(
            data["max_concurrent_placements"], "authority.max_concurrent_placements", 1
        ),
        max_duration_s=duration,
    )


def _analysis(value: object) -> Analysis:
    data = mapping(value, "analysis")
    _keys(data, "analysis", "analysis")
    return Analysis(
        estimator=enum_value(Estimator, data["estimator"], "analysis.estimator"),
        sequence=enum_value(
            SequenceMethod, data.get("sequence", "asymptotic"), "analysis.sequence"
        ),
        if_not_identifiable=enum_value(
            IfNotIdentifiable,
            data.get("if_not_identifiable", "refuse"),
            "analysis.if_not_identifiable",
        ),
    )


def _reward_and_cost(data: Mapping[str, Any]) -> tuple[RewardSpec, CostSpec]:
    """The contract's specs; their own errors already name ``reward.weights.<field>``."""
    reward = mapping(data["reward"], "reward")
    _keys(reward, "reward", "reward")
    weights = mapping(reward["weights"], "reward.weights")
    cost = mapping(data.get("cost", {}), "cost")
    _keys(cost, "cost", "cost")
    sig = mapping(cost.get("signal_weights", {}), "cost.signal_weights")
    fail = mapping(cost.get("failure_weights", {}), "cost.failure_weights")
    for path, table in (("reward.weights", weights), ("cost.signal_weights", sig)):
        for name, w in table.items():
            number(w, f"{path}.{name}")
    for name, w in fail.items():
        number(w, f"cost.failure_weights.{name}")
    return RewardSpec(dict(weights)), CostSpec(dict(sig), dict(fail))


def _unique_names(protocol: Protocol) -> None:
    seen: dict[str, str] = {}
    for section in ("stop", "rollback", "data_quality"):
        for i, c in enumerate(getattr(protocol, section)):
            path = f"{section}[{i}].name"
            if c.name in seen:
                raise InvalidInput(path, f"repeats the name of `{seen[c.name]}`: {c.name!r}")
            seen[c.name] = path


def parse_protocol(data: object) -> Protocol:
    """Check a loaded YAML/JSON document against the schema and build a `Protocol`.

    Raises:
        InvalidInput: naming the first field at fault.
    """
    doc = mapping(data, "protocol")
    check_keys(doc, "", REQUIRED, OPTIONAL)
    if doc["schema"] != PROTOCOL_SCHEMA:
        raise InvalidInput("schema", f"must be {PROTOCOL_SCHEMA!r}, got {doc['schema']!r}")
    mode = enum_value(Mode, doc["mode"], "mode")
    online = mode is Mode.ONLINE_BOUNDED
    for section in ("authority", "rollback"):
        if online and not doc.get(section):
            raise InvalidInput(section, "is required for `online-bounded` protocols")
        if not online and section in doc:
            raise InvalidInput(section, "applies only to `online-bounded` protocols")
    candidate = _policy(doc["candidate"], "candidate")
    if online and candidate.sha256 is None:
        raise InvalidInput(
            "candidate.sha256", "is required online: Runtime must run this exact artifact"
        )
    baseline = _baseline(doc["baseline"])
    if baseline.policy is not None and baseline.policy.name == candidate.name:
        raise InvalidInput("baseline.policy", f"must differ from the candidate {candidate.name!r}")
    reward, cost = _reward_and_cost(doc)
    p = _Parser(baseline)
    max_duration = parse_duration(doc["max_duration"], "max_duration")
    protocol = Protocol(
        id=string(doc["id"], "id", ID_PATTERN),
        version=integer(doc["version"], "version", 1),
        title=string(doc.get("title", ""), "title"),
        hypothesis=text(doc["hypothesis"], "hypothesis"),
        owners=names(doc["owners"], "owners", PRINCIPAL_PATTERN),
        mode=mode,
        candidate=candidate,
        baseline=baseline,
        reward=reward,
        cost=cost,
        primary=p.primary(doc["primary"]),
        guardrails=p.guardrails(doc.get("guardrails", [])),
        stop=p.criteria(doc["stop"], "stop", required=True),
        rollback=p.criteria(doc.get("rollback", []), "rollback", required=online),
        data_quality=p.data_quality(doc.get("data_quality", [])),
        authority=_authority(doc["authority"], max_duration) if online else None,
        minimum_samples=integer(doc["minimum_samples"], "minimum_samples", 1),
        max_duration_s=max_duration,
        alpha=number(doc["alpha"], "alpha", low=0.0, high=1.0, open_low=True, open_high=True),
        analysis=_analysis(doc["analysis"]),
    )
    _unique_names(protocol)
    return protocol


def load_protocol(path: Path) -> Protocol:
    """Read and parse one protocol file (YAML; JSON is YAML too)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInput("protocol", f"cannot read {path}: {exc}") from exc
    return parse_protocol(data)
