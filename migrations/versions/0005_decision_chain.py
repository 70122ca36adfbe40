"""Tamper evidence: a chain position on every decision, the hash chain, retirements.

Written by hand, like 0001-0003 (``service/storage/chain/tables.py`` mirrors
the tables as SQLAlchemy Core; a test compares the two). docs/tamper_evidence.md
explains the design; in short:

- ``decisions.chain_xid`` (the writing transaction's id, ``pg_current_xact_id()``, as bigint)
  and ``decisions.chain_seq`` (a sequence) are assigned at insert by column
  defaults, so the writer does not change. A day's chain orders its rows by
  ``(chain_xid, chain_seq)``. The sealer seals only rows whose ``chain_xid`` is
  below the xmin of its snapshot (every transaction below it has finished), so
  a row committed later always sorts after every row already sealed.
- ``decision_chain_state``: the last seal's watermark and the global cursor
  ``(chain_xid, chain_seq)`` of the last row sealed.
- ``decision_chain_blocks``: per UTC day, blocks of consecutive positions with
  the row hashes and ``head = sha256(prev_head || row_hash...)``.
- ``decision_chain_retirements``: one record per retired day (row counts,
  final head), written before the day's partitions are dropped.

The chain tables refuse UPDATE, and DELETE except of a retired day's blocks,
by triggers: defence in depth only (the table owner can disable triggers);
the proof is the anchor file outside the database.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

UPGRADE = [
    "CREATE SEQUENCE decisions_chain_seq AS bigint CACHE 64",
    # Existing rows get the migration's transaction id: they seal after it commits.
    """
    ALTER TABLE decisions
        ADD COLUMN chain_xid bigint NOT NULL DEFAULT pg_current_xact_id()::text::bigint,
        ADD COLUMN chain_seq bigint NOT NULL DEFAULT nextval('decisions_chain_seq')
    """,
    "ALTER SEQUENCE decisions_chain_seq OWNED BY decisions.chain_seq",
    "CREATE INDEX decisions_chain ON decisions (chain_xid, chain_seq)",
    """
    CREATE TABLE decision_chain_state (
        name        text        NOT NULL,
        watermark   bigint      NOT NULL,
        cursor_xid  bigint      NOT NULL,
        cursor_seq  bigint      NOT NULL,
        sealed_rows bigint      NOT NULL,
        sealed_at   timestamptz NOT NULL,
        CONSTRAINT decision_chain_state_pkey PRIMARY KEY (name)
    )
    """,
    """
    CREATE TABLE decision_chain_blocks (
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
        CONSTRAINT decision_chain_blocks_pkey PRIMARY KEY (day, block),
        CONSTRAINT decision_chain_blocks_block CHECK (block >= 0),
        CONSTRAINT decision_chain_blocks_rows CHECK (
            row_count >= 1 AND octet_length(row_hashes) = 32 * row_count),
        CONSTRAINT decision_chain_blocks_heads CHECK (
            octet_length(head) = 32 AND octet_length(prev_head) = 32)
    )
    """,
    """
    CREATE TABLE decision_chain_retirements (
        day             date        NOT NULL,
        requests_rows   bigint      NOT NULL,
        decisions_rows  bigint      NOT NULL,
        outcomes_rows   bigint      NOT NULL,
        blocks          integer     NOT NULL,
        final_head      bytea       NOT NULL,
        retired_at      timestamptz NOT NULL DEFAULT now(),
        signature       text        NOT NULL,
        CONSTRAINT decision_chain_retirements_pkey PRIMARY KEY (day)
    )
    """,
    """
    CREATE FUNCTION understudy_chain_guard() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'DELETE' AND TG_TABLE_NAME = 'decision_chain_blocks' AND EXISTS (
            SELECT 1 FROM decision_chain_retirements r WHERE r.day = OLD.day
        ) THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP;
    END
    $$
    """,
]

for _table in ("decision_chain_blocks", "decision_chain_retirements"):
    UPGRADE += [
        f"""
        CREATE TRIGGER {_table}_append_only BEFORE UPDATE OR DELETE ON {_table}
            FOR EACH ROW EXECUTE FUNCTION understudy_chain_guard()
        """,
        f"""
        CREATE TRIGGER {_table}_no_truncate BEFORE TRUNCATE ON {_table}
            FOR EACH STATEMENT EXECUTE FUNCTION understudy_refuse_edit()
        """,
    ]

DOWNGRADE = [
    "DROP TABLE decision_chain_retirements",
    "DROP TABLE decision_chain_blocks",
    "DROP TABLE decision_chain_state",
    "DROP FUNCTION understudy_chain_guard()",
    "DROP INDEX decisions_chain",
    "ALTER TABLE decisions DROP COLUMN chain_seq, DROP COLUMN chain_xid",
]


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
