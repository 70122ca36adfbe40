"""What a test's service journaled, whichever way the client sent it (one by one or in batches)."""

from __future__ import annotations

from service.contract import MirrorRequest
from service.pipeline.batch_record import requests_of, unpack
from service.pipeline.journal_format import RecordKind
from service.server.app import Service
from service.wire.convert import mirror_request_from_pb
from service.wire.understudy.v1 import contract_pb2


def journaled_requests(service: Service, limit: int = 1_000_000) -> list[MirrorRequest]:
    """Every journaled mirror request, in journal order (a batch record's accepted rows)."""
    out: list[MirrorRequest] = []
    for record in service.journal.read("scorer", limit):
        if record.kind == RecordKind.MIRROR:
            out.append(
                mirror_request_from_pb(contract_pb2.MirrorRequest.FromString(record.payload))
            )
        elif record.kind == RecordKind.MIRROR_BATCH:
            out += requests_of(unpack(record.payload, RecordKind.MIRROR_BATCH))
    return out


def journal_kinds(service: Service, limit: int = 1_000_000) -> list[RecordKind]:
    """The kind of every journal record, in order."""
    return [record.kind for record in service.journal.read("scorer", limit)]
