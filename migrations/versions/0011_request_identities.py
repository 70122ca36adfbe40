"""Request identities: one request per ``request_id``, whatever its time.

``requests`` is partitioned by ``request_time``, so its primary key is
``(request_id, request_time)`` and the same id re-sent with another time used
to become a second request with a second set of decisions (issue 22 item 5).
``request_identities`` is not partitioned: ``request_id`` alone is its primary
key, so the database itself allows one request per id. The writer claims the
id in the same transaction as the request rows (`service.storage.log.
request_identity`) and records a request refused for a taken id in
``conflicts`` (``kind = 'request'``).

Columns: the time and ``content_sha256`` (`service.contract.identity`, what
makes a re-send the same request) of the request that holds the id, and its
journal seq.

Upgrade back-fills one identity per id already logged: the first received
(then the lowest journal seq) when the old behaviour left several. Their
digest is NULL (it is computed from the decoded request, not in SQL): for
those the writer compares the time, and a same-time re-send by content as it
did before. One pass over ``requests``; on a large log, run it in a quiet hour.

Downgrade drops the table: the requests themselves are untouched.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE request_identities (
            request_id text NOT NULL,
            request_time timestamptz NOT NULL,
            content_sha256 bytea,
            journal_seq bigint,
            CONSTRAINT request_identities_pkey PRIMARY KEY (request_id),
            CONSTRAINT request_identities_sha256
                CHECK (content_sha256 IS NULL OR octet_length(content_sha256) = 32)
        )
        """
    )
    op.execute(
        """
        INSERT INTO request_identities (request_id, request_time, content_sha256, journal_seq)
        SELECT DISTINCT ON (request_id) request_id, request_time, NULL, journal_seq
          FROM requests
         ORDER BY request_id, received_at, journal_seq
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS request_identities")
