"""Migration 0014: stored request digests recomputed with the columnar definition (issue 24).

On the real PostgreSQL: identities written under another digest definition
(what 0013's code stored) would make a re-send after the upgrade look like a
conflicting request; after 0014 each holds `content_sha256` of its logged
request, recomputed from the stored payload, and the re-send is a duplicate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from sqlalchemy import Engine, create_engine, pool, text

from service.contract import MirrorRequest
from service.contract.identity import content_sha256
from service.storage import DecisionLogWriter, LogBatch, make_engine, rows_from
from service.storage.migrate import downgrade, upgrade
from tests.storage.storage_helpers import FEATURES, payload_of, request_batch

MIGRATION = Path(__file__).parents[2] / "migrations/versions/0014_request_digests_columnar.py"


def _migration() -> ModuleType:
    spec = importlib.util.spec_from_file_location("migration_0014", MIGRATION)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _held(engine: Engine) -> dict[str, bytes | None]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT request_id, content_sha256 FROM request_identities"))
        return {r[0]: bytes(r[1]) if r[1] is not None else None for r in rows}


def _stale(engine: Engine, ids: list[str]) -> None:
    """Give `ids` digests of another definition, as the code before issue 24 stored them."""
    with engine.begin() as conn:
        for request_id in ids:
            conn.execute(
                text("UPDATE request_identities SET content_sha256 = :d WHERE request_id = :i"),
                {
                    "d": hashlib.sha256(b"old definition " + request_id.encode()).digest(),
                    "i": request_id,
                },
            )


def _resend(writer: DecisionLogWriter, r: MirrorRequest, seq: int) -> tuple[int, int]:
    """`r` again, other bytes (version 1, an unknown field): (duplicates, conflicts)."""
    v1 = dataclasses.replace(r, schema_version=1)
    padded = payload_of(v1) + bytes([0xB8, 0x3E, 0x01])
    row, snapshot = rows_from(v1, padded, seq, r.request_time + 9.0, *FEATURES)
    result = writer.write(
        LogBatch(requests=[row], snapshots=[snapshot] if snapshot else [], decisions=[])
    )
    return result.requests.duplicates, result.request_conflicts


def test_0014_recomputes_every_held_digest_and_a_resend_stays_a_duplicate(
    fresh_db: Callable[[bool], str], requests_sample: list[MirrorRequest]
) -> None:
    url = fresh_db(False)
    upgrade(url)
    engine = make_engine(url)
    try:
        kept = requests_sample[:5]
        writer = DecisionLogWriter(engine)
        writer.write(request_batch(kept))
        gone, never = kept[3], kept[4]
        ids = [r.request_id for r in kept]
        assert _held(engine) == {r.request_id: content_sha256(r) for r in kept}

        downgrade(url, "0013")
        assert set(_held(engine).values()) == {None}  # downgrade: the messages decide
        _stale(engine, ids[:4])  # `never` keeps NULL (back-filled by 0011)
        with engine.begin() as conn:  # an identity whose request row is gone
            conn.execute(text("DELETE FROM requests WHERE request_id = :i"), {"i": gone.request_id})
        # Under the stale digest a re-send is taken for a conflict: what 0014 prevents.
        assert _resend(writer, kept[0], 90) == (1, 1)

        upgrade(url)
        held = _held(engine)
        assert held == {
            **{r.request_id: content_sha256(r) for r in kept[:3]},
            gone.request_id: None,
            never.request_id: None,
        }
        assert _resend(writer, kept[1], 91) == (1, 0)
        assert _resend(writer, kept[2], 92) == (1, 0)
        other = dataclasses.replace(
            kept[2], workload=dataclasses.replace(kept[2].workload, tenant="t")
        )
        assert writer.write(request_batch([other], first_seq=93)).request_conflicts == 1
    finally:
        engine.dispose()


def test_0014_recomputes_in_batches_and_can_be_run_again(
    fresh_db: Callable[[bool], str], requests_sample: list[MirrorRequest]
) -> None:
    """Batches of ids by primary key, each its own statement; re-running changes nothing."""
    url = fresh_db(False)
    upgrade(url)
    engine = make_engine(url)
    try:
        kept = requests_sample[5:12]
        DecisionLogWriter(engine).write(request_batch(kept))
        ids = [r.request_id for r in kept]
        _stale(engine, ids)
        migration = _migration()
        autocommit = create_engine(url, poolclass=pool.NullPool, isolation_level="AUTOCOMMIT")
        try:
            with autocommit.connect() as conn:
                assert migration.recompute(conn, batch=2) == len(kept)
                expected = {r.request_id: content_sha256(r) for r in kept}
                assert _held(engine) == expected
                assert migration.recompute(conn, batch=3) == len(kept)  # again: the same
                assert _held(engine) == expected
        finally:
            autocommit.dispose()
    finally:
        engine.dispose()
