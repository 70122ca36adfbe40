"""Acks carry no decision: checked on the proto descriptors themselves.

The only strings an ack may hold are the echoed `request_id` and, on a refused
stream message, `field` (a bounded field path) and `reason` (a code of the
allow-list in service.contract.rejections); what they may *contain* is checked on
real acks in tests/transport/test_stream_acks.py.
"""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from service.wire.understudy.v1 import shadow_pb2

ACK_MESSAGES = ("MirrorAck", "OutcomeAck", "StreamAck")
UNSIGNED = {FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64}
ECHO_FIELDS = {"request_id", "sequence"}
REFUSAL_STRINGS = {"field", "reason"}  # set only on refused stream messages
ACK_STATUSES = {
    "ACK_STATUS_UNSPECIFIED",
    "ACK_STATUS_ACCEPTED",
    "ACK_STATUS_SHED",
    "ACK_STATUS_REJECTED",
    "ACK_STATUS_REPEATED_SEQUENCE",
}


def _violations(message: Descriptor) -> list[str]:
    bad = []
    for f in message.fields:
        if f.is_repeated:
            bad.append(f"{f.name}: repeated fields are not allowed in an ack")
        elif f.type == FieldDescriptor.TYPE_ENUM and f.enum_type.name == "AckStatus":
            if f.name != "status":
                bad.append(f"{f.name}: an AckStatus field must be called status")
        elif f.name in {"request_id"} | REFUSAL_STRINGS and f.type == FieldDescriptor.TYPE_STRING:
            continue
        elif f.type in UNSIGNED and f.name not in ECHO_FIELDS | {"accepted", "shed", "rejected"}:
            bad.append(f"{f.name}: unexpected counter")
        elif f.type in UNSIGNED:
            continue
        else:
            bad.append(f"{f.name}: type {f.type} is not allowed in an ack")
    return bad


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


@pytest.mark.parametrize(
    ("name", "kind"),
    [("chosen_option", FieldDescriptor.TYPE_INT32), ("chosen_node", FieldDescriptor.TYPE_STRING)],
)
def test_allowlist_rejects_a_decision_field(name: str, kind: int) -> None:
    """The check itself can fail: a chosen option, or a free-text string, is caught."""
    from google.protobuf import descriptor_pb2, descriptor_pool

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
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(shadow_pb2.DESCRIPTOR.dependencies[0].serialized_pb)
    pool.AddSerializedFile(shadow_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(proto)
    assert _violations(pool.FindMessageTypeByName("probe.BadAck")) != []
