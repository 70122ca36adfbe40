"""Bearer tokens mapped to roles and principals.

A settings entry maps a token's sha256 digest to ``"role"`` or
``"role:principal"``. The principal is who the caller is (matched against a
protocol's `owners`, so an owner cannot approve their own experiment); an entry
without one gets ``"<role>-<digest[:12]>"``, unique per token.

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
from service.protocols.lifecycle import ActorRole, Identity


class Role(StrEnum):
    """Who a caller is allowed to be."""

    RUNTIME = "runtime"
    REVIEWER = "reviewer"
    SAFETY = "safety"
    ADMIN = "admin"


def token_digest(token: str) -> str:
    """The sha256 hex digest stored in settings for `token`."""
    return hashlib.sha256(token.encode()).hexdigest()


def parse_entry(digest: str, entry: str) -> tuple[Role, str]:
    """``"role"`` or ``"role:principal"`` -> (role, principal)."""
    role, _, principal = entry.partition(":")
    return Role(role), principal or f"{role}-{digest[:12]}"


class TokenAuthority:
    """Resolves `Authorization: Bearer <token>` values to roles and principals."""

    def __init__(self, digests: Mapping[str, str]) -> None:
        self._entries = [(bytes.fromhex(d), *parse_entry(d, e)) for d, e in digests.items()]

    def authenticate(self, authorization: str | None) -> Role:
        """The role of the bearer token in `authorization`, or raise `Unauthenticated`."""
        return self._lookup(authorization)[0]

    def identify(self, authorization: str | None) -> Identity:
        """Who the bearer token is: principal and role; `Unauthenticated` if nobody."""
        role, principal = self._lookup(authorization)
        return Identity(principal, ActorRole(role.value))

    def _lookup(self, authorization: str | None) -> tuple[Role, str]:
        if not authorization:
            raise Unauthenticated("`authorization` header is missing; send `Bearer <token>`")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("`authorization` must be `Bearer <token>`")
        presented = hashlib.sha256(token.strip().encode()).digest()
        found: tuple[Role, str] | None = None
        for digest, role, principal in self._entries:
            if hmac.compare_digest(presented, digest) and found is None:
                found = (role, principal)
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
