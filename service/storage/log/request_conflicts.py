"""Requests that reuse a logged ``(request_id, request_time)`` with other content.

A request is unique on ``(request_id, request_time)`` and the insert is ``ON
CONFLICT DO NOTHING``, so replays of journal records already committed are
no-ops. A second request under the same key with *other* content used to be
dropped the same way, silently. The first request stays (as the first outcome
of a request does); the contradicting one is recorded in ``conflicts`` with
``kind = 'request'`` (docs/storage.md, "Conflicts").

The writer calls `record` only when the insert skipped rows (the COPY-staged
batch offered more than it inserted), so the normal path pays nothing. Here
the skipped rows are first compared with the stored ones in SQL on their
stored bytes (snapshot hash, state offset, compressed payload): an exact
replay matches and costs nothing more. Rows whose bytes differ are compared by
content in Python: both payloads are rebuilt with their state, decoded, and
compared as messages (unknown fields dropped), so a re-encoding of the same
request is not a conflict. ``received_at`` and ``journal_seq`` are not content.

Each conflict row names the payload's sha256 and a summary on both sides; the
``conflicts_once`` index keeps one row per distinct incoming content however
often it is replayed or re-sent, and `record` counts only rows it added.
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
    SELECT s.request_id, s.request_time, r.journal_seq,
           {_SIDE.format(a="s")},
           {_SIDE.format(a="r")}
      FROM stage_requests s
     CROSS JOIN LATERAL (
            SELECT * FROM requests
             WHERE request_id = s.request_id AND request_time = to_timestamp(s.request_time)
             LIMIT 1) r
     WHERE s.snapshot_hash IS DISTINCT FROM r.snapshot_hash
        OR s.state_offset IS DISTINCT FROM r.state_offset
        OR s.payload_zstd <> r.payload_zstd
"""

_RECORD = """
    INSERT INTO conflicts (request_id, kind, existing, incoming)
    VALUES (%s, 'request', %s::jsonb, %s::jsonb)
    ON CONFLICT DO NOTHING
"""


def _payload(side: Sequence[Any]) -> bytes:
    payload_zstd, offset, state_zstd = side[:3]
    return stored_payload(payload_zstd, offset, state_zstd)


def _same_content(a: bytes, b: bytes) -> bool:
    try:
        first, second = pb.MirrorRequest.FromString(a), pb.MirrorRequest.FromString(b)
    except DecodeError:  # not expected (both were validated); then the bytes decide
        return a == b
    first.DiscardUnknownFields()
    second.DiscardUnknownFields()
    return first == second


def _described(request_time: float, payload: bytes, side: Sequence[Any]) -> dict[str, Any]:
    summary = dict(zip(_SUMMARY, side[3:], strict=True))
    return {
        "request_time": request_time,
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        **summary,
    }


def record(cur: psycopg.Cursor[Any]) -> int:
    """Record staged requests that contradict a logged one; returns how many were new.

    Call after the requests insert, in the same transaction, when it skipped rows.
    """
    cur.execute(_DIFFERING)
    found = cur.fetchall()
    if not found:
        return 0
    width = len(_SUMMARY) + 3
    rows = []
    for request_id, request_time, journal_seq, *sides in found:
        incoming_side, existing_side = sides[:width], sides[width:]
        incoming, existing = _payload(incoming_side), _payload(existing_side)
        if _same_content(incoming, existing):
            continue  # the same request, encoded differently
        described = _described(request_time, existing, existing_side)
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
