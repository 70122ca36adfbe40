"""HTTP bodies to contract objects and journal payloads, on the ingest hot path.

A mirror body is decoded once by msgspec (`service.transport.http.structs`:
types and ranges checked in C), then copied column by column into both the
contract's numpy arrays and the protobuf message the journal stores. No
pydantic model and no per-node Python object is built on the way.

Refusals take the other road: a body msgspec will not take is decoded again
by the pydantic models (`service.transport.http.convert`), whose refusal
names the field exactly as before. The few bodies pydantic accepts but
msgspec does not (NaN, Infinity, numbers beyond a double) are converted there
too; their contract object is rebuilt from the encoded payload so that it is
still what the scorer would decode from the journal (``canonical=True``).
"""

from __future__ import annotations

from service.contract import (
    MirrorRequest,
    Outcome,
)
from service.contract.hardware import CAPABILITIES
from service.contract.schema_versions import V1_SCHEMA
from service.transport.http import convert, structs
from service.wire.convert import mirror_request_from_pb
from service.wire.understudy.v1 import contract_pb2 as pb

_KIND = {
    "train": pb.WORKLOAD_KIND_TRAIN,
    "finetune": pb.WORKLOAD_KIND_FINETUNE,
    "infer": pb.WORKLOAD_KIND_INFER,
    "batch": pb.WORKLOAD_KIND_BATCH,
}
# Every repeated scalar of ClusterState: copied as a whole list in one C call each.
_STATE_COLUMNS = (
    "node_ids",
    "node_hardware",
    "accelerators_free",
    "accelerators_total",
    "cpu_free",
    "cpu_total",
    "memory_free_gb",
    "memory_total_gb",
    "utilisation",
    "queue_length",
    "healthy",
    "draining",
    "zone",
    "locality",
    "label_offsets",
    "labels",
    "device_offsets",
    "device_hardware",
    "device_free_share",
    "device_free_memory_gb",
    "device_ids",
)
_WORKLOAD_SCALARS = (
    "workload_id",
    "model_family",
    "model_size_b",
    "accelerators",
    "accelerator_memory_gb",
    "cpu_per_node",
    "memory_per_node_gb",
    "gang_size",
    "priority",
    "tenant",
    "qos_class",
)
# What upb raises for a value it cannot store (a lone surrogate in a string, say).
_UNSTORABLE = (ValueError, TypeError, OverflowError)


def mirror_from_json(body: bytes) -> tuple[MirrorRequest, bytes]:
    """The contract request and its protobuf payload, from an HTTP mirror body.

    The request equals what decoding the payload gives, so ingest may hand it
    to the scorer as is.

    Raises:
        InvalidInput: naming the field, worded by the pydantic models.
    """
    try:
        m = structs.MIRROR.decode(body)
        payload = _mirror_pb(m).SerializeToString()
    except (structs.Refused, *_UNSTORABLE):
        _, payload = convert.mirror_from_json(body)  # refuses, naming the field
        return mirror_request_from_pb(pb.MirrorRequest.FromString(payload)), payload
    return convert.request_from_model(m), payload


def outcome_from_json(body: bytes) -> tuple[Outcome, bytes]:
    """The contract outcome and its protobuf payload, from an HTTP outcome body.

    Raises:
        InvalidInput: naming the field, worded by the pydantic models.
    """
    try:
        m = structs.OUTCOME.decode(body)
    except structs.Refused:
        return convert.outcome_from_json(body)
    return convert.outcome_from_model(m)


def _mirror_pb(m: structs.MirrorRequest) -> pb.MirrorRequest:
    """The protobuf form, filled in place (a sub-message passed to a constructor is copied)."""
    msg = pb.MirrorRequest(
        schema_version=m.schema_version, request_id=m.request_id, request_time=m.request_time
    )
    if m.quota_remaining is not None:
        msg.quota_remaining = m.quota_remaining
    if m.production is not None:
        msg.production.option = m.production.option
        if m.production.propensity is not None:
            msg.production.propensity = m.production.propensity
        msg.production.probabilities.extend(m.production.probabilities)
        if m.production.defer_probability is not None:
            msg.production.defer_probability = m.production.defer_probability
    s, state = m.state, msg.state
    for h in s.hardware:
        added = state.hardware.add(name=h.name)
        for name in CAPABILITIES:  # unknown (None) stays unset
            value = getattr(h, name)
            if value is not None:
                setattr(added, name, value)
    for column in _STATE_COLUMNS:
        getattr(state, column).extend(getattr(s, column))
    w, workload = m.workload, msg.workload
    for name in _WORKLOAD_SCALARS:
        setattr(workload, name, getattr(w, name))
    # As service.wire.convert.workload_to_pb: the enum for a known kind, the name from
    # schema 2 on or when the enum cannot say it (a schema-1 body is then refused).
    known = _KIND.get(w.kind)
    if known is not None:
        workload.kind = known
    if known is None or m.schema_version != V1_SCHEMA:
        workload.kind_name = w.kind
    if w.accelerator_share is not None:
        workload.accelerator_share = w.accelerator_share
    if w.slo_seconds is not None:
        workload.slo_seconds = w.slo_seconds
    if w.work_units is not None:
        workload.work_units = w.work_units
    workload.allowed_hardware.extend(w.allowed_hardware)
    workload.affinity.extend(w.affinity)
    workload.anti_affinity.extend(w.anti_affinity)
    o, options = m.options, msg.options
    options.node_offsets.extend(o.node_offsets)
    options.node_index.extend(o.node_index)
    options.accelerators.extend(o.accelerators)
    options.option_ids.extend(o.option_ids)
    options.device_offsets.extend(o.device_offsets)
    options.device_index.extend(o.device_index)
    return msg
