"""Stream acks say what happened to each message, with one number per message (issue 22 item 6).

Against a real service: a repeated or lower sequence is refused with its own
status (`REPEATED_SEQUENCE`) and reason, never `REJECTED` under the number of a
message already accepted, and the next valid message is still accepted; every
refused ack names a bounded field and a reason code of the allow-list (nothing
else, never a decision); cumulative `ACCEPTED` acks keep their meaning; each
refusal is counted by reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from service.contract import MirrorRequest
from service.contract.rejections import REASON_CODES
from service.pipeline.journal_format import RecordKind
from service.server.app import Service
from service.transport.grpc.servicer import SERVICE_NAME
from service.wire.convert import mirror_request_to_pb
from service.wire.field_paths import KNOWN_FIELD_PATHS
from service.wire.understudy.v1 import contract_pb2, shadow_pb2

ACCEPTED = shadow_pb2.ACK_STATUS_ACCEPTED
REJECTED = shadow_pb2.ACK_STATUS_REJECTED
REPEATED = shadow_pb2.ACK_STATUS_REPEATED_SEQUENCE
Metadata = tuple[tuple[str, str], ...]


def _stream(channel: grpc.Channel, raws: list[bytes], auth: Metadata) -> list[Any]:
    call = channel.stream_stream(
        f"/{SERVICE_NAME}/MirrorStream",
        request_serializer=lambda b: b,
        response_deserializer=shadow_pb2.StreamAck.FromString,
    )
    return list(call(iter(raws), metadata=auth, timeout=30))


def _envelope(request: MirrorRequest, sequence: int, request_id: str) -> bytes:
    msg = mirror_request_to_pb(request)
    msg.request_id = request_id
    return bytes(shadow_pb2.MirrorStreamRequest(sequence=sequence, request=msg).SerializeToString())


def _journaled(service: Service) -> list[str]:
    return [
        contract_pb2.MirrorRequest.FromString(r.payload).request_id
        for r in service.journal.read("scorer", 1000)
        if r.kind == RecordKind.MIRROR
    ]


def _refusals(service: Service, reason: str) -> float:
    labels = {"kind": "mirror", "reason": reason}
    value = service.metrics.registry.get_sample_value
    return value("understudy_grpc_stream_refusals_total", labels) or 0.0


def _refused(acks: list[Any]) -> list[tuple[int, int, str, str]]:
    return [(a.status, a.sequence, a.field, a.reason) for a in acks if a.status != ACCEPTED]


def test_a_repeated_sequence_has_its_own_status_and_the_stream_goes_on(
    service: Service,
    grpc_channel: grpc.Channel,
    auth: Metadata,
    requests_sample: list[MirrorRequest],
) -> None:
    sample = requests_sample[0]
    raws = [
        _envelope(sample, 5, "five"),
        _envelope(sample, 5, "five-again"),  # repeated
        _envelope(sample, 3, "three"),  # went back
        _envelope(sample, 6, "six"),  # the next valid one
    ]
    acks = _stream(grpc_channel, raws, auth)
    assert _refused(acks) == [
        (REPEATED, 5, "sequence", "repeated_sequence"),
        (REPEATED, 3, "sequence", "repeated_sequence"),
    ]
    # one number, one fate: 5 is never both accepted and REJECTED
    assert not any(a.status == REJECTED for a in acks)
    last = acks[-1]
    assert (last.status, last.sequence, last.accepted, last.rejected) == (ACCEPTED, 6, 2, 2)
    assert _journaled(service) == ["five", "six"]
    assert _refusals(service, "repeated_sequence") == 2


def test_every_rejected_ack_names_a_bounded_field_and_an_allowed_reason(
    service: Service,
    grpc_channel: grpc.Channel,
    auth: Metadata,
    requests_sample: list[MirrorRequest],
) -> None:
    sample = requests_sample[0]
    no_state = mirror_request_to_pb(sample)
    no_state.ClearField("state")
    bad_value = mirror_request_to_pb(sample)
    bad_value.state.cpu_free[0] = float("nan")
    future = mirror_request_to_pb(sample)
    future.schema_version = 99
    made_up = mirror_request_to_pb(sample)
    made_up.state.node_ids[0] = "x\x00y"  # a NUL in a string: invalid content

    def wrap(sequence: int, msg: contract_pb2.MirrorRequest) -> bytes:
        env = shadow_pb2.MirrorStreamRequest(sequence=sequence, request=msg)
        return bytes(env.SerializeToString())

    raws = [
        wrap(1, no_state),
        wrap(2, bad_value),
        b"\xff\xff not a protobuf",
        wrap(3, future),
        shadow_pb2.MirrorStreamRequest(sequence=4).SerializeToString(),  # no request
        wrap(5, made_up),
        _envelope(sample, 6, "valid"),
    ]
    acks = _stream(grpc_channel, raws, auth)
    refused = _refused(acks)
    assert [(status, seq, reason) for status, seq, _, reason in refused] == [
        (REJECTED, 1, "missing_field"),
        (REJECTED, 2, "invalid_value"),
        (REJECTED, 0, "malformed_message"),  # unreadable: no sequence of its own
        (REJECTED, 3, "unsupported_schema_version"),
        (REJECTED, 4, "missing_field"),
        (REJECTED, 5, "invalid_value"),
    ]
    fields = [field for _, _, field, _ in refused]
    assert fields[0] == "state" and fields[1] == "state.cpu_free[]"
    assert fields[2] == "message" and fields[3] == "schema_version" and fields[4] == "request"
    for _, _, field, reason in refused:
        assert field in KNOWN_FIELD_PATHS or field == "other", field
        assert reason in REASON_CODES, reason
    # the acks of accepted messages carry neither
    assert all(a.field == "" and a.reason == "" for a in acks if a.status == ACCEPTED)
    assert (acks[-1].sequence, acks[-1].accepted, acks[-1].rejected) == (6, 1, 6)
    assert _journaled(service) == ["valid"]
    assert _refusals(service, "missing_field") == 2
    assert _refusals(service, "invalid_value") == 2


def test_cumulative_accepted_acks_are_unchanged(
    service: Service,
    grpc_channel: grpc.Channel,
    auth: Metadata,
    requests_sample: list[MirrorRequest],
) -> None:
    """ACCEPTED n still means every message <= n was handled; refused ones were announced
    before the cumulative ack that covers them, and sequences only grow."""
    sample = requests_sample[0]
    raws = [_envelope(sample, i, f"m{i}") for i in range(1, 11)]
    bad = mirror_request_to_pb(sample)
    bad.state.cpu_free[0] = -1.0
    raws[4] = shadow_pb2.MirrorStreamRequest(sequence=5, request=bad).SerializeToString()
    acks = _stream(grpc_channel, raws, auth)
    cumulative = [a.sequence for a in acks if a.status == ACCEPTED]
    assert cumulative == sorted(set(cumulative)) and cumulative[-1] == 10
    first_covering_5 = next(
        i for i, a in enumerate(acks) if a.status == ACCEPTED and a.sequence >= 5
    )
    rejected_at = next(i for i, a in enumerate(acks) if a.status == REJECTED)
    assert rejected_at < first_covering_5
    assert (acks[-1].accepted, acks[-1].shed, acks[-1].rejected) == (9, 0, 1)
    assert _journaled(service) == [f"m{i}" for i in range(1, 11) if i != 5]


def test_a_request_id_resent_with_other_content_is_rejected_as_conflicting(
    service: Service,
    grpc_channel: grpc.Channel,
    auth: Metadata,
    requests_sample: list[MirrorRequest],
) -> None:
    """The identity refusal (a contract error naming `request_id`) flows through the
    stream's generic mapping: REJECTED, field request_id, reason conflicting_request."""
    raws = [
        _envelope(requests_sample[0], 1, "same-id"),
        _envelope(requests_sample[1], 2, "same-id"),  # other content under a known id
        _envelope(requests_sample[1], 3, "next"),
    ]
    acks = _stream(grpc_channel, raws, auth)
    assert _refused(acks) == [(REJECTED, 2, "request_id", "conflicting_request")]
    assert (acks[-1].sequence, acks[-1].accepted, acks[-1].rejected) == (3, 2, 1)
    assert _journaled(service) == ["same-id", "next"]
    assert _refusals(service, "conflicting_request") == 1


def test_an_oversized_message_is_refused_under_its_own_sequence(
    make_service: Callable[..., Service],
    auth: Metadata,
    requests_sample: list[MirrorRequest],
) -> None:
    """Too large to parse, but numbered: the ack gives its leading sequence, not 0."""
    service = make_service(scoring_enabled=False, max_request_bytes=16_384)
    sample = requests_sample[0]
    big = mirror_request_to_pb(sample)
    big.state.cpu_free.extend([1.0] * 8192)
    small = _envelope(sample, 1, "small")
    assert len(small) < 16_384, "the sample must fit the limit"
    raws = [
        small,
        shadow_pb2.MirrorStreamRequest(sequence=2, request=big).SerializeToString(),
        _envelope(sample, 3, "after"),
    ]
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        acks = _stream(channel, raws, auth)
    assert _refused(acks) == [(REJECTED, 2, "message", "payload_too_large")]
    assert (acks[-1].sequence, acks[-1].accepted, acks[-1].rejected) == (3, 2, 1)
    assert _refusals(service, "payload_too_large") == 1
