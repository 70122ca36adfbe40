"""`check_protocol`: does this protocol fit the policies we run and the data we have?

Parsing (`parse_protocol`) proves a protocol consistent with itself; this
proves it can be run here and can reach a verdict. Like Gymnasium's
``check_env`` it is public, the service runs it on submit and start, and the
test suite runs it over every file in ``protocols/``. All problems are
collected, so one run tells the author everything:

- the candidate (and a named baseline) is a registered policy, at the declared
  version, with the declared sha256 — the artifact that is scored (and, online,
  the one Runtime runs) is exactly the one declared;
- criteria that need off-policy estimates can be identified from production's
  logs: when production logs no propensities, or only propensity 1
  (deterministic), inverse-propensity estimates do not exist, the experiment
  could never reach a verdict, and the protocol is refused — or flagged, when
  it declares ``analysis.if_not_identifiable: flag``;
- softer things (unknown hardware pools, a model-based estimator, mirror
  coverage that needs Runtime's request counts) are warnings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from service.contract.errors import InvalidInput
from service.contract.hardware import KNOWN_HARDWARE
from service.protocols.lock import content_hash
from service.protocols.parse import parse_protocol
from service.protocols.schema import Estimator, IfNotIdentifiable, Mode, PolicyRef, Protocol

DETERMINISTIC_PROPENSITY = 1.0 - 1e-9
"""A logged propensity at or above this is "production was certain"."""


class Severity(StrEnum):
    """An error refuses the protocol; a warning is reported and recorded."""

    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem: the field it concerns (dotted path) and what is wrong."""

    severity: Severity
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.severity.value}: `{self.field}` {self.message}"


class ProtocolInvalid(InvalidInput):
    """Raised when `check_protocol` finds errors; `field` is the first, `findings` all."""

    def __init__(self, findings: Sequence[Finding]) -> None:
        self.findings = tuple(findings)
        errors = [f for f in findings if f.severity is Severity.ERROR]
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(first.field, first.message + more)


@dataclass(frozen=True, slots=True)
class LoggingProfile:
    """What production's recent logged decisions allow off-policy estimators to do.

    Attributes:
        decisions: recent requests with a known production decision.
        with_propensity: of those, how many carry a propensity.
        deterministic: of those with one, how many are >= `DETERMINISTIC_PROPENSITY`.
        window: in words, which requests were looked at (e.g. "last 10000 of 7 days").
    """

    decisions: int
    with_propensity: int
    deterministic: int
    window: str = ""

    def unidentifiable_reason(self) -> str | None:
        """Why inverse-propensity estimates cannot exist, or None when they can."""
        if self.decisions == 0:
            return None
        if self.with_propensity == 0:
            return f"production logs no propensities (0 of {self.decisions} decisions)"
        if self.deterministic == self.with_propensity:
            return (
                f"production is deterministic: all {self.with_propensity} logged propensities"
                " are 1, so no other action has support"
            )
        return None


@dataclass(frozen=True, slots=True)
class Validation:
    """A protocol that passed parsing and checks, its lock hash and the warnings."""

    protocol: Protocol
    content_sha256: str
    warnings: tuple[Finding, ...]


def _policy_findings(
    field: str, ref: PolicyRef, policies: Mapping[str, PolicyRef]
) -> Iterable[Finding]:
    known = policies.get(ref.name)
    if known is None:
        names = ", ".join(sorted(policies)) or "none"
        yield Finding(
            Severity.ERROR,
            f"{field}.policy",
            f"`{ref.name}` is not a registered policy (registered: {names})",
        )
        return
    if known.version != ref.version:
        yield Finding(
            Severity.ERROR,
            f"{field}.version",
            f"must be the registered version {known.version!r} of `{ref.name}`,"
            f" got {ref.version!r}",
        )
    if known.sha256 != ref.sha256:
        registered = known.sha256 or "none (built into the code)"
        yield Finding(
            Severity.ERROR,
            f"{field}.sha256",
            f"does not match the registered `{ref}`: registered {registered}, "
            f"protocol says {ref.sha256 or 'none'}",
        )


def _identifiability(protocol: Protocol, logging: LoggingProfile | None) -> Iterable[Finding]:
    fields = protocol.off_policy_fields()
    estimator = protocol.analysis.estimator
    if not fields:
        return
    if not estimator.needs_propensities:
        yield Finding(
            Severity.WARNING,
            "analysis.estimator",
            f"`{Estimator.DM}` is model-based: its answers are labelled so and carry"
            " no overlap check",
        )
        return
    if logging is None:
        yield Finding(
            Severity.WARNING, fields[0], "identifiability not checked: production's logs unknown"
        )
        return
    if logging.decisions == 0:
        yield Finding(
            Severity.WARNING,
            fields[0],
            "identifiability not checked: no production decisions logged yet",
        )
        return
    reason = logging.unidentifiable_reason()
    if reason is None:
        return
    refuse = protocol.analysis.if_not_identifiable is IfNotIdentifiable.REFUSE
    others = f" (also {', '.join(f'`{f}`' for f in fields[1:])})" if len(fields) > 1 else ""
    tail = (
        "; declare `analysis.if_not_identifiable: flag` to record it anyway"
        if refuse
        else "; flagged as declared: these criteria will report not identifiable"
    )
    yield Finding(
        Severity.ERROR if refuse else Severity.WARNING,
        fields[0],
        f"needs off-policy estimates{others} with `{estimator}`, but {reason}: "
        f"the experiment could never reach a verdict{tail}",
    )


def _soft_findings(protocol: Protocol) -> Iterable[Finding]:
    if protocol.authority is not None:
        for i, pool in enumerate(protocol.authority.pools):
            if pool not in KNOWN_HARDWARE:
                yield Finding(
                    Severity.WARNING,
                    f"authority.pools[{i}]",
                    f"`{pool}` is not a known hardware class; placements there are flagged",
                )
    for i, c in enumerate(protocol.data_quality):
        if c.metric == "mirror_coverage":
            yield Finding(
                Severity.WARNING,
                f"data_quality[{i}].metric",
                "mirror coverage is measured only while Runtime reports its request count",
            )


def check_protocol(
    protocol: Protocol,
    *,
    policies: Mapping[str, PolicyRef] | None,
    logging: LoggingProfile | None,
) -> tuple[Finding, ...]:
    """Check `protocol` against registered policies and production's logs.

    Args:
        protocol: a parsed protocol.
        policies: name -> the registered policy (`service.server.policy_refs`); None = not known,
            reported as a warning (and refused online, where the artifact must be pinned).
        logging: production's logging profile; None = not known (a warning).

    Returns:
        The warnings.

    Raises:
        ProtocolInvalid: every finding, when at least one is an error.
    """
    findings: list[Finding] = []
    if policies is None:
        severity = Severity.ERROR if protocol.mode is Mode.ONLINE_BOUNDED else Severity.WARNING
        findings.append(Finding(severity, "candidate", "not checked: registered policies unknown"))
    else:
        findings.extend(_policy_findings("candidate", protocol.candidate, policies))
        if protocol.baseline.policy is not None:
            findings.extend(_policy_findings("baseline", protocol.baseline.policy, policies))
    findings.extend(_identifiability(protocol, logging))
    findings.extend(_soft_findings(protocol))
    if any(f.severity is Severity.ERROR for f in findings):
        raise ProtocolInvalid(findings)
    return tuple(findings)


def validate_document(
    document: object,
    *,
    policies: Mapping[str, PolicyRef] | None,
    logging: LoggingProfile | None,
) -> Validation:
    """Parse, check and hash a document: what ``understudy protocol validate`` does."""
    protocol = parse_protocol(document)
    warnings = check_protocol(protocol, policies=policies, logging=logging)
    return Validation(protocol, content_hash(protocol), warnings)
