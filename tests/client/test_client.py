"""The mirroring client under faults: never blocks, never raises, loses nothing it got acked.

Real servers on loopback: the service in this process, `understudy serve` in a
child process for the kill/restart case, and a deliberately slow ShadowEvaluation
server (a real gRPC server implementing the real stream, slowed down) for the
overload case.
"""

from __future__ import annotations

import ast
import socket
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

import service.client
from service.client import MirrorClient
from service.contract import MirrorRequest
from service.contract.validation import RequestLimits
from service.server.app import Service
from service.wire.batch_codec import batch_from_pb
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import contract_pb2, shadow_pb2
from tests.client.journaled import journaled_requests

pytestmark = pytest.mark.live  # waits on a real service: run under load by make test-busy

ALLOWED_ROOTS = {
    "grpc",
    "google",
    "__future__",
    "logging",
    "random",
    "threading",
    "time",
    "collections",
    "dataclasses",
    "typing",
    "service",
}


# What the client may reach inside Understudy: itself, the generated messages, and the
# core that the batch form needs (the contract and its wire converters and codec, which
# import numpy). Never the server, ingest, storage, policies or the transports.
CLIENT_MAY_IMPORT = (
    "service.client",
    "service.wire.understudy",
    "service.wire.convert",
    "service.wire.batch_codec",
    "service.contract",
)


def test_client_imports_only_grpc_protobuf_generated_code_and_the_contract() -> None:
    root = Path(service.client.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] in ALLOWED_ROOTS, f"{path.name} imports {name}"
                if name.startswith("service."):
                    assert name.startswith(CLIENT_MAY_IMPORT), name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def messages(requests: list[MirrorRequest], n: int, tag: str) -> list[contract_pb2.MirrorRequest]:
    out = []
    for i in range(n):
        msg = mirror_request_to_pb(requests[i % len(requests)])
        msg.request_id = f"{tag}-{i}"
        out.append(msg)
    return out


def timed_calls(
    fn: Callable[[contract_pb2.MirrorRequest], object], items: list[contract_pb2.MirrorRequest]
) -> list[float]:
    times = []
    for item in items:
        start = time.perf_counter()
        fn(item)
        times.append(time.perf_counter() - start)
    return times


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def journal_ids(service: Service) -> set[str]:
    return {r.request_id for r in journaled_requests(service)}


def test_server_absent_at_start(
    make_service: Callable[..., Service], runtime_token: str, requests_sample: list[MirrorRequest]
) -> None:
    port = free_port()
    items = messages(requests_sample, 300, "absent")
    client = MirrorClient(f"127.0.0.1:{port}", runtime_token, backoff_max_s=0.2)
    try:
        noop = timed_calls(lambda m: None, items)
        calls = timed_calls(client.mirror, items)
        print(
            f"\n[client] server absent: mirror() p99 {p99(calls) * 1e6:.1f} us, "
            f"no-op p99 {p99(noop) * 1e6:.2f} us"
        )
        # Not a speed bound: a client that waited for even one 0.2 s connection backoff per
        # call would need 60 s; only a 30 s stall of this machine could blur the two.
        assert sum(calls) < len(items) * 0.2 / 2, "mirror() must not wait for the network"
        assert client.stats().reconnects >= 0
        service = make_service(grpc_port=port, scoring_enabled=False)
        assert client.flush(30)
        stats = client.close()
    finally:
        client.close(0.1)
    m = stats.mirrors
    assert m.offered == 300 and m.delivered + m.dropped == m.offered and m.dropped == 0
    assert journal_ids(service) == {i.request_id for i in items}


class SlowServer:
    """A real ShadowEvaluation batch stream endpoint that handles `rate` requests per second."""

    def __init__(self, rate: float) -> None:
        self.received: list[str] = []
        delay = 1.0 / rate

        def stream(
            requests: Iterator[bytes], context: grpc.ServicerContext
        ) -> Iterator[shadow_pb2.BatchStreamAck]:
            for raw in requests:
                env = shadow_pb2.MirrorBatchStreamRequest.FromString(raw)
                batch = batch_from_pb(env.batch, RequestLimits())
                time.sleep(delay * batch.n_requests)
                self.received += [batch.request_id[i] for i in range(batch.n_requests)]
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


def test_server_slower_than_offered_rate(requests_sample: list[MirrorRequest]) -> None:
    slow = SlowServer(rate=400)
    items = messages(requests_sample, 3000, "slow")
    client = MirrorClient(f"127.0.0.1:{slow.port}", "tok", buffer_size=200)
    try:
        noop = timed_calls(lambda m: None, items[:500])
        calls = []
        for item in items:  # offered at ~5,000/s, ten times what the server takes
            start = time.perf_counter()
            client.mirror(item)
            calls.append(time.perf_counter() - start)
            time.sleep(0.0002)
        print(
            f"\n[client] slow server: mirror() p99 {p99(calls) * 1e6:.1f} us "
            f"vs no-op {p99(noop) * 1e6:.2f} us"
        )
        # A client that waited for the server would need (3000 - 200) / 400 = 7 s of calls;
        # half of that tells the two apart on any machine.
        assert sum(calls) < (len(items) - 200) / 400 / 2, "mirror() waited for the server"
        stats = client.close(timeout=5)
    finally:
        slow.server.stop(0)
    m = stats.mirrors
    print(f"[client] offered {m.offered}, delivered {m.delivered}, dropped {m.dropped}")
    assert m.dropped > 0, "the buffer never filled: the test did not overload the server"
    assert m.delivered + m.dropped == m.offered == len(items)
    assert sorted(set(slow.received)) == sorted(slow.received), (
        "a resend must not reach the server twice here"
    )


@pytest.mark.slow
def test_server_killed_and_restarted_mid_stream(
    tmp_path: Path,
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    db_url: str,
) -> None:
    from tests.transport.test_crash_recovery import ServerProcess

    port = free_port()
    data = tmp_path / "data"
    first = ServerProcess(data, runtime_token, db_url, grpc_port=port)
    items = messages(requests_sample, 1500, "kill")
    client = MirrorClient(f"127.0.0.1:{port}", runtime_token, backoff_max_s=0.3)
    servers = [first]
    try:
        calls: list[float] = []
        for i, item in enumerate(items):
            start = time.perf_counter()
            client.mirror(item)
            calls.append(time.perf_counter() - start)
            if i == 500:
                first.kill()
            if i == 900:
                servers.append(ServerProcess(data, runtime_token, db_url, grpc_port=port))
            time.sleep(0.001)
        print(
            f"\n[client] kill/restart: mirror() p99 {p99(calls) * 1e6:.1f} us, "
            f"max {max(calls) * 1e3:.2f} ms"
        )
        # The server is gone for 400 calls: waiting out one 0.3 s backoff each would take
        # 120 s; half of that tells the two apart on any machine.
        assert sum(calls) < 400 * 0.3 / 2, "mirror() waited for the server to come back"
        assert client.flush(60)
        stats = client.close()
        assert stats.reconnects >= 1
        m = stats.mirrors
        assert m.dropped == 0 and m.delivered == m.offered == len(items)
        assert servers[-1].terminate() == 0
    finally:
        client.close(0.1)
        for s in servers:
            if s.proc.poll() is None:
                s.kill()
    from sqlalchemy import text

    from service.storage import make_engine

    engine = make_engine(db_url)
    with engine.connect() as conn:
        logged = set(conn.execute(text("SELECT request_id FROM requests")).scalars())
    engine.dispose()
    assert logged == {i.request_id for i in items}, (
        "every acked (and every resent) request is logged once"
    )
