"""An index on ``outcomes.received_at``: the live checks read outcomes by when they arrived.

The calibration check and the outcome-drift check (docs/calibration.md,
docs/drift.md) run every minute on the outcomes *received* in the last hour;
without an index each run scans every partition of ``outcomes``. The index
is declared on the partitioned parent, so PostgreSQL creates it on every
existing partition and on every partition created later. Its cost is one
more index entry per joined outcome at write time (outcomes are at most one
per request; decisions, several per request, carry no new index).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX IF NOT EXISTS outcomes_received ON outcomes (received_at)")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS outcomes_received")
