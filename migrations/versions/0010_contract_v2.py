"""Contract v2 columns on ``requests``: per-option feasibility, production's distribution.

- ``feasibility_version`` and ``feasibility_bits``: the feasibility function's
  version and, once per request, one little-endian uint16 per option whose bit
  i is set when ``SIGNALS[i]`` fired (docs/contract.md, "Feasibility"). A
  reviewer who asks "why was node 17 masked?" reads it instead of replaying
  the request. Rows logged before this revision keep NULL (replay still works).
- ``production_probabilities_f64``: production's whole distribution when
  Runtime sends it (little-endian float64, one per option, then defer), for
  the overlap and tail diagnostics and the DSJSON ``p`` field.
- ``qos_class``: Runtime's QoS class (open vocabulary), for slicing; '' when
  not given.

Nullable columns with no default: adding them rewrites nothing.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE requests "
        "ADD COLUMN IF NOT EXISTS feasibility_version text, "
        "ADD COLUMN IF NOT EXISTS feasibility_bits bytea, "
        "ADD COLUMN IF NOT EXISTS production_probabilities_f64 bytea, "
        "ADD COLUMN IF NOT EXISTS qos_class text"
    )


def downgrade() -> None:
    op.execute(
        "ALTER TABLE requests "
        "DROP COLUMN IF EXISTS qos_class, "
        "DROP COLUMN IF EXISTS production_probabilities_f64, "
        "DROP COLUMN IF EXISTS feasibility_bits, "
        "DROP COLUMN IF EXISTS feasibility_version"
    )
