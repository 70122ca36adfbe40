"""Bearer tokens mapped to roles.

Tokens are configured as sha256 digests so the settings never hold a usable
secret; a presented token is hashed and compared against every digest with
`hmac.compare_digest` so the time taken does not reveal how much of a digest
matched or which entry did.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from enum import StrEnum

from service.contract.errors import PermissionDenied, Unauthenticated


class Role(StrEnum):
    """Who a caller is allowed to be."""

    RUNTIME = "runtime"
    REVIEWER = "reviewer"
    SAFETY = "safety"
    ADMIN = "admin"


def token_digest(token: str) -> str:
    """The sha256 hex digest stored in settings for `token`."""
    return hashlib.sha256(token.encode()).hexdigest()


class TokenAuthority:
    """Resolves `Authorization: Bearer <token>` values to roles."""

    def __init__(self, digests: Mapping[str, str]) -> None:
        self._entries = [(bytes.fromhex(d), Role(role)) for d, role in digests.items()]

    def authenticate(self, authorization: str | None) -> Role:
        """The role of the bearer token in `authorization`, or raise `Unauthenticated`."""
        if not authorization:
            raise Unauthenticated("`authorization` header is missing; send `Bearer <token>`")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("`authorization` must be `Bearer <token>`")
        presented = hashlib.sha256(token.strip().encode()).digest()
        found: Role | None = None
        for digest, role in self._entries:
            if hmac.compare_digest(presented, digest) and found is None:
                found = role
        if found is None:
            raise Unauthenticated("`authorization` token is not recognised")
        return found

    def require(self, authorization: str | None, *allowed: Role) -> Role:
        """Authenticate and check the role; admin passes every check."""
        role = self.authenticate(authorization)
        if role is not Role.ADMIN and role not in allowed:
            names = ", ".join(r.value for r in allowed)
            raise PermissionDenied(f"role `{role.value}` may not do this; needs one of: {names}")
        return role
