"""Request identity digests recomputed with the columnar definition (issue 24).

``request_identities.content_sha256`` held `service.contract.identity.content_sha256`
of the request that holds each id. Issue 24 redefined that digest over batch
columns (`service.contract.batch.identity`, so a batch is hashed without
building request objects); a re-send after the upgrade would carry the new
digest and, compared with an old one, look like a conflicting request. So the
upgrade recomputes every stored digest from what the log keeps: the request's
stored payload (``requests.payload_zstd`` with its state cut out into
``cluster_snapshots.state_zstd``, joined back by `service.storage.log.payload.
stored_payload`), decoded by the converter ingest uses (`decode_request`) and
hashed by the current `content_sha256`.

In batches of `BATCH` ids by primary key, each its own transaction
(autocommit), so a large table is never one long transaction and a run that
stops part-way can be re-run: a recomputed digest is computed again to the
same value. An identity whose request row is gone or whose payload no longer
decodes gets NULL, which the writer treats as it treats identities back-filled
by 0011 (the time decides, then the decoded messages). Already NULL digests
stay NULL. Cost: one decompression, decode and hash per held id (about
0.4 ms each for a 64-node request on one core, measured on
`sample_requests(30, seed=3)`: some 7 minutes per million ids, plus the
reads); on a large log run it in a quiet hour, with
the writer stopped (a digest it writes meanwhile is the new definition's
already, so at worst it is recomputed to the same value).

This migration imports the service's decoder and digest: it computes the
definition of the code it ships with. A later change of the definition adds
its own migration, as this one does.

Downgrade sets every digest to NULL: the previous code cannot read the new
digests, and with NULL it compares the decoded messages instead.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from __future__ import annotations

from typing import Any

from alembic import op
from sqlalchemy import text

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

BATCH = 2_000
"""Identities recomputed per transaction."""

_READ = text(
    """
    SELECT i.request_id, r.payload_zstd, r.state_offset, c.state_zstd
      FROM request_identities i
      LEFT JOIN LATERAL (
            SELECT payload_zstd, state_offset, snapshot_hash FROM requests
             WHERE request_id = i.request_id AND request_time = i.request_time
             LIMIT 1) r ON true
      LEFT JOIN cluster_snapshots c ON c.snapshot_hash = r.snapshot_hash
     WHERE i.request_id > :after AND i.content_sha256 IS NOT NULL
     ORDER BY i.request_id
     LIMIT :n
    """
)

_WRITE = text(
    """
    UPDATE request_identities i SET content_sha256 = v.digest
      FROM unnest(CAST(:ids AS text[]), CAST(:digests AS bytea[])) AS v(request_id, digest)
     WHERE i.request_id = v.request_id
    """
)


def _digest(payload_zstd: bytes | None, offset: int | None, state_zstd: bytes | None) -> Any:
    from service.contract.identity import content_sha256
    from service.storage.log.payload import decode_request, stored_payload

    if payload_zstd is None:  # the request row is gone: nothing to recompute from
        return None
    try:
        return content_sha256(decode_request(stored_payload(payload_zstd, offset, state_zstd)))
    except Exception:  # a payload that no longer decodes: the messages decide, as for NULL
        return None


def _bytes(value: Any) -> bytes | None:
    return bytes(value) if value is not None else None


def recompute(connection: Any, batch: int = BATCH) -> int:
    """Recompute every stored digest, `batch` ids per statement; returns how many were read."""
    after, done = "", 0
    while True:
        rows = connection.execute(_READ, {"after": after, "n": batch}).all()
        if not rows:
            return done
        ids = [r[0] for r in rows]
        digests = [_digest(_bytes(r[1]), r[2], _bytes(r[3])) for r in rows]
        connection.execute(_WRITE, {"ids": ids, "digests": digests})
        after, done = ids[-1], done + len(rows)


def upgrade() -> None:
    with op.get_context().autocommit_block():
        recompute(op.get_bind())


def downgrade() -> None:
    op.execute("UPDATE request_identities SET content_sha256 = NULL")
