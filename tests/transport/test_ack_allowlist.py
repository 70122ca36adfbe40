"""Acks carry no decision: checked on the proto descriptors themselves.

The only strings an ack may hold are the echoed `request_id` and, on a refused
stream message, `field` (a bounded field path) and `reason` (a code of the
allow-list in service.contract.rejections); what they may *contain* is checked on
real acks in tests/transport/test_stream_acks.py.

Batch acks (issue 24) add exactly: per-request counts and the stream's running
totals (unsigned), `whole_batch` (a bool), and one repeated `BatchRejection`
whose strings are `field`, `reason` and `message` -- the validator's text about
the refused input (tests/transport/test_batch_grpc.py holds real messages to
the single-request validator's words), and whose number is the request's
`index` in the batch. A `BatchStreamAck` only wraps a `BatchAck`.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from service.wire.understudy.v1 import shadow_pb2

ACK_MESSAGES = ("MirrorAck", "OutcomeAck", "StreamAck", "BatchAck", "BatchStreamAck")
UNSIGNED = {FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64}
ECHO_FIELDS = {"request_id", "sequence"}
REFUSAL_STRINGS = {"field", "reason"}  # set only on refused stream messages
COUNTERS = {"accepted", "shed", "rejected", "stream_accepted", "stream_shed", "stream_rejected"}
FLAGS = {"whole_batch"}  # a batch refused as a whole
# The only message-typed fields an ack may hold: (ack, field) -> the message type.
NESTED = {("BatchAck", "rejections"): "BatchRejection", ("BatchStreamAck", "ack"): "BatchAck"}
REPEATED = {("BatchAck", "rejections")}
REJECTION_FIELDS = {
    "index": FieldDescriptor.TYPE_UINT32,  # the request's position in its batch
    "field": FieldDescriptor.TYPE_STRING,
    "reason": FieldDescriptor.TYPE_STRING,
    "message": FieldDescriptor.TYPE_STRING,  # the validator's text about the input
}
ACK_STATUSES = {
    "ACK_STATUS_UNSPECIFIED",
    "ACK_STATUS_ACCEPTED",
    "ACK_STATUS_SHED",
    "ACK_STATUS_REJECTED",
    "ACK_STATUS_REPEATED_SEQUENCE",
}


def _violations(message: Descriptor) -> list[str]:
    if message.name == "BatchRejection":
        return _rejection_violations(message)
    bad = []
    for f in message.fields:
        key = (message.name, f.name)
        if f.is_repeated and key not in REPEATED:
            bad.append(f"{f.name}: repeated fields are not allowed in an ack")
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            if NESTED.get(key) != f.message_type.name:
                bad.append(f"{f.name}: message {f.message_type.name} is not allowed here")
            else:
                bad += [f"{f.name}.{v}" for v in _violations(f.message_type)]
        elif f.type == FieldDescriptor.TYPE_BOOL and f.name in FLAGS:
            continue
        elif f.type == FieldDescriptor.TYPE_ENUM and f.enum_type.name == "AckStatus":
            if f.name != "status":
                bad.append(f"{f.name}: an AckStatus field must be called status")
        elif f.name in {"request_id"} | REFUSAL_STRINGS and f.type == FieldDescriptor.TYPE_STRING:
            continue
        elif f.type in UNSIGNED and f.name not in ECHO_FIELDS | COUNTERS:
            bad.append(f"{f.name}: unexpected counter")
        elif f.type in UNSIGNED:
            continue
        else:
            bad.append(f"{f.name}: type {f.type} is not allowed in an ack")
    return bad


def _rejection_violations(message: Descriptor) -> list[str]:
    bad = []
    for f in message.fields:
        if f.is_repeated or REJECTION_FIELDS.get(f.name) != f.type:
            bad.append(f"{f.name}: not a field a batch rejection may carry")
    return bad


def _pool_with_shadow() -> Any:
    """A fresh descriptor pool holding shadow.proto and everything it imports."""
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file: Any) -> None:
        for dependency in file.dependencies:
            add(dependency)
        if file.name not in added:
            added.add(file.name)
            pool.AddSerializedFile(file.serialized_pb)

    add(shadow_pb2.DESCRIPTOR)
    return pool


def test_every_response_of_the_service_is_an_allowed_ack() -> None:
    service = shadow_pb2.DESCRIPTOR.services_by_name["ShadowEvaluation"]
    outputs = {m.output_type.name for m in service.methods}
    assert outputs <= set(ACK_MESSAGES), f"unexpected response types: {outputs - set(ACK_MESSAGES)}"


def test_ack_fields_are_only_status_counters_and_echoes() -> None:
    for name in ACK_MESSAGES:
        assert _violations(shadow_pb2.DESCRIPTOR.message_types_by_name[name]) == [], name


def test_the_ack_status_vocabulary_is_the_documented_one() -> None:
    """A new status needs a row in docs/ingest.md's ack table (and this set)."""
    assert set(shadow_pb2.AckStatus.keys()) == ACK_STATUSES
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "ingest.md").read_text()
    for name in ACK_STATUSES - {"ACK_STATUS_UNSPECIFIED"}:
        assert f"`{name.removeprefix('ACK_STATUS_')}`" in doc, name


def test_batch_acks_are_checked_through_their_nesting() -> None:
    """BatchStreamAck -> BatchAck -> BatchRejection: each level is held to the list."""
    stream_ack = shadow_pb2.DESCRIPTOR.message_types_by_name["BatchStreamAck"]
    batch_ack = stream_ack.fields_by_name["ack"].message_type
    assert batch_ack.name == "BatchAck"
    assert batch_ack.fields_by_name["rejections"].message_type.name == "BatchRejection"
    assert {f.name for f in batch_ack.fields} == {
        "status",
        "sequence",
        "rejections",
    } | COUNTERS | FLAGS
    rejection = batch_ack.fields_by_name["rejections"].message_type
    assert {f.name for f in rejection.fields} == set(REJECTION_FIELDS)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("chosen_option", FieldDescriptor.TYPE_INT32),
        ("chosen_node", FieldDescriptor.TYPE_STRING),
        ("message", FieldDescriptor.TYPE_STRING),  # free text outside a BatchRejection
        ("whole_batch_score", FieldDescriptor.TYPE_BOOL),
    ],
)
def test_allowlist_rejects_a_decision_field(name: str, kind: int) -> None:
    """The check itself can fail: a chosen option, or a free-text string, is caught."""
    from google.protobuf import descriptor_pb2

    proto = descriptor_pb2.FileDescriptorProto(name="probe.proto", package="probe")
    proto.dependency.append("understudy/v1/shadow.proto")
    msg = proto.message_type.add(name="BadAck")
    msg.field.add(
        name="status",
        number=1,
        type=FieldDescriptor.TYPE_ENUM,
        type_name=".understudy.v1.AckStatus",
        label=FieldDescriptor.LABEL_OPTIONAL,
    )
    msg.field.add(
        name=name,
        number=2,
        type=kind,  # type: ignore[arg-type]
        label=FieldDescriptor.LABEL_OPTIONAL,
    )
    pool = _pool_with_shadow()
    pool.Add(proto)
    assert _violations(pool.FindMessageTypeByName("probe.BadAck")) != []


def test_allowlist_rejects_a_decision_inside_a_nested_message() -> None:
    """A rejection that carried a chosen option, or an ack nesting another message, fails."""
    from google.protobuf import descriptor_pb2

    proto = descriptor_pb2.FileDescriptorProto(name="probe2.proto", package="probe2")
    proto.dependency.append("understudy/v1/shadow.proto")
    rejection = proto.message_type.add(name="BatchRejection")
    for number, (name, kind) in enumerate(
        [("index", FieldDescriptor.TYPE_UINT32), ("chosen_option", FieldDescriptor.TYPE_UINT32)],
        start=1,
    ):
        rejection.field.add(
            name=name, number=number, type=kind, label=FieldDescriptor.LABEL_OPTIONAL
        )
    ack = proto.message_type.add(name="BatchAck")
    ack.field.add(
        name="rejections",
        number=1,
        type=FieldDescriptor.TYPE_MESSAGE,
        type_name=".probe2.BatchRejection",
        label=FieldDescriptor.LABEL_REPEATED,
    )
    ack.field.add(
        name="decision",
        number=2,
        type=FieldDescriptor.TYPE_MESSAGE,
        type_name=".understudy.v1.BatchRejection",
        label=FieldDescriptor.LABEL_OPTIONAL,
    )
    pool = _pool_with_shadow()
    pool.Add(proto)
    bad = _violations(pool.FindMessageTypeByName("probe2.BatchAck"))
    assert any("chosen_option" in b for b in bad), bad
    assert any(b.startswith("decision:") for b in bad), bad
