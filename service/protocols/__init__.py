"""Predeclared experiment protocols: schema, parsing, checks, locking, lifecycle.

A protocol fixes, before any data is seen, what a shadow or online-bounded
experiment measures, what counts as success, what stops it and what rolls it
back. Pure: no transport, storage or metrics imports; storage plugs in through
`ProtocolRecords` (``service.storage.stores.protocol``). See docs/protocols.md.

::

    parse_protocol / load_protocol       YAML or mapping -> Protocol (InvalidInput names the field)
    check_protocol / validate_document   against registered policies and production's logs
    to_document / content_hash           canonical form and lock hash; ProtocolLocked on change
    ProtocolDesk                         submit / approve / start / stop / verdicts, one event each
    authorize / next_state               who may move a protocol, and where
    ActedPlacement / authority_breaches  online-bounded reports from Runtime
"""

from service.protocols.check import (
    Finding,
    LoggingProfile,
    ProtocolInvalid,
    Severity,
    Validation,
    check_protocol,
    validate_document,
)
from service.protocols.desk import (
    NewEvent,
    ProtocolDesk,
    ProtocolEvent,
    ProtocolRecords,
    ProtocolStatus,
    RecordedProtocol,
)
from service.protocols.lifecycle import (
    EVALUATOR,
    RULES,
    Action,
    ActorRole,
    Identity,
    State,
    authorize,
    authorize_read,
    authorize_role,
    next_state,
)
from service.protocols.lock import (
    ProtocolLocked,
    canonical_json,
    changed_fields,
    content_hash,
    to_document,
)
from service.protocols.online import ActedPlacement, RuntimeRequestCount, authority_breaches
from service.protocols.parse import load_protocol, parse_protocol
from service.protocols.schema import (
    METRICS,
    PROTOCOL_SCHEMA,
    Against,
    Analysis,
    Authority,
    Baseline,
    Criterion,
    Direction,
    Estimator,
    Guardrail,
    IfNotIdentifiable,
    Metric,
    MetricKind,
    Mode,
    PolicyRef,
    PrimaryMeasure,
    Protocol,
    SequenceMethod,
)

__all__ = [
    "EVALUATOR",
    "METRICS",
    "PROTOCOL_SCHEMA",
    "RULES",
    "ActedPlacement",
    "Action",
    "ActorRole",
    "Against",
    "Analysis",
    "Authority",
    "Baseline",
    "Criterion",
    "Direction",
    "Estimator",
    "Finding",
    "Guardrail",
    "Identity",
    "IfNotIdentifiable",
    "LoggingProfile",
    "Metric",
    "MetricKind",
    "Mode",
    "NewEvent",
    "PolicyRef",
    "PrimaryMeasure",
    "Protocol",
    "ProtocolDesk",
    "ProtocolEvent",
    "ProtocolInvalid",
    "ProtocolLocked",
    "ProtocolRecords",
    "ProtocolStatus",
    "RecordedProtocol",
    "RuntimeRequestCount",
    "SequenceMethod",
    "Severity",
    "State",
    "Validation",
    "authority_breaches",
    "authorize",
    "authorize_read",
    "authorize_role",
    "canonical_json",
    "changed_fields",
    "check_protocol",
    "content_hash",
    "load_protocol",
    "next_state",
    "parse_protocol",
    "to_document",
    "validate_document",
]
