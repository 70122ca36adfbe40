"""Reviewer access: a read-only database role, documented views, the reviewer access log.

Placeholder created so later revisions can chain on it; filled in by the
reviewer-surface work (issue 13).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Nothing yet."""


def downgrade() -> None:
    """Nothing yet."""
