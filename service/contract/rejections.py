"""Why a message was refused: the fixed vocabulary of reason codes.

A refused stream message is acked with the field that was wrong and a reason
code (issue 22 item 6). Both are read by the sender's client and may land in
its logs and metrics, so neither is free text: the reason is one member of
`RejectionReason`, chosen by the *class* of the error (never by its message,
never by anything computed from a request or a decision), and the field is the
error's own field path, bounded by the transport the way the rejection metric
label is (``service.metrics.field_label``). The vocabulary is documented, code
by code, in docs/ingest.md; tests/transport/test_ack_allowlist.py holds the
acks to it.

Generic over the error tree: any `UnderstudyError` that names a field (an
`InvalidInput`, or a conflict subclass with a ``field``) maps to a refusal; a
`Conflict` that names none is about the request's identity, ``request_id``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from service.contract.errors import (
    Conflict,
    ConflictingRequest,
    InvalidInput,
    MalformedMessage,
    MissingField,
    PayloadTooLarge,
    UnderstudyError,
    UnsupportedSchemaVersion,
)


class RejectionReason(StrEnum):
    """Every reason a refused message may be given; the allow-list of the ack's `reason`."""

    INVALID_VALUE = "invalid_value"  # the field is present but breaks a contract rule
    MISSING_FIELD = "missing_field"  # a required part is absent
    MALFORMED_MESSAGE = "malformed_message"  # the bytes are not a message of the expected type
    PAYLOAD_TOO_LARGE = "payload_too_large"  # over UNDERSTUDY_MAX_REQUEST_BYTES
    UNSUPPORTED_SCHEMA_VERSION = "unsupported_schema_version"  # a version this build cannot read
    REPEATED_SEQUENCE = "repeated_sequence"  # a stream sequence that did not increase
    CONFLICTING_REQUEST = "conflicting_request"  # a request_id already recorded with other content


REASON_CODES: frozenset[str] = frozenset(r.value for r in RejectionReason)
"""The allow-list as strings, for checks on what acks may carry."""

IDENTITY_FIELD = "request_id"
"""The field a conflict names when its error carries none: a request's identity."""

# Most specific first: the first class an error is an instance of gives its reason.
_REASON_BY_ERROR: tuple[tuple[type[UnderstudyError], RejectionReason], ...] = (
    (PayloadTooLarge, RejectionReason.PAYLOAD_TOO_LARGE),
    (UnsupportedSchemaVersion, RejectionReason.UNSUPPORTED_SCHEMA_VERSION),
    (MissingField, RejectionReason.MISSING_FIELD),
    (MalformedMessage, RejectionReason.MALFORMED_MESSAGE),
    (InvalidInput, RejectionReason.INVALID_VALUE),
    (ConflictingRequest, RejectionReason.CONFLICTING_REQUEST),  # the identity rule's refusal
    (Conflict, RejectionReason.CONFLICTING_REQUEST),  # any other conflict a write may raise
)


@dataclass(frozen=True, slots=True)
class Refusal:
    """The field (unbounded: the transport bounds it) and the reason of one refusal."""

    field: str
    reason: RejectionReason


def refusal_of(exc: UnderstudyError) -> Refusal | None:
    """The refusal an error stands for, or None when it is not about the message's content.

    None for authentication, a missing object or an unavailable dependency:
    those end a call, they do not refuse one message of it.
    """
    for cls, reason in _REASON_BY_ERROR:
        if isinstance(exc, cls):
            field = getattr(exc, "field", None)
            if not isinstance(field, str) or not field:
                field = IDENTITY_FIELD if reason is RejectionReason.CONFLICTING_REQUEST else ""
            return Refusal(field, reason)
    return None
