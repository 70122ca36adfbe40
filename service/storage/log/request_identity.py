"""One request per ``request_id``, guaranteed by the database (docs/storage.md, "Identity").

``requests`` is partitioned by ``request_time``, so its primary key can only be
``(request_id, request_time)``: the same id re-sent with another time would be
a second row and a second set of decisions. ``request_identities`` (migration
0011, not partitioned) has ``request_id`` alone as its primary key and holds,
per id, the request time, `service.contract.identity.content_sha256` of the
first request logged under it, and its journal seq.

`claim` runs first in the writer's transaction, before the requests insert:
it inserts the staged identities (``ON CONFLICT DO NOTHING``; within one
batch, the lowest journal seq first), then moves out of ``stage_requests``
every staged request whose id is held at another ``request_time`` (the time
is content, so that is another request). Those rows, and their decisions,
never reach the log; `service.storage.log.request_conflicts` records each in
``conflicts`` (``kind = 'request'``, once per distinct content). A staged
request at the held time stays staged: the requests insert skips it as a
duplicate and `request_conflicts.record` tells a re-send (the same digest)
from a contradiction (another digest).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

_CLAIM = """
    INSERT INTO request_identities (request_id, request_time, content_sha256, journal_seq)
    SELECT DISTINCT ON (request_id)
           request_id, to_timestamp(request_time), content_sha256, journal_seq
      FROM stage_requests
     ORDER BY request_id, journal_seq
    ON CONFLICT (request_id) DO NOTHING
"""

# Staged requests whose id is held at another time, moved aside. One primary-key
# probe per staged row; nothing is moved in the normal case.
_REFUSE = """
    WITH moved AS (
        DELETE FROM stage_requests s
         USING request_identities i
         WHERE i.request_id = s.request_id
           AND i.request_time <> to_timestamp(s.request_time)
        RETURNING s.*)
    INSERT INTO stage_refused_requests SELECT * FROM moved
    RETURNING request_id, request_time
"""


@dataclass(frozen=True, slots=True)
class Claimed:
    """The ``(request_id, request_time)`` refused, and how many staged rows that was."""

    refused: frozenset[tuple[str, float]]
    n_refused: int  # a pair may be staged more than once


def claim(cur: psycopg.Cursor[Any]) -> Claimed:
    """Claim the staged requests' ids; move those held at another time aside.

    Call after ``stage_requests`` is filled and before the requests insert, in
    the same transaction; the moved rows wait in ``stage_refused_requests`` for
    `service.storage.log.request_conflicts.record_refused` (after the insert,
    so an id claimed earlier in the same batch has its request row to compare).
    """
    cur.execute(_CLAIM)
    cur.execute(_REFUSE)
    found = cur.fetchall()
    return Claimed(frozenset((r[0], r[1]) for r in found), len(found))
