"""Every acked request is in the journal, exactly once, in order per stream."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import httpx

from service.contract import MirrorRequest
from service.pipeline.journal_format import RecordKind
from service.server.app import Service
from service.transport.http.convert import mirror_to_json
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import contract_pb2, shadow_pb2, shadow_pb2_grpc


def _journaled_ids(service: Service) -> list[str]:
    ids = []
    for record in service.journal.read("scorer", 100_000):
        if record.kind == RecordKind.MIRROR:
            ids.append(contract_pb2.MirrorRequest.FromString(record.payload).request_id)
    return ids


def _renamed(requests: list[MirrorRequest], prefix: str) -> list[contract_pb2.MirrorRequest]:
    out = []
    for i, request in enumerate(requests):
        msg = mirror_request_to_pb(request)
        msg.request_id = f"{prefix}-{i}"
        out.append(msg)
    return out


def test_all_three_paths_journal_exactly_what_was_acked(
    service: Service,
    stub: shadow_pb2_grpc.ShadowEvaluationStub,
    http: httpx.Client,
    auth: tuple[tuple[str, str], ...],
    requests_sample: list[MirrorRequest],
) -> None:
    unary = _renamed(requests_sample, "unary")
    streamed = _renamed(requests_sample, "stream")
    for msg in unary:
        ack = stub.Mirror(msg, metadata=auth)
        assert ack.status == shadow_pb2.ACK_STATUS_ACCEPTED
        assert ack.request_id == msg.request_id
    envelopes = (
        shadow_pb2.MirrorStreamRequest(sequence=i + 1, request=m) for i, m in enumerate(streamed)
    )
    acks = list(stub.MirrorStream(envelopes, metadata=auth))
    assert acks[-1].status == shadow_pb2.ACK_STATUS_ACCEPTED
    assert acks[-1].sequence == len(streamed)
    assert acks[-1].accepted == len(streamed)
    assert [a.sequence for a in acks] == sorted(a.sequence for a in acks)
    for i, request in enumerate(requests_sample):
        body = mirror_to_json(request).replace(request.request_id.encode(), f"http-{i}".encode())
        response = http.post("/v1/mirror", content=body)
        assert response.status_code == 202, response.text
        assert response.json() == {"status": "accepted", "request_id": f"http-{i}"}

    ids = _journaled_ids(service)
    n = len(requests_sample)
    assert len(ids) == 3 * n
    for prefix in ("unary", "stream", "http"):
        assert [i for i in ids if i.startswith(prefix)] == [f"{prefix}-{k}" for k in range(n)]
    journaled = contract_pb2.MirrorRequest.FromString(service.journal.read("scorer", 1)[0].payload)
    assert journaled == unary[0], "the journal must hold the request as sent"


def test_stream_acks_are_cumulative_and_prompt(
    stub: shadow_pb2_grpc.ShadowEvaluationStub,
    auth: tuple[tuple[str, str], ...],
    requests_sample: list[MirrorRequest],
) -> None:
    """An ack arrives while the stream is still open, before the client finishes."""
    import queue

    outbox: queue.Queue[shadow_pb2.MirrorStreamRequest | None] = queue.Queue()

    def envelopes() -> object:
        while (item := outbox.get()) is not None:
            yield item

    msg = mirror_request_to_pb(requests_sample[0])
    responses = stub.MirrorStream(envelopes(), metadata=auth, timeout=60)  # a hang guard
    outbox.put(shadow_pb2.MirrorStreamRequest(sequence=1, request=msg))
    first = next(responses)
    assert (first.status, first.sequence, first.accepted) == (shadow_pb2.ACK_STATUS_ACCEPTED, 1, 1)
    outbox.put(shadow_pb2.MirrorStreamRequest(sequence=2, request=msg))
    outbox.put(shadow_pb2.MirrorStreamRequest(sequence=2, request=msg))  # not increasing
    outbox.put(None)
    rest = list(responses)
    assert any(a.status == shadow_pb2.ACK_STATUS_REPEATED_SEQUENCE for a in rest)
    assert rest[-1].accepted == 2 and rest[-1].rejected == 1


def test_full_journal_sheds_and_every_message_is_accounted_for(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    service = make_service(
        journal_max_bytes=40_000, journal_segment_bytes=8192, scoring_enabled=False
    )
    auth = (("authorization", f"Bearer {runtime_token}"),)
    sent = accepted = shed = rejected = 0
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = shadow_pb2_grpc.ShadowEvaluationStub(channel)  # type: ignore[no-untyped-call]
        for i, msg in enumerate(_renamed(requests_sample, "full")):
            if i % 5 == 4:
                msg.state.cpu_free[0] = float("nan")
            sent += 1
            try:
                ack = stub.Mirror(msg, metadata=auth)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
                rejected += 1
                continue
            if ack.status == shadow_pb2.ACK_STATUS_ACCEPTED:
                accepted += 1
            else:
                assert ack.status == shadow_pb2.ACK_STATUS_SHED
                shed += 1
    assert shed > 0, "the bound was never reached; make the journal smaller"
    assert accepted + shed + rejected == sent
    value = service.metrics.registry.get_sample_value

    def metric(result: str) -> float:
        labels = {"transport": "grpc", "kind": "mirror", "result": result}
        return value("understudy_ingest_total", labels) or 0.0

    assert (metric("accepted"), metric("shed"), metric("rejected")) == (accepted, shed, rejected)
    assert len(_journaled_ids(service)) == accepted
    assert service.journal.depth_bytes <= 40_000


def test_stream_survives_the_largest_sequence_then_garbage(
    service: Service,
    grpc_channel: grpc.Channel,
    auth: tuple[tuple[str, str], ...],
    requests_sample: list[MirrorRequest],
) -> None:
    """Regression (stream fuzzer): an unreadable message after sequence 2**64 - 1 used to
    overflow the ack's uint64 and kill the stream's reader, losing the rest."""
    msg = mirror_request_to_pb(requests_sample[0])
    last = shadow_pb2.MirrorStreamRequest(sequence=2**64 - 1, request=msg).SerializeToString()
    call = grpc_channel.stream_stream(
        "/understudy.v1.ShadowEvaluation/MirrorStream",
        request_serializer=lambda b: b,
        response_deserializer=shadow_pb2.StreamAck.FromString,
    )
    acks = list(call(iter([last, b"\xff\xff garbage", b"\x08"]), metadata=auth, timeout=20))
    assert max(a.accepted for a in acks) == 1
    assert max(a.rejected for a in acks) == 2
    assert sum(a.status == shadow_pb2.ACK_STATUS_REJECTED for a in acks) == 2
