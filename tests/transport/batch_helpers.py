"""Batches for the transport tests: real sample requests, spoiled at chosen indexes.

`spoil` breaks one request of an encoded `MirrorBatch` in place (its own
column values only, so no other request changes), and `single_verdicts` is the
oracle: what the single-request validator says of each request the batch
encodes. The batch transports must refuse exactly those, with those words.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from service.contract import InvalidInput, MirrorRequest, Outcome, RequestLimits, validate_request
from service.contract.batch import OutcomeColumns, RequestBatch
from service.contract.rejections import refusal_of
from service.metrics import field_label
from service.pipeline import batch_record
from service.pipeline.journal_format import RecordKind
from service.server.app import Service
from service.wire.batch_codec import batch_from_pb, batch_to_pb, outcomes_to_pb
from service.wire.understudy.v1 import batch_pb2, contract_pb2

Verdict = tuple[str, str, str]
"""(bounded field, reason code, the validator's message) of one refused request."""


def with_ids(sample: list[MirrorRequest], n: int, tag: str) -> list[MirrorRequest]:
    """`n` distinct sample requests (each with its own snapshot), ids `tag-0`..."""
    assert n <= len(sample), "each request must keep a snapshot of its own"
    return [dataclasses.replace(sample[i], request_id=f"{tag}-{i}") for i in range(n)]


def encode(requests: list[MirrorRequest]) -> batch_pb2.MirrorBatch:
    """The `MirrorBatch` of `requests` (helper A's encoder, as a client sends it)."""
    return batch_to_pb(RequestBatch.from_requests(requests))


def _set(column: bytes, dtype: str, at: int, value: float) -> bytes:
    array = np.frombuffer(column, dtype=dtype).copy()
    array[at] = value
    return array.tobytes()


def spoil(msg: batch_pb2.MirrorBatch, index: int, how: str) -> None:
    """Break request `index` of `msg`: `request_time` (NaN), `gang_size` (0) or
    `cpu_free` (node 5 of its own snapshot below zero)."""
    if how == "request_time":
        msg.request_time = _set(msg.request_time, "<f8", index, float("nan"))
    elif how == "gang_size":
        msg.workloads.gang_size = _set(msg.workloads.gang_size, "<i4", index, 0)
    elif how == "cpu_free":
        state = int(np.frombuffer(msg.state_index, dtype="<u4")[index])
        node = int(np.frombuffer(msg.states.node_offsets, dtype="<i8")[state]) + 5
        msg.states.cpu_free = _set(msg.states.cpu_free, "<f4", node, -1.0)
    else:
        raise ValueError(how)


def truncate(msg: batch_pb2.MirrorBatch) -> None:
    """Cut the last two bytes off `states.cpu_free`: not a whole number of f32."""
    msg.states.cpu_free = msg.states.cpu_free[:-2]


def single_verdicts(msg: batch_pb2.MirrorBatch) -> dict[int, Verdict]:
    """What `validate_request` says of each refused request the batch encodes."""
    out = {}
    for i, request in enumerate(batch_from_pb(msg, RequestLimits()).requests()):
        try:
            validate_request(request)
        except InvalidInput as exc:
            refusal = refusal_of(exc)
            assert refusal is not None
            out[i] = (field_label(exc.field), refusal.reason.value, str(exc))
    return out


def ack_verdicts(rejections: Any) -> dict[int, Verdict]:
    """The refusals of a BatchAck (or the HTTP reply's list) by index."""
    out = {}
    for r in rejections:
        row = (
            r
            if isinstance(r, dict)
            else {k: getattr(r, k) for k in ("index", "field", "reason", "message")}
        )
        out[int(row["index"])] = (str(row["field"]), str(row["reason"]), str(row["message"]))
    return out


def outcomes(requests: list[MirrorRequest]) -> list[Outcome]:
    """One outcome per request."""
    return [
        Outcome(request_id=r.request_id, observed_at=r.request_time + 60.0, queue_delay_s=1.5)
        for r in requests
    ]


def encode_outcomes(items: list[Outcome]) -> batch_pb2.OutcomeBatch:
    """The `OutcomeBatch` of `items`."""
    return outcomes_to_pb(OutcomeColumns.from_outcomes(items))


def journaled(service: Service) -> list[str]:
    """Request ids in the journal, in order, whatever the record's form."""
    ids: list[str] = []
    for record in service.journal.read("scorer", 10_000):
        if record.kind == RecordKind.MIRROR_BATCH:
            ids += batch_record.request_ids_of(batch_record.unpack(record.payload))
        elif record.kind == RecordKind.MIRROR:
            ids.append(contract_pb2.MirrorRequest.FromString(record.payload).request_id)
    return ids


def journaled_outcomes(service: Service) -> list[str]:
    """Outcome request ids in the journal, in order."""
    ids: list[str] = []
    for record in service.journal.read("scorer", 10_000):
        if record.kind == RecordKind.OUTCOME_BATCH:
            ids += [
                o.request_id for o in batch_record.outcomes_of(batch_record.unpack(record.payload))
            ]
    return ids


def counted(service: Service, name: str, **labels: str) -> float:
    """A counter's value (0 when the series does not exist)."""
    return service.metrics.registry.get_sample_value(name, labels) or 0.0
