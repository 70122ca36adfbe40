"""Hypothesis-generated hostile protobuf on all four RPCs of a real gRPC server.

Unary calls may only end OK, INVALID_ARGUMENT or ALREADY_EXISTS (a mutated
request that keeps a known request_id with other content: docs/ingest.md,
"Identity"; never INTERNAL or UNKNOWN), and each one is counted exactly: OK
adds one to accepted/shed and at most one journal record (none for a re-sent
request), a refusal one rejection naming its field and no record. Streams must end OK with
one ack verdict per message sent, matched by the metrics and the journal. After
every run the server still accepts a valid request. See `pb_strategies` for
what is generated.
"""

from __future__ import annotations

import re
import time
from collections import Counter

import grpc
import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.contract import MirrorRequest
from service.server.app import Service
from service.transport.grpc.servicer import SERVICE_NAME
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import contract_pb2, shadow_pb2
from tests.hostile.metrics_read import counter_sum, ingested, refusals
from tests.hostile.pb_strategies import Drawn, hostile_bytes

Metadata = tuple[tuple[str, str], ...]
OK, INVALID = grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT
TAKEN_ID = grpc.StatusCode.ALREADY_EXISTS  # a known request_id with other content
NAMES_A_FIELD = re.compile(r"`[^`]+`")

UNARY = {
    "Mirror": (contract_pb2.MirrorRequest, shadow_pb2.MirrorAck),
    "ReportOutcome": (contract_pb2.Outcome, shadow_pb2.OutcomeAck),
}
STREAM = {
    "MirrorStream": (shadow_pb2.MirrorStreamRequest, "request"),
    "ReportOutcomeStream": (shadow_pb2.OutcomeStreamRequest, "outcome"),
}


def _identity(raw: bytes) -> bytes:
    return raw


def fuzz_settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )


def valid_mirrors(requests: list[MirrorRequest]) -> list[contract_pb2.MirrorRequest]:
    """Valid protobuf requests (a few: the strategies pick among them)."""
    return [mirror_request_to_pb(r) for r in requests[:5]]


def valid_outcomes(requests: list[MirrorRequest]) -> list[contract_pb2.Outcome]:
    """Valid outcome reports for the sample requests."""
    return [
        contract_pb2.Outcome(
            request_id=r.request_id,
            observed_at=r.request_time + 600,
            queue_delay_s=3.0,
            slo_met=True,
            failure=contract_pb2.FAILURE_KIND_NONE,
        )
        for r in requests[:5]
    ]


def _valids(method: str, requests: list[MirrorRequest]) -> list[Message]:
    if method in ("Mirror", "MirrorStream"):
        return list(valid_mirrors(requests))
    return list(valid_outcomes(requests))


def fuzz_unary(
    service: Service,
    channel: grpc.Channel,
    metadata: Metadata,
    method: str,
    valids: list[Message],
    max_examples: int,
) -> Counter[tuple[str, str]]:
    """Send hostile messages one call each; check each call's code and counts."""
    request_type, ack_type = UNARY[method]
    call = channel.unary_unary(
        f"/{SERVICE_NAME}/{method}",
        request_serializer=_identity,
        response_deserializer=ack_type.FromString,
    )
    seen: Counter[tuple[str, str]] = Counter()

    @fuzz_settings(max_examples)
    @given(drawn=hostile_bytes(request_type.DESCRIPTOR, valids))
    def run(drawn: Drawn) -> None:
        label, raw = drawn
        refused, acked, head = refusals(service, "grpc"), ingested(service, "grpc"), _head(service)
        code, details = _unary(call, raw, metadata)
        seen[(label, code.name)] += 1
        assert code in (OK, INVALID, TAKEN_ID), (label, code, details, raw[:200])
        if code is OK:
            assert (ingested(service, "grpc") - acked, refusals(service, "grpc") - refused) == (
                1,
                0,
            )
            assert _head(service) - head <= 1  # shed appends nothing
        else:
            assert NAMES_A_FIELD.search(details), details
            assert (ingested(service, "grpc") - acked, refusals(service, "grpc") - refused) == (
                0,
                1,
            )
            assert _head(service) == head

    run()
    return seen


def _resent(service: Service) -> float:
    """Stream messages acked as duplicates of a journaled request (not journaled again)."""
    return counter_sum(service, "understudy_ingest_duplicates_total", transport="grpc_stream")


def _unary(
    call: grpc.UnaryUnaryMultiCallable, raw: bytes, metadata: Metadata
) -> tuple[grpc.StatusCode, str]:
    try:
        call(raw, metadata=metadata, timeout=10)
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return OK, ""


def _head(service: Service) -> int:
    return int(service.journal.head_seq)


def fuzz_stream(
    service: Service,
    channel: grpc.Channel,
    metadata: Metadata,
    method: str,
    valids: list[Message],
    max_examples: int,
) -> Counter[str]:
    """Send lists of hostile and valid messages on one stream per example."""
    envelope_type, inner = STREAM[method]
    call = channel.stream_stream(
        f"/{SERVICE_NAME}/{method}",
        request_serializer=_identity,
        response_deserializer=shadow_pb2.StreamAck.FromString,
    )
    templates = [envelope_type(sequence=i + 1, **{inner: v}) for i, v in enumerate(valids)]
    fresh = iter(range(10**9))

    def valid_envelope(sequence: int) -> bytes:
        message = type(valids[0])()
        message.CopyFrom(valids[sequence % len(valids)])
        message.request_id = f"fuzz-{next(fresh)}"
        return bytes(envelope_type(sequence=sequence, **{inner: message}).SerializeToString())

    item = st.one_of(st.just(("valid", b"")), hostile_bytes(envelope_type.DESCRIPTOR, templates))
    seen: Counter[str] = Counter()

    @fuzz_settings(max_examples)
    @given(items=st.lists(item, min_size=1, max_size=8))
    def run(items: list[Drawn]) -> None:
        raws: list[bytes] = []
        for label, raw in items:
            seen[label] += 1
            raws.append(valid_envelope(len(raws) + 1) if label == "valid" else raw)
        refused, acked, head, resent = (
            refusals(service, "grpc_stream"),
            ingested(service, "grpc_stream"),
            _head(service),
            _resent(service),
        )
        acks = list(call(iter(raws), metadata=metadata, timeout=20))
        accepted = max((a.accepted for a in acks), default=0)
        shed = max((a.shed for a in acks), default=0)
        rejected = max((a.rejected for a in acks), default=0)
        assert accepted + shed + rejected == len(raws), (acks, items)
        assert refusals(service, "grpc_stream") - refused == rejected, (acks, items)
        assert ingested(service, "grpc_stream") - acked == accepted + shed, (acks, items)
        # a re-sent request (a known id, the same content) is acked but not journaled again
        assert _head(service) - head == accepted - (_resent(service) - resent), (acks, items)
        assert sum(a.status != shadow_pb2.ACK_STATUS_ACCEPTED for a in acks) == shed + rejected

    run()
    return seen


def assert_still_serves(
    service: Service, channel: grpc.Channel, metadata: Metadata, valid: contract_pb2.MirrorRequest
) -> None:
    """A valid request after the fuzzing is accepted."""
    call = channel.unary_unary(
        f"/{SERVICE_NAME}/Mirror",
        request_serializer=_identity,
        response_deserializer=shadow_pb2.MirrorAck.FromString,
    )
    message = contract_pb2.MirrorRequest()
    message.CopyFrom(valid)
    message.request_id = "after-the-fuzz"
    ack = call(message.SerializeToString(), metadata=metadata, timeout=10)
    assert ack.status == shadow_pb2.ACK_STATUS_ACCEPTED
    assert ack.request_id == "after-the-fuzz"


def _run_all(
    service: Service,
    channel: grpc.Channel,
    metadata: Metadata,
    requests: list[MirrorRequest],
    unary_examples: int,
    stream_examples: int,
) -> None:
    started = time.perf_counter()
    report: list[str] = []
    for method in UNARY:
        seen = fuzz_unary(
            service, channel, metadata, method, _valids(method, requests), unary_examples
        )
        report.append(
            f"{method}: " + ", ".join(f"{k[0]} {k[1]} {n}" for k, n in sorted(seen.items()))
        )
    for method in STREAM:
        kinds = fuzz_stream(
            service, channel, metadata, method, _valids(method, requests), stream_examples
        )
        report.append(f"{method}: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    assert_still_serves(service, channel, metadata, valid_mirrors(requests)[0])
    print(f"\ngRPC fuzz in {time.perf_counter() - started:.1f} s\n" + "\n".join(report))


def test_grpc_fuzz_smoke(
    service: Service,
    grpc_channel: grpc.Channel,
    auth: Metadata,
    requests_sample: list[MirrorRequest],
) -> None:
    _run_all(service, grpc_channel, auth, requests_sample, unary_examples=40, stream_examples=10)


@pytest.mark.slow
def test_grpc_fuzz_all_rpcs(
    service: Service,
    grpc_channel: grpc.Channel,
    auth: Metadata,
    requests_sample: list[MirrorRequest],
) -> None:
    _run_all(service, grpc_channel, auth, requests_sample, unary_examples=600, stream_examples=120)


def test_hostile_bytes_without_credentials_are_unauthenticated_and_counted(
    service: Service, grpc_channel: grpc.Channel, requests_sample: list[MirrorRequest]
) -> None:
    call = grpc_channel.unary_unary(
        f"/{SERVICE_NAME}/Mirror",
        request_serializer=_identity,
        response_deserializer=shadow_pb2.MirrorAck.FromString,
    )
    before = refusals(service, "grpc")
    sent = 0

    @fuzz_settings(10)
    @given(
        drawn=hostile_bytes(contract_pb2.MirrorRequest.DESCRIPTOR, valid_mirrors(requests_sample))
    )
    def run(drawn: Drawn) -> None:
        nonlocal sent
        code, _ = _unary(call, drawn[1], (("authorization", "Bearer wrong"),))
        sent += 1
        assert code is grpc.StatusCode.UNAUTHENTICATED

    run()
    assert refusals(service, "grpc") - before == sent
    assert _head(service) == 0
