"""Hash chains over outcomes and requests, as over decisions (docs/tamper_evidence.md).

Outcomes decide every off-policy verdict and requests carry production's
decision and the state a policy saw, so an edit of either must show as one of
a decision does. Like 0005:

- ``outcomes`` and ``requests`` gain ``chain_xid`` (the writing transaction's
  id) and ``chain_seq`` (a sequence each), filled by column defaults (the
  writer does not change), and an index on ``(chain_xid, chain_seq)``;
- ``outcome_chain_blocks`` and ``request_chain_blocks`` have the shape of
  ``decision_chain_blocks``; ``decision_chain_state`` gets one row per chain
  (``name`` = the table), written by the first seal;
- the append-only guard lets a retired day's blocks of any of the three be deleted.

Existing rows get this migration's transaction id and are sealed by the first
seal after it; adding the columns rewrites every partition of the two tables once.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_CHAINED = ("outcomes", "requests")
_BLOCKS = ("outcome_chain_blocks", "request_chain_blocks")


def _guard(tables: tuple[str, ...]) -> str:
    names = ", ".join(f"'{t}'" for t in tables)
    return f"""
    CREATE OR REPLACE FUNCTION understudy_chain_guard() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'DELETE' AND TG_TABLE_NAME IN ({names}) AND EXISTS (
            SELECT 1 FROM decision_chain_retirements r WHERE r.day = OLD.day
        ) THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP;
    END
    $$
    """


UPGRADE: list[str] = []
for _table in _CHAINED:
    UPGRADE += [
        f"CREATE SEQUENCE {_table}_chain_seq AS bigint CACHE 64",
        f"""
        ALTER TABLE {_table}
            ADD COLUMN chain_xid bigint NOT NULL DEFAULT pg_current_xact_id()::text::bigint,
            ADD COLUMN chain_seq bigint NOT NULL DEFAULT nextval('{_table}_chain_seq')
        """,
        f"ALTER SEQUENCE {_table}_chain_seq OWNED BY {_table}.chain_seq",
        f"CREATE INDEX {_table}_chain ON {_table} (chain_xid, chain_seq)",
    ]
for _blocks in _BLOCKS:
    UPGRADE += [
        f"""
        CREATE TABLE {_blocks} (
            day            date        NOT NULL,
            block          integer     NOT NULL,
            first_position bigint      NOT NULL,
            row_count      integer     NOT NULL,
            first_xid      bigint      NOT NULL,
            first_seq      bigint      NOT NULL,
            last_xid       bigint      NOT NULL,
            last_seq       bigint      NOT NULL,
            prev_head      bytea       NOT NULL,
            head           bytea       NOT NULL,
            row_hashes     bytea       NOT NULL,
            watermark      bigint      NOT NULL,
            sealed_at      timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT {_blocks}_pkey PRIMARY KEY (day, block),
            CONSTRAINT {_blocks}_block CHECK (block >= 0),
            CONSTRAINT {_blocks}_rows CHECK (
                row_count >= 1 AND octet_length(row_hashes) = 32 * row_count),
            CONSTRAINT {_blocks}_heads CHECK (
                octet_length(head) = 32 AND octet_length(prev_head) = 32)
        )
        """,
        f"""
        CREATE TRIGGER {_blocks}_append_only BEFORE UPDATE OR DELETE ON {_blocks}
            FOR EACH ROW EXECUTE FUNCTION understudy_chain_guard()
        """,
        f"""
        CREATE TRIGGER {_blocks}_no_truncate BEFORE TRUNCATE ON {_blocks}
            FOR EACH STATEMENT EXECUTE FUNCTION understudy_refuse_edit()
        """,
    ]
UPGRADE.append(_guard(("decision_chain_blocks", *_BLOCKS)))

DOWNGRADE = [
    _guard(("decision_chain_blocks",)),
    *(f"DROP TABLE {b}" for b in reversed(_BLOCKS)),
    "DELETE FROM decision_chain_state WHERE name IN ('outcomes', 'requests')",
    *(f"DROP INDEX {t}_chain" for t in reversed(_CHAINED)),
    *(f"ALTER TABLE {t} DROP COLUMN chain_seq, DROP COLUMN chain_xid" for t in reversed(_CHAINED)),
]


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
