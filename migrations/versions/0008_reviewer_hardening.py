"""Reviewer role hardening: no advisory-lock, large-object or role-setting powers (docs/reviewer.md).

Placeholder revision: reserved so that the request-conflict revision (0009)
can follow it while the reviewer work is written. It changes nothing yet.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
