"""The client mirrors in batches against real gRPC servers: every request acked, bad ones
named by index, unacked batches resent after a broken stream and acked ones never.

The first test runs against the service itself (its `MirrorManyStream`); the
resend test against a real gRPC server implementing the real batch stream that
breaks its first stream on purpose. The linger is set beyond any test's length
(`NEVER`) so batches are cut by count alone and their composition is known;
waits are on conditions, bounded by hang guards.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest

from service.client import MirrorClient
from service.contract import MirrorRequest, Outcome
from service.contract.validation import RequestLimits
from service.pipeline.journal_format import RecordKind
from service.server.app import Service
from service.wire.batch_codec import batch_from_pb
from service.wire.convert import mirror_request_to_pb, outcome_to_pb
from service.wire.understudy.v1 import shadow_pb2
from tests.client.journaled import journal_kinds, journaled_requests
from tests.hostile.metrics_read import counter_sum

pytestmark = pytest.mark.live  # waits on a real service

HANG_S = 60.0
NEVER = 3600.0


def test_requests_mirrored_in_batches_are_all_acked_and_bad_ones_named_by_index(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = make_service(scoring_enabled=False)
    n, per_batch, bad = 300, 100, {3: "b-3", 150: "b-150", 299: "b-299"}
    client = MirrorClient(
        f"127.0.0.1:{service.grpc_port}",
        runtime_token,
        max_batch_requests=per_batch,
        linger_s=NEVER,
    )
    caplog.set_level(logging.WARNING, logger="service.client.mirror_client")
    try:
        for i in range(n):
            # contract objects sharing one ClusterState per sample (a scheduling cycle's
            # snapshot), and protobuf messages for the bad ones: both kinds share a batch
            request = dataclasses.replace(requests_sample[i % 30], request_id=f"r-{i}")
            if i in bad:
                msg = mirror_request_to_pb(request)
                msg.request_id = bad[i]
                msg.state.cpu_free[0] = float("nan")
                assert client.mirror(msg)
            else:
                assert client.mirror_request(request)
        assert client.flush(HANG_S), client.stats()
        stats = client.close()
    finally:
        client.close(0.1)
    m, batches = stats.mirrors, stats.mirror_batches
    assert (m.offered, m.accepted, m.shed, m.rejected, m.dropped) == (n, n - 3, 0, 3, 0)
    assert m.accepted + m.shed + m.rejected == n and m.protocol_errors == 0
    assert m.rejected_by_reason == {"invalid_value": 3}
    assert (batches.batches_sent, batches.max_requests, batches.cut_by) == (
        3,
        per_batch,
        {"requests": 3},
    )
    logged = [r.getMessage() for r in caplog.records]
    for i, rid in bad.items():
        line = rf"MirrorManyStream: batch \d+ request {i % per_batch} \({rid}\) REJECTED: "
        assert any(re.search(line + r"field state\.cpu_free", m) for m in logged), (rid, logged)
    journaled = [r.request_id for r in journaled_requests(service)]
    assert sorted(journaled) == sorted(f"r-{i}" for i in range(n) if i not in bad)
    assert journal_kinds(service).count(RecordKind.MIRROR_BATCH) == 3, "one record per batch"
    assert counter_sum(service, "understudy_ingest_total", kind="mirror") == n


class BreakingBatchServer:
    """A real `MirrorManyStream` endpoint: its first stream acks batch 1, reads two more
    batches and breaks without acking them; later streams ack every batch."""

    def __init__(self) -> None:
        self.streams: list[list[list[str]]] = []  # request ids per batch, per stream
        self.broke = threading.Event()

        def stream(
            requests: Iterator[bytes], context: grpc.ServicerContext
        ) -> Iterator[shadow_pb2.BatchStreamAck]:
            seen: list[list[str]] = []
            self.streams.append(seen)
            first = len(self.streams) == 1
            for raw in requests:
                env = shadow_pb2.MirrorBatchStreamRequest.FromString(raw)
                batch = batch_from_pb(env.batch, RequestLimits())
                seen.append([batch.request_id[i] for i in range(batch.n_requests)])
                if first and len(seen) == 3:
                    self.broke.set()
                    context.abort(grpc.StatusCode.UNAVAILABLE, "broken on purpose")
                if first and len(seen) > 1:
                    continue  # batches 2 and 3 of the first stream are never acked
                ack = shadow_pb2.BatchAck(
                    status=shadow_pb2.ACK_STATUS_ACCEPTED,
                    sequence=env.sequence,
                    accepted=batch.n_requests,
                )
                yield shadow_pb2.BatchStreamAck(ack=ack)

        handler = grpc.stream_stream_rpc_method_handler(
            stream, response_serializer=lambda m: m.SerializeToString()
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "understudy.v1.ShadowEvaluation", {"MirrorManyStream": handler}
                ),
            )
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()


def test_after_a_broken_stream_unacked_batches_are_resent_and_acked_ones_are_not(
    requests_sample: list[MirrorRequest],
) -> None:
    server = BreakingBatchServer()
    client = MirrorClient(
        f"127.0.0.1:{server.port}",
        "tok",
        max_batch_requests=2,
        linger_s=NEVER,
        backoff_initial_s=0.01,
    )
    try:
        for i in range(6):
            assert client.mirror_request(
                dataclasses.replace(requests_sample[i], request_id=f"r-{i}")
            )
        assert server.broke.wait(HANG_S)
        assert client.flush(HANG_S), client.stats()
        stats = client.close()
    finally:
        client.close(0.1)
        server.server.stop(0)
    first, *later = server.streams
    assert first == [["r-0", "r-1"], ["r-2", "r-3"], ["r-4", "r-5"]]
    resent = [ids for stream in later for ids in stream]
    assert resent == [["r-2", "r-3"], ["r-4", "r-5"]], "unacked batches again, whole, in order"
    m = stats.mirrors
    assert (m.accepted, m.dropped, m.resent, m.in_flight) == (6, 0, 4, 0)
    assert stats.mirror_batches.batches_resent == 2 and stats.reconnects >= 1


def test_outcomes_go_in_batches_and_batching_false_keeps_the_single_streams(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    service = make_service(scoring_enabled=False)
    target = f"127.0.0.1:{service.grpc_port}"
    batched = MirrorClient(target, runtime_token, max_batch_requests=4, linger_s=NEVER)
    single = MirrorClient(target, runtime_token, batching=False)
    try:
        for i in range(8):
            assert batched.report(Outcome(request_id=f"o-{i}", observed_at=1.0 + i))
        assert single.mirror(mirror_request_to_pb(requests_sample[0]))
        assert single.report_outcome(outcome_to_pb(Outcome(request_id="o-s", observed_at=2.0)))
        assert batched.flush(HANG_S) and single.flush(HANG_S)
        b, s = batched.close(), single.close()
    finally:
        batched.close(0.1)
        single.close(0.1)
    assert (b.outcomes.accepted, b.outcome_batches.batches_sent) == (8, 2)
    assert (s.mirrors.accepted, s.outcomes.accepted, s.mirror_batches.batches_sent) == (1, 1, 0)
    kinds = journal_kinds(service)
    assert kinds.count(RecordKind.OUTCOME_BATCH) == 2
    assert (kinds.count(RecordKind.MIRROR), kinds.count(RecordKind.OUTCOME)) == (1, 1)
