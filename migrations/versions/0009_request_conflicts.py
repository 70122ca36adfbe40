"""Request conflicts: the ``conflicts`` table also records contradicting requests.

A request is unique on ``(request_id, request_time)``; a second request with
the same key and other content used to be acked and silently dropped. The
writer now records it in ``conflicts`` with ``kind = 'request'`` (the first
request stays, as for outcomes; docs/storage.md, "Conflicts"), so this
revision widens the ``conflicts_kind`` CHECK.

Downgrade puts the old CHECK back NOT VALID: ``conflicts`` is an anomaly log,
and the request rows recorded meanwhile stay (new rows are checked).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

KINDS = "('outcome', 'production_decision', 'request')"
OLD_KINDS = "('outcome', 'production_decision')"


def upgrade() -> None:
    op.execute("ALTER TABLE conflicts DROP CONSTRAINT conflicts_kind")
    op.execute(f"ALTER TABLE conflicts ADD CONSTRAINT conflicts_kind CHECK (kind IN {KINDS})")


def downgrade() -> None:
    op.execute("ALTER TABLE conflicts DROP CONSTRAINT conflicts_kind")
    op.execute(
        f"ALTER TABLE conflicts ADD CONSTRAINT conflicts_kind CHECK (kind IN {OLD_KINDS}) NOT VALID"
    )
