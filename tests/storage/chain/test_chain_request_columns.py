"""The requests chain covers migration 0010's columns, and rows logged before it still verify.

Rows written before 0010 have the four columns NULL: they must hash exactly
as they did when they were sealed (else an upgrade would break every sealed
request); rows that set any of them are hashed with them, so editing the
logged feasibility bits, the QoS class or production's distribution of a
sealed request — or clearing them — fails verification.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import Engine, text

from service.storage.chain.codec import REQUESTS, _hash_sql, row_hash_sql
from service.storage.chain.seal import ChainSealer
from service.storage.chain.verify import verify
from tests.storage.chain.chain_helpers import sql

LATER = ("feasibility_version", "feasibility_bits", "production_probabilities_f64", "qos_class")


def _as_before_0010(engine: Engine, prefix: str) -> None:
    """Make `prefix`'s requests look as a log written before migration 0010 holds them."""
    sets = ", ".join(f"{c} = NULL" for c in LATER)
    sql(engine, f"UPDATE requests SET {sets} WHERE request_id LIKE :p", p=f"{prefix}-%")


def _with_bits(engine: Engine, request_id: str) -> None:
    sql(
        engine,
        "UPDATE requests SET feasibility_version = 'feasibility-v1', "
        "feasibility_bits = '\\x01000000'::bytea WHERE request_id = :r",
        r=request_id,
    )


def _hashes(engine: Engine, where: str) -> list[tuple[bytes, bytes]]:
    """(the chain's row hash, the hash the encoding before 0010 gives) per matching row."""
    before = _hash_sql(REQUESTS.row_domain, REQUESTS.fields)
    with engine.connect() as conn:
        rows = conn.execute(
            text(f"SELECT {row_hash_sql(REQUESTS)}, {before} FROM requests WHERE {where}")
        ).all()
    return [(bytes(a), bytes(b)) for a, b in rows]


def test_covers_every_request_column(logged: Engine) -> None:
    with logged.connect() as conn:
        columns = set(
            conn.execute(
                text(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = current_schema() AND table_name = 'requests'"
                )
            ).scalars()
        )
    assert set(LATER) <= REQUESTS.covers
    assert columns <= REQUESTS.covers


def test_a_row_from_before_0010_hashes_as_it_did_and_a_new_one_does_not(logged: Engine) -> None:
    _as_before_0010(logged, "a")
    _with_bits(logged, "b-3")

    old = _hashes(logged, "request_id LIKE 'a-%'")
    new = _hashes(logged, "request_id LIKE 'b-%'")

    assert len(old) == 40 and all(chain == before for chain, before in old)
    assert len(new) == 30 and all(chain != before for chain, before in new)


def test_old_and_new_rows_seal_and_verify_by_both_implementations(
    logged: Engine, make_sealer: Callable[..., ChainSealer]
) -> None:
    """The sealer hashes in SQL and `verify` in Python from COPY: they agree on both forms."""
    _as_before_0010(logged, "a")
    _with_bits(logged, "b-3")
    sealer = make_sealer()
    sealer.seal_all()

    report = verify(logged, [sealer.anchor.path], sealer.anchor.key)

    assert report.ok, report.first


@pytest.mark.parametrize(
    ("what", "edit"),
    [
        ("a mask bit", "feasibility_bits = '\\x03000000'::bytea"),
        ("the version", "feasibility_version = 'feasibility-v2'"),
        ("the QoS class", "qos_class = 'BE'"),
        ("production's distribution", "production_probabilities_f64 = '\\x00'::bytea"),
        ("all of them cleared", ", ".join(f"{c} = NULL" for c in LATER)),
    ],
)
def test_an_edit_of_a_sealed_request_column_fails(
    logged: Engine, make_sealer: Callable[..., ChainSealer], what: str, edit: str
) -> None:
    _with_bits(logged, "b-3")
    sealer = make_sealer()
    sealer.seal_all()
    sql(logged, f"UPDATE requests SET {edit} WHERE request_id = 'b-3'")

    report = verify(logged, [sealer.anchor.path], sealer.anchor.key)

    assert not report.ok, what
    assert report.first is not None and report.first.table == "requests"
    assert "b-3" in str(report.first)


def test_setting_a_column_on_a_sealed_row_from_before_0010_fails(
    logged: Engine, make_sealer: Callable[..., ChainSealer]
) -> None:
    _as_before_0010(logged, "a")
    sealer = make_sealer()
    sealer.seal_all()
    _with_bits(logged, "a-7")

    report = verify(logged, [sealer.anchor.path], sealer.anchor.key)

    assert not report.ok
    assert report.first is not None and report.first.table == "requests"
