"""Decision status ``infeasible_choice``: production-mirror says production chose a masked option.

Before, production-mirror logged ``all_infeasible`` beside a chosen option with
probability 1 when nothing was feasible, although ``all_infeasible`` means
"defer with probability 1" (docs/policies.md, "Statuses"). Now it logs
``infeasible_choice`` whenever production's choice is an option the mask
refuses (issue 22 item 7), so the ``decisions_status`` CHECK admits it.

Rows logged before keep their status (``all_infeasible`` for the old mirror
rows: what was logged is not rewritten; a reviewer can tell them by
``chosen >= 0``). Re-adding the CHECK on the partitioned ``decisions`` checks
every partition once, a single scan of the table.

Downgrade refuses while rows with the new status exist (the old CHECK cannot
hold them, and relabelling them would make the log say something false):
delete or relabel them first.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

OLD = "'ok', 'all_infeasible', 'error', 'timeout'"
NEW = "'ok', 'all_infeasible', 'infeasible_choice', 'error', 'timeout'"


def _replace_check(values: str) -> None:
    op.execute(
        "ALTER TABLE decisions DROP CONSTRAINT IF EXISTS decisions_status, "
        f"ADD CONSTRAINT decisions_status CHECK (status IN ({values}))"
    )


def upgrade() -> None:
    _replace_check(NEW)


def downgrade() -> None:
    op.execute(
        """
        DO $$
        BEGIN
            IF EXISTS (SELECT 1 FROM decisions WHERE status = 'infeasible_choice') THEN
                RAISE EXCEPTION 'decisions hold status infeasible_choice, which revision '
                    '0012 cannot represent: delete or relabel those rows before downgrading';
            END IF;
        END $$
        """
    )
    _replace_check(OLD)
