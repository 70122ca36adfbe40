"""Extreme sizes on gRPC: empty messages, huge repeated fields, the size limits.

Within the limit, a huge message is parsed and refused (or accepted) on its
content, counted like any other; over the limit (up to gRPC's own receive cap,
4x ours) it is INVALID_ARGUMENT naming the limit, counted; beyond the cap gRPC
itself answers RESOURCE_EXHAUSTED (documented in docs/ingest.md). The server
serves a valid request after each.
"""

from __future__ import annotations

import time

import grpc
import pytest

from service.contract import MirrorRequest
from service.server.app import Service
from service.transport.grpc.servicer import SERVICE_NAME
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import contract_pb2, shadow_pb2
from tests.hostile.metrics_read import counter_sum, refusals
from tests.hostile.test_grpc_fuzz import Metadata, assert_still_serves

MiB = 1024 * 1024


def _call(channel: grpc.Channel, method: str, raw: bytes, metadata: Metadata) -> tuple[str, str]:
    call = channel.unary_unary(
        f"/{SERVICE_NAME}/{method}",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    try:
        call(raw, metadata=metadata, timeout=30)
    except grpc.RpcError as err:
        return err.code().name, err.details() or ""
    return "OK", ""


def _big_cpu_column(request: MirrorRequest, n: int) -> bytes:
    msg = mirror_request_to_pb(request)
    msg.state.cpu_free.extend([1.0] * n)  # packed float: 4 bytes each
    return bytes(msg.SerializeToString())


def _many_nodes(request: MirrorRequest, n: int) -> bytes:
    """A valid request with `n` nodes (the first node's columns repeated)."""
    msg = mirror_request_to_pb(request)
    s = msg.state
    columns = [
        "node_hardware", "accelerators_free", "accelerators_total", "cpu_free", "cpu_total",
        "memory_free_gb", "memory_total_gb", "utilisation", "queue_length", "healthy",
        "draining", "zone", "locality",
    ]  # fmt: skip
    firsts = {name: getattr(s, name)[0] for name in columns}
    for name in [*columns, "node_ids", "label_offsets", "labels"]:
        del getattr(s, name)[:]
    s.node_ids.extend(f"node-{i:06d}" for i in range(n))
    for name, value in firsts.items():
        getattr(s, name).extend([value] * n)
    return bytes(msg.SerializeToString())


@pytest.mark.parametrize("method", ["Mirror", "ReportOutcome"])
def test_empty_unary_message_is_invalid_argument_and_counted(
    service: Service, grpc_channel: grpc.Channel, auth: Metadata, method: str
) -> None:
    code, details = _call(grpc_channel, method, b"", auth)
    assert code == "INVALID_ARGUMENT" and "`" in details
    assert refusals(service, "grpc") == 1


@pytest.mark.parametrize("method", ["MirrorStream", "ReportOutcomeStream"])
def test_empty_stream_messages_are_rejected_and_counted(
    service: Service, grpc_channel: grpc.Channel, auth: Metadata, method: str
) -> None:
    call = grpc_channel.stream_stream(
        f"/{SERVICE_NAME}/{method}",
        request_serializer=lambda b: b,
        response_deserializer=shadow_pb2.StreamAck.FromString,
    )
    acks = list(call(iter([b"", b""]), metadata=auth, timeout=10))
    refused = [
        (a.status, a.sequence, a.field, a.reason)
        for a in acks
        if a.status != shadow_pb2.ACK_STATUS_ACCEPTED
    ]
    # an empty message has no sequence (proto3's 0): refused under 0, naming it
    missing = (shadow_pb2.ACK_STATUS_REJECTED, 0, "sequence", "missing_field")
    assert refused == [missing, missing]
    assert acks[-1].rejected == 2
    assert refusals(service, "grpc_stream") == 2


def test_huge_messages_within_and_over_the_limit(
    service: Service,
    grpc_channel: grpc.Channel,
    auth: Metadata,
    requests_sample: list[MirrorRequest],
) -> None:
    limit = service.settings.max_request_bytes
    valid_nodes = 50_000
    request = requests_sample[0]
    invalid, exhausted = "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"
    cases = [
        # (what, bytes, expected code, expected text in the details)
        ("valid, 50k nodes", _many_nodes(request, valid_nodes), "OK", ""),
        ("0.9M floats", _big_cpu_column(request, 900_000), invalid, "`state.cpu_free`"),
        ("just over the limit", _big_cpu_column(request, limit // 4), invalid, "limit"),
        ("3x the limit", _big_cpu_column(request, 3 * limit // 4), invalid, "limit"),
        ("over gRPC's own cap", _big_cpu_column(request, limit + 1024), exhausted, ""),
    ]
    report = []
    for what, raw, expected, named in cases:
        refused = refusals(service, "grpc")
        started = time.perf_counter()
        code, details = _call(grpc_channel, "Mirror", raw, auth)
        report.append(
            f"{what} ({len(raw) / MiB:.1f} MiB): {code} in {time.perf_counter() - started:.2f} s"
        )
        assert code == expected, (what, details)
        assert named in details, (what, details)
        counted = 1 if code == "INVALID_ARGUMENT" else 0
        assert refusals(service, "grpc") - refused == counted, what
        assert_still_serves(service, grpc_channel, auth, mirror_request_to_pb(requests_sample[1]))
    print("\n" + "\n".join(report))
    assert len(cases[0][1]) < limit
    accepted = counter_sum(service, "understudy_ingest_total", transport="grpc", result="accepted")
    assert accepted == 1 + len(cases)  # the big valid one and one check after each case


def test_a_huge_stream_message_is_rejected_and_the_stream_goes_on(
    service: Service,
    grpc_channel: grpc.Channel,
    auth: Metadata,
    requests_sample: list[MirrorRequest],
) -> None:
    limit = service.settings.max_request_bytes
    big = contract_pb2.MirrorRequest()
    big.ParseFromString(_big_cpu_column(requests_sample[0], limit // 4 + 64))
    sent = [
        shadow_pb2.MirrorStreamRequest(
            sequence=1, request=mirror_request_to_pb(requests_sample[0])
        ),
        shadow_pb2.MirrorStreamRequest(sequence=2, request=big),
        shadow_pb2.MirrorStreamRequest(
            sequence=3, request=mirror_request_to_pb(requests_sample[1])
        ),
    ]
    call = grpc_channel.stream_stream(
        f"/{SERVICE_NAME}/MirrorStream",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=shadow_pb2.StreamAck.FromString,
    )
    acks = list(call(iter(sent), metadata=auth, timeout=30))
    assert [(a.status, a.sequence) for a in acks if a.status != shadow_pb2.ACK_STATUS_ACCEPTED] == [
        (shadow_pb2.ACK_STATUS_REJECTED, 2)
    ]
    assert (acks[-1].accepted, acks[-1].rejected) == (2, 1)
    assert refusals(service, "grpc_stream") == 1
