"""What a predeclared experiment protocol says, as frozen dataclasses.

A protocol is evidence only if its measures, thresholds and stop conditions
were fixed before the data came in, so every field here is something the
evaluator reads and nobody may change once the protocol is recorded (see
`service.protocols.lock`). The YAML form is parsed by `service.protocols.parse`;
``docs/protocols.md`` walks through a file.

Metrics come from one catalogue, `METRICS`, so a criterion can only name a
quantity the evaluator knows how to compute, and its direction (is higher
better?) is fixed by the catalogue rather than restated, and possibly
contradicted, in each protocol.

Every criterion reads "fire when the candidate is *confidently worse* than
the threshold": against a fixed limit (``worse_than``) or against the baseline
by more than a tolerated deterioration (``worse_than_baseline_by``). "Worse"
means higher for lower-is-better metrics and lower for higher-is-better ones.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from service.contract.reward import CostSpec, RewardSpec

# One enum: a protocol names what the OPE core offers (re-exported for the protocol API).
from service.ope.results import Estimator as Estimator

PROTOCOL_SCHEMA = "understudy-protocol/v1"
"""The ``schema`` value every protocol file declares."""


class Mode(StrEnum):
    """Whether the candidate only watches, or may act on a bounded slice."""

    SHADOW = "shadow"
    ONLINE_BOUNDED = "online-bounded"


class Direction(StrEnum):
    """Which way a metric improves."""

    HIGHER_IS_BETTER = "higher"
    LOWER_IS_BETTER = "lower"


class MetricKind(StrEnum):
    """How a metric is computed, which decides the statistics the evaluator uses."""

    OFF_POLICY = "off-policy"
    """An estimate of what the candidate would have achieved (needs propensities)."""
    PROPORTION = "proportion"
    """A share of decisions, observed directly in the decision log."""
    MEAN = "mean"
    """A mean of a logged per-decision quantity."""
    DATA_QUALITY = "data-quality"
    """A property of the data feeding the experiment, not of the candidate."""


@dataclass(frozen=True, slots=True)
class Metric:
    """One entry of the metric catalogue.

    Attributes:
        name: the name protocols use.
        kind: how it is computed.
        direction: which way is better.
        unit: for reports.
        observed_for_production: whether production itself has a value (the
            decision log has no error rate or latency for Runtime's own choice,
            so a guardrail on them needs a declared reference value).
        description: one line for docs and the JSON Schema.
    """

    name: str
    kind: MetricKind
    direction: Direction
    unit: str
    observed_for_production: bool
    description: str

    @property
    def needs_off_policy(self) -> bool:
        """True when the candidate's value must be estimated off-policy."""
        return self.kind is MetricKind.OFF_POLICY


_CATALOGUE = (
    Metric(
        "reward",
        MetricKind.OFF_POLICY,
        Direction.HIGHER_IS_BETTER,
        "reward",
        True,
        "policy value under the protocol's `reward` weights",
    ),
    Metric(
        "cost",
        MetricKind.OFF_POLICY,
        Direction.LOWER_IS_BETTER,
        "cost",
        True,
        "expected cost under the protocol's `cost` weights (constraint signals, failures)",
    ),
    Metric(
        "policy_error_rate",
        MetricKind.PROPORTION,
        Direction.LOWER_IS_BETTER,
        "share",
        False,
        "share of the candidate's decisions with status `error`",
    ),
    Metric(
        "timeout_rate",
        MetricKind.PROPORTION,
        Direction.LOWER_IS_BETTER,
        "share",
        False,
        "share of the candidate's decisions with status `timeout`",
    ),
    Metric(
        "infeasible_favourite_rate",
        MetricKind.PROPORTION,
        Direction.LOWER_IS_BETTER,
        "share",
        True,
        "share of decisions whose raw favourite option was infeasible",
    ),
    Metric(
        "scoring_latency_ms",
        MetricKind.MEAN,
        Direction.LOWER_IS_BETTER,
        "ms",
        False,
        "mean time to score one request, milliseconds",
    ),
    Metric(
        "outcome_join_rate",
        MetricKind.DATA_QUALITY,
        Direction.HIGHER_IS_BETTER,
        "share",
        True,
        "share of mirrored requests whose outcome has been joined",
    ),
    Metric(
        "missing_propensity_rate",
        MetricKind.DATA_QUALITY,
        Direction.LOWER_IS_BETTER,
        "share",
        True,
        "share of production decisions logged without a propensity",
    ),
    Metric(
        "mirror_coverage",
        MetricKind.DATA_QUALITY,
        Direction.HIGHER_IS_BETTER,
        "share",
        True,
        "mirrored requests accepted / requests Runtime reports it received",
    ),
)

METRICS: Mapping[str, Metric] = MappingProxyType({m.name: m for m in _CATALOGUE})
"""Every metric a protocol may name, by name."""


class SequenceMethod(StrEnum):
    """The anytime-valid confidence sequence the evaluator checks after every batch."""

    ASYMPTOTIC = "asymptotic"
    BETTING = "betting"


class IfNotIdentifiable(StrEnum):
    """What validation does when production's logs cannot support off-policy estimates."""

    REFUSE = "refuse"
    FLAG = "flag"


class Against(StrEnum):
    """What a criterion's threshold is compared with."""

    LIMIT = "worse_than"
    """The candidate's own value against a fixed limit."""
    BASELINE = "worse_than_baseline_by"
    """The deterioration candidate vs baseline against a tolerated amount (>= 0)."""


@dataclass(frozen=True, slots=True)
class PolicyRef:
    """A policy pinned by name, version and artifact hash (None: built into the code)."""

    name: str
    version: str
    sha256: str | None = None

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass(frozen=True, slots=True)
class Baseline:
    """What the candidate is compared with: production (None) or a named policy."""

    policy: PolicyRef | None = None

    @property
    def is_production(self) -> bool:
        """True when the comparison is against Runtime's own decisions."""
        return self.policy is None


@dataclass(frozen=True, slots=True)
class Authority:
    """Bounds on what an online-bounded candidate may do (Runtime enforces, we check).

    Attributes:
        traffic_fraction: share of eligible requests the candidate may place, (0, 1].
        pools: hardware class names the candidate may place onto.
        workload_kinds: workload kinds it may place.
        max_concurrent_placements: live placements at once.
        max_duration_s: how long it may act, seconds (<= the protocol's).
    """

    traffic_fraction: float
    pools: tuple[str, ...]
    workload_kinds: tuple[str, ...]
    max_concurrent_placements: int
    max_duration_s: float


@dataclass(frozen=True, slots=True)
class PrimaryMeasure:
    """The success measure: the candidate beats the baseline by at least the MDE.

    Attributes:
        metric: a `METRICS` name (not a data-quality one).
        minimum_detectable_effect: improvement over the baseline, in the
            metric's better direction and units, > 0.
    """

    metric: str
    minimum_detectable_effect: float


@dataclass(frozen=True, slots=True)
class Guardrail:
    """A one-sided non-inferiority test (as Spotify Confidence declares them).

    The candidate passes when it is confidently no worse than the reference by
    more than `margin`. The reference is the baseline's value, or `reference`
    when given (needed when the baseline has no value, e.g. production has no
    scoring latency).

    Attributes:
        metric: a `METRICS` name (not a data-quality one).
        margin: largest tolerated deterioration, > 0, in the metric's units.
        reference: fixed comparison value; None = the baseline's value.
    """

    metric: str
    margin: float
    reference: float | None = None

    @property
    def name(self) -> str:
        """Guardrails are named after their metric (one per metric)."""
        return f"guardrail:{self.metric}"


@dataclass(frozen=True, slots=True)
class Criterion:
    """A stop, rollback or data-quality condition: fires when confidently worse.

    Attributes:
        name: unique within the protocol; labels events and metrics.
        metric: a `METRICS` name.
        against: a fixed limit, or the baseline.
        threshold: the limit (metric units), or the tolerated deterioration (>= 0).
    """

    name: str
    metric: str
    against: Against
    threshold: float


@dataclass(frozen=True, slots=True)
class Analysis:
    """How the evaluator analyses: estimator, confidence sequence, identifiability rule."""

    estimator: Estimator
    sequence: SequenceMethod = SequenceMethod.ASYMPTOTIC
    if_not_identifiable: IfNotIdentifiable = IfNotIdentifiable.REFUSE


@dataclass(frozen=True)
class Protocol:
    """A parsed, self-consistent protocol (environment checks: `check_protocol`).

    Attributes:
        id: stable experiment name; with `version`, the lock key.
        version: positive integer; a changed protocol is a new version.
        hypothesis: what the experiment expects, in words.
        owners: principals accountable for it; none of them may approve it.
        mode: shadow or online-bounded.
        candidate: the policy under test, pinned by sha256.
        baseline: production or a named policy.
        reward: weights over outcome fields (the contract's `RewardSpec`).
        cost: weights over constraint signals and failures (`CostSpec`).
        primary: the success measure.
        guardrails: non-inferiority tests that success also needs.
        stop: conditions that stop the experiment.
        rollback: online only: conditions that signal Runtime to roll back.
        data_quality: conditions that end the experiment as inconclusive.
        authority: online only: what the candidate may do.
        minimum_samples: decisions with joined outcomes before any verdict.
        max_duration_s: after this, no verdict means inconclusive.
        alpha: the protocol's error budget, in (0, 1).
        analysis: estimator and confidence sequence.
        title: a short label.
    """

    id: str
    version: int
    hypothesis: str
    owners: tuple[str, ...]
    mode: Mode
    candidate: PolicyRef
    baseline: Baseline
    reward: RewardSpec
    cost: CostSpec
    primary: PrimaryMeasure
    guardrails: tuple[Guardrail, ...]
    stop: tuple[Criterion, ...]
    rollback: tuple[Criterion, ...]
    data_quality: tuple[Criterion, ...]
    authority: Authority | None
    minimum_samples: int
    max_duration_s: float
    alpha: float
    analysis: Analysis
    title: str = ""

    @property
    def key(self) -> tuple[str, int]:
        """``(id, version)``: what the lock and the store key on."""
        return (self.id, self.version)

    def metric_fields(self) -> Iterator[tuple[str, str]]:
        """Every ``(field path, metric name)`` the protocol evaluates, in file order."""
        yield "primary.metric", self.primary.metric
        for i, g in enumerate(self.guardrails):
            yield f"guardrails[{i}].metric", g.metric
        for section in ("stop", "rollback", "data_quality"):
            for i, c in enumerate(getattr(self, section)):
                yield f"{section}[{i}].metric", c.metric

    def off_policy_fields(self) -> list[str]:
        """Field paths of every criterion whose metric needs off-policy estimates."""
        return [path for path, m in self.metric_fields() if METRICS[m].needs_off_policy]
