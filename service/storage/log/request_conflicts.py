"""Requests that reuse a logged ``request_id`` with other content (docs/storage.md, "Conflicts").

One request per ``request_id`` (`service.storage.log.request_identity` holds
the ids). A second request under a held id is recorded in ``conflicts`` with
``kind = 'request'`` and never logged; the first stays (as the first outcome
of a request does). Two ways to get here:

- `record_refused`: the id is held at another ``request_time``. The time is
  content, so it is another request; `request_identity.claim` moved it aside
  before the insert, and its decisions are not logged either.
- `record`: the same ``(request_id, request_time)``, skipped by the insert's
  ``ON CONFLICT DO NOTHING`` (called only when the insert skipped rows, so the
  normal path pays nothing). An exact replay (the same stored bytes: snapshot
  hash, state offset, compressed payload) costs nothing more. Otherwise the
  two are the same request iff their `service.contract.identity.content_sha256`
  digests are equal (the staged one against the one held in
  ``request_identities``: the definition ingest uses too); for an id logged
  before migration 0011 (no digest held) both payloads are rebuilt with their
  state, decoded and compared as messages (unknown fields dropped). Either
  way a re-encoding of the same request is not a conflict, and
  ``received_at`` and ``journal_seq`` are not content.

Each conflict row names the payload's sha256 and a summary on both sides; the
``conflicts_once`` index keeps one row per distinct incoming content however
often it is replayed or re-sent, and both functions count only rows they added.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import psycopg
from google.protobuf.message import DecodeError

from service.storage.log.payload import stored_payload
from service.wire.understudy.v1 import contract_pb2 as pb

_SIDE = (
    "{a}.payload_zstd, {a}.state_offset, "
    "(SELECT state_zstd FROM cluster_snapshots WHERE snapshot_hash = {a}.snapshot_hash), "
    "{a}.workload_id, {a}.tenant, {a}.n_options, {a}.n_nodes, {a}.production_option, "
    "{a}.production_propensity"
)
_SUMMARY = (
    "workload_id",
    "tenant",
    "n_options",
    "n_nodes",
    "production_option",
    "production_propensity",
)

# Staged rows whose key is logged with different stored bytes. The staged row that
# was inserted matches itself; an exact replay matches the stored row. The lookup is
# a LATERAL ... LIMIT 1 (never flattened into a join) so that each staged row is one
# probe of the unique index of its day's partition, never a scan of `requests`; the
# snapshots are read (by primary key) only for the rows that differ.
_DIFFERING = f"""
    SELECT s.request_id, s.request_time, s.request_time, r.journal_seq,
           s.content_sha256 = i.content_sha256,
           {_SIDE.format(a="s")},
           {_SIDE.format(a="r")}
      FROM stage_requests s
     CROSS JOIN LATERAL (
            SELECT * FROM requests
             WHERE request_id = s.request_id AND request_time = to_timestamp(s.request_time)
             LIMIT 1) r
      LEFT JOIN request_identities i ON i.request_id = s.request_id
     WHERE s.snapshot_hash IS DISTINCT FROM r.snapshot_hash
        OR s.state_offset IS DISTINCT FROM r.state_offset
        OR s.payload_zstd <> r.payload_zstd
"""

# Staged rows moved aside because their id is held at another time, with the
# request that holds it (LEFT: an identity whose request row is gone still refuses).
_REFUSED = f"""
    SELECT s.request_id, s.request_time, extract(epoch FROM i.request_time)::float8,
           r.journal_seq, false,
           {_SIDE.format(a="s")},
           {_SIDE.format(a="r")}
      FROM stage_refused_requests s
      JOIN request_identities i ON i.request_id = s.request_id
      LEFT JOIN LATERAL (
            SELECT * FROM requests
             WHERE request_id = s.request_id AND request_time = i.request_time
             LIMIT 1) r ON true
"""

_RECORD = """
    INSERT INTO conflicts (request_id, kind, existing, incoming)
    VALUES (%s, 'request', %s::jsonb, %s::jsonb)
    ON CONFLICT DO NOTHING
"""


def _payload(side: Sequence[Any]) -> bytes | None:
    payload_zstd, offset, state_zstd = side[:3]
    if payload_zstd is None:  # the holding request's row is not in `requests`
        return None
    return stored_payload(payload_zstd, offset, state_zstd)


def _same_content(a: bytes, b: bytes) -> bool:
    try:
        first, second = pb.MirrorRequest.FromString(a), pb.MirrorRequest.FromString(b)
    except DecodeError:  # not expected (both were validated); then the bytes decide
        return a == b
    first.DiscardUnknownFields()
    second.DiscardUnknownFields()
    return first == second


def _described(request_time: float, payload: bytes | None, side: Sequence[Any]) -> dict[str, Any]:
    summary = dict(zip(_SUMMARY, side[3:], strict=True))
    return {
        "request_time": request_time,
        "payload_sha256": hashlib.sha256(payload).hexdigest() if payload is not None else None,
        **summary,
    }


def record(cur: psycopg.Cursor[Any]) -> int:
    """Record staged requests that contradict a logged one; returns how many were new.

    Call after the requests insert, in the same transaction, when it skipped rows.
    """
    cur.execute(_DIFFERING)
    return _record_found(cur, cur.fetchall())


def record_refused(cur: psycopg.Cursor[Any]) -> int:
    """Record the requests `request_identity.claim` refused; returns how many were new.

    Call after the requests insert, in the same transaction, when it refused rows.
    """
    cur.execute(_REFUSED)
    found = cur.fetchall()
    cur.execute("TRUNCATE stage_refused_requests")  # ON COMMIT empties it too; be explicit
    return _record_found(cur, found)


def _record_found(cur: psycopg.Cursor[Any], found: Sequence[Sequence[Any]]) -> int:
    if not found:
        return 0
    width = len(_SUMMARY) + 3
    rows = []
    for request_id, request_time, held_time, journal_seq, same_digest, *sides in found:
        incoming_side, existing_side = sides[:width], sides[width:]
        incoming, existing = _payload(incoming_side), _payload(existing_side)
        if same_digest:
            continue  # the same request (the identity's definition), encoded differently
        if (  # held before migration 0011: no digest to compare, the messages decide
            same_digest is None
            and incoming is not None
            and existing is not None
            and _same_content(incoming, existing)
        ):
            continue
        described = _described(held_time, existing, existing_side)
        rows.append(
            (
                request_id,
                json.dumps({**described, "journal_seq": journal_seq}),
                json.dumps(_described(request_time, incoming, incoming_side)),
            )
        )
    recorded = 0
    for row in rows:
        cur.execute(_RECORD, row)
        recorded += max(cur.rowcount, 0)
    return recorded
