"""Hash chains over outcomes and requests, as over decisions (docs/tamper_evidence.md).

Placeholder revision: reserved so that the reviewer-hardening revision (0008)
can follow it while the chain work is written. It changes nothing yet.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
