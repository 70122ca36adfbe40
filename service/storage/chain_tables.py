"""The decision chain's tables as SQLAlchemy Core, mirroring migration 0005.

The migration is the source of truth (with the append-only triggers); these
`Table`s live on the decision log's `metadata`, and the two chain columns are
appended to `decisions`, so the schema comparison in ``tests/storage`` covers
them once this module is imported.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Date,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    Table,
    Text,
    func,
    text,
)

from service.storage import tables as t

TS = DateTime(timezone=True)

if "chain_xid" not in t.decisions.c:
    t.decisions.append_column(
        Column(
            "chain_xid",
            BigInteger,
            nullable=False,
            server_default=text("(pg_current_xact_id())::text::bigint"),
        )
    )
    t.decisions.append_column(
        Column(
            "chain_seq",
            BigInteger,
            nullable=False,
            server_default=text("nextval('decisions_chain_seq')"),
        )
    )
    Index("decisions_chain", t.decisions.c.chain_xid, t.decisions.c.chain_seq)

chain_state = Table(
    "decision_chain_state",
    t.metadata,
    Column("name", Text, nullable=False),
    Column("watermark", BigInteger, nullable=False),
    Column("cursor_xid", BigInteger, nullable=False),
    Column("cursor_seq", BigInteger, nullable=False),
    Column("sealed_rows", BigInteger, nullable=False),
    Column("sealed_at", TS, nullable=False),
    PrimaryKeyConstraint("name", name="decision_chain_state_pkey"),
)

chain_blocks = Table(
    "decision_chain_blocks",
    t.metadata,
    Column("day", Date, nullable=False),
    Column("block", Integer, nullable=False),
    Column("first_position", BigInteger, nullable=False),
    Column("row_count", Integer, nullable=False),
    Column("first_xid", BigInteger, nullable=False),
    Column("first_seq", BigInteger, nullable=False),
    Column("last_xid", BigInteger, nullable=False),
    Column("last_seq", BigInteger, nullable=False),
    Column("prev_head", LargeBinary, nullable=False),
    Column("head", LargeBinary, nullable=False),
    Column("row_hashes", LargeBinary, nullable=False),
    Column("watermark", BigInteger, nullable=False),
    Column("sealed_at", TS, nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("day", "block", name="decision_chain_blocks_pkey"),
    CheckConstraint("block >= 0", name="decision_chain_blocks_block"),
    CheckConstraint(
        "row_count >= 1 AND octet_length(row_hashes) = 32 * row_count",
        name="decision_chain_blocks_rows",
    ),
    CheckConstraint(
        "octet_length(head) = 32 AND octet_length(prev_head) = 32",
        name="decision_chain_blocks_heads",
    ),
)

chain_retirements = Table(
    "decision_chain_retirements",
    t.metadata,
    Column("day", Date, nullable=False),
    Column("requests_rows", BigInteger, nullable=False),
    Column("decisions_rows", BigInteger, nullable=False),
    Column("outcomes_rows", BigInteger, nullable=False),
    Column("blocks", Integer, nullable=False),
    Column("final_head", LargeBinary, nullable=False),
    Column("retired_at", TS, nullable=False, server_default=func.now()),
    Column("signature", Text, nullable=False),
    PrimaryKeyConstraint("day", name="decision_chain_retirements_pkey"),
)
