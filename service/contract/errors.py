"""The error tree of Understudy. No status codes here: transports map them.

::

    UnderstudyError
     ├── InvalidInput               bad request content; names the field
     │    ├── UnsupportedSchemaVersion
     │    ├── PayloadTooLarge
     │    ├── MissingField           a required part is absent
     │    └── MalformedMessage       the bytes are not a message at all
     ├── AuthError
     │    ├── Unauthenticated        no or unknown credentials
     │    └── PermissionDenied       known caller, role not allowed
     ├── NotFound
     ├── Conflict                   e.g. a locked protocol changed under the same id
     │    └── ConflictingRequest     a request_id already taken by other content
     └── Unavailable                a dependency is down; retry later

Messages name the field in backticks, say what was expected and what came, as
in "`state.nodes[3].accelerators_free` must be >= 0, got -1".
"""

from __future__ import annotations


class UnderstudyError(Exception):
    """Raised for any failure Understudy itself detects and can explain."""


class InvalidInput(UnderstudyError):
    """Raised when a request's content violates the contract.

    `field` is the dotted path of the offending field so transports can
    return it and metrics can count rejections by field.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"`{field}` {problem}")


class UnsupportedSchemaVersion(InvalidInput):
    """Raised when a request declares a schema version this build does not speak."""


class PayloadTooLarge(InvalidInput):
    """Raised when a request body exceeds the configured size limit."""


class MissingField(InvalidInput):
    """Raised when a required part of a request is absent (stream acks say `missing_field`)."""


class MalformedMessage(InvalidInput):
    """Raised when bytes do not parse as the expected message (acks say `malformed_message`)."""


class AuthError(UnderstudyError):
    """Raised when a caller may not do what it asked."""


class Unauthenticated(AuthError):
    """Raised when credentials are missing or unknown."""


class PermissionDenied(AuthError):
    """Raised when a known caller's role does not allow the operation."""


class NotFound(UnderstudyError):
    """Raised when a named object (policy, protocol, request) does not exist."""


class Conflict(UnderstudyError):
    """Raised when a write contradicts what is already recorded."""


class ConflictingRequest(Conflict):
    """Raised when a request_id is re-sent with other content (docs/ingest.md, "Identity").

    A `Conflict`, not an `InvalidInput`: the message is well formed, it only
    contradicts the request already recorded under its id. `field` names the
    identity, so stream acks give ``request_id`` and ``conflicting_request``.
    """

    def __init__(self, request_id: str, problem: str, field: str = "request_id") -> None:
        self.request_id = request_id
        self.field = field
        self.problem = problem
        super().__init__(f"`{field}` {problem}")


class Unavailable(UnderstudyError):
    """Raised when a dependency needed for the operation is down."""
