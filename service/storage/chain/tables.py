"""The chains' tables as SQLAlchemy Core, mirroring migrations 0005 and 0007.

The migrations are the source of truth (with the append-only triggers); these
`Table`s live on the decision log's `metadata`, and the two chain columns are
appended to `decisions`, `outcomes` and `requests`, so the schema comparison in
``tests/storage`` covers them once this module is imported.
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

from service.storage.log import tables as t

TS = DateTime(timezone=True)


def _chain_columns(table: Table, sequence: str, index: str) -> None:
    """``chain_xid`` (the writing transaction) and ``chain_seq``, filled by defaults."""
    if "chain_xid" in table.c:
        return
    table.append_column(
        Column(
            "chain_xid",
            BigInteger,
            nullable=False,
            server_default=text("(pg_current_xact_id())::text::bigint"),
        )
    )
    table.append_column(
        Column(
            "chain_seq", BigInteger, nullable=False, server_default=text(f"nextval('{sequence}')")
        )
    )
    Index(index, table.c.chain_xid, table.c.chain_seq)


_chain_columns(t.decisions, "decisions_chain_seq", "decisions_chain")
_chain_columns(t.outcomes, "outcomes_chain_seq", "outcomes_chain")
_chain_columns(t.requests, "requests_chain_seq", "requests_chain")

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


def _blocks_table(name: str) -> Table:
    """A chain's blocks (the three chains' tables have one shape)."""
    return Table(
        name,
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
        PrimaryKeyConstraint("day", "block", name=f"{name}_pkey"),
        CheckConstraint("block >= 0", name=f"{name}_block"),
        CheckConstraint(
            "row_count >= 1 AND octet_length(row_hashes) = 32 * row_count",
            name=f"{name}_rows",
        ),
        CheckConstraint(
            "octet_length(head) = 32 AND octet_length(prev_head) = 32",
            name=f"{name}_heads",
        ),
    )


chain_blocks = _blocks_table("decision_chain_blocks")
outcome_chain_blocks = _blocks_table("outcome_chain_blocks")
request_chain_blocks = _blocks_table("request_chain_blocks")

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
