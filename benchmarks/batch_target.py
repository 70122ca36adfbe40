"""The servers of the batch benchmark, each in its own process.

``python -m benchmarks.batch_target understudy --data-dir D --stats S`` wires
the real service as an *ingest-only* deployment (`Settings.scoring_enabled`
False: receive, validate, journal and ack, no scorer, no decision log; issue
24's "one process for ingest"), with every journal append timed in-process as
`benchmarks.target` does (the service exposes no append histogram), written to
``--stats`` at SIGTERM.

``python -m benchmarks.batch_target bare-sync|bare-aio --transport grpc|http``
serves the same methods but only *parses* each message (``MirrorBatch`` /
``MirrorBatchStreamRequest`` / ``MirrorRequest`` / ``MirrorStreamRequest``:
one protobuf parse, as ingest's first step) and acks it with the count it
holds: the raw limit of the transport stack on the same messages.

Each prints one JSON line (ports, pid) when serving and stops on SIGTERM. Loopback only.
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc

from benchmarks.bare_servers import (
    announce,
    serve_aio_grpc,
    serve_aio_http,
    serve_sync_grpc,
    serve_sync_http,
)
from benchmarks.target import (
    ADMIN_TOKEN,
    MIRROR_ACK,
    SERVICE,
    TOKEN,
    AppendTimer,
    _stream_ack,
)
from service.wire.understudy.v1 import batch_pb2, contract_pb2, shadow_pb2

ACCEPTED = shadow_pb2.ACK_STATUS_ACCEPTED


def batch_size(batch: batch_pb2.MirrorBatch) -> int:
    """Requests in a parsed batch (its f64 request_time column)."""
    return len(batch.request_time) // 8


def many_ack(raw: bytes) -> bytes:
    """Parse a `MirrorBatch`, ack it whole."""
    n = batch_size(batch_pb2.MirrorBatch.FromString(raw))
    return shadow_pb2.BatchAck(status=ACCEPTED, accepted=n).SerializeToString()


class StreamAcker:
    """Per stream: parse each `MirrorBatchStreamRequest`, ack cumulatively with totals."""

    def __init__(self) -> None:
        self.total = 0

    def ack(self, raw: bytes) -> bytes:
        msg = shadow_pb2.MirrorBatchStreamRequest.FromString(raw)
        n = batch_size(msg.batch)
        self.total += n
        ack = shadow_pb2.BatchAck(
            status=ACCEPTED, sequence=msg.sequence, accepted=n, stream_accepted=self.total
        )
        return shadow_pb2.BatchStreamAck(ack=ack).SerializeToString()


def single_ack(raw: bytes) -> bytes:
    contract_pb2.MirrorRequest.FromString(raw)
    return MIRROR_ACK


def single_stream_ack(raw: bytes) -> bytes:
    msg = shadow_pb2.MirrorStreamRequest.FromString(raw)
    return _stream_ack(msg.sequence)


def http_reply(path: str, body: bytes) -> bytes:
    """The JSON reply to one POST: a batch is parsed and counted, a single request parsed."""
    if path.endswith("/batch"):
        n = batch_size(batch_pb2.MirrorBatch.FromString(body))
        return (
            b'{"status":"accepted","accepted":%d,"shed":0,"rejected":0,"rejections":[],'
            b'"whole_batch":false}' % n
        )
    return b'{"status":"accepted","request_id":"x"}'


def _table(single: Any, single_stream: Any, many: Any, stream: Any) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Mirror": grpc.unary_unary_rpc_method_handler(single),
            "MirrorStream": grpc.stream_stream_rpc_method_handler(single_stream),
            "MirrorMany": grpc.unary_unary_rpc_method_handler(many),
            "MirrorManyStream": grpc.stream_stream_rpc_method_handler(stream),
        },
    )


def sync_handlers() -> grpc.GenericRpcHandler:
    """The four mirror methods for the thread-pool server."""

    def stream(requests: Iterator[bytes], ctx: Any) -> Iterator[bytes]:
        acker = StreamAcker()
        for raw in requests:
            yield acker.ack(raw)

    def single_stream(requests: Iterator[bytes], ctx: Any) -> Iterator[bytes]:
        for raw in requests:
            yield single_stream_ack(raw)

    return _table(
        lambda raw, ctx: single_ack(raw), single_stream, lambda raw, ctx: many_ack(raw), stream
    )


def aio_handlers() -> grpc.GenericRpcHandler:
    """The four mirror methods for the asyncio server."""

    async def stream(requests: AsyncIterator[bytes], ctx: Any) -> AsyncIterator[bytes]:
        acker = StreamAcker()
        async for raw in requests:
            yield acker.ack(raw)

    async def single_stream(requests: AsyncIterator[bytes], ctx: Any) -> AsyncIterator[bytes]:
        async for raw in requests:
            yield single_stream_ack(raw)

    async def many(raw: bytes, ctx: Any) -> bytes:
        return many_ack(raw)

    async def single(raw: bytes, ctx: Any) -> bytes:
        return single_ack(raw)

    return _table(single, single_stream, many, stream)


OPTIONS = [("grpc.max_receive_message_length", 16 << 20)]


def _http_reply(path: str, body: bytes) -> tuple[int, bytes]:
    return 200, http_reply(path, body)


def bare_sync_grpc() -> None:
    serve_sync_grpc(sync_handlers(), OPTIONS)


def bare_aio_grpc() -> None:
    serve_aio_grpc(aio_handlers(), OPTIONS)


def bare_aio_http() -> None:
    serve_aio_http(_http_reply, read_body=True)


def bare_sync_http() -> None:
    serve_sync_http(_http_reply, read_body=True)


class GcPauses:
    """Count, total and longest pause of the cyclic collector per generation: a stall
    in the ack latencies that lines up with a long generation-2 pause is the GC."""

    def __init__(self) -> None:
        self.started = 0.0
        self.by_gen = {g: [0, 0.0, 0.0] for g in range(3)}

    def callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        took = time.perf_counter() - self.started
        entry = self.by_gen[info["generation"]]
        entry[0] += 1
        entry[1] += took
        entry[2] = max(entry[2], took)

    def as_json(self) -> dict[str, dict[str, float]]:
        return {
            str(g): {"count": c, "total_s": t, "max_s": m} for g, (c, t, m) in self.by_gen.items()
        }


def understudy(args: argparse.Namespace) -> None:
    from service.auth import token_digest
    from service.server.app import build_service
    from service.settings import Settings

    settings = Settings(
        data_dir=Path(args.data_dir),
        database_url=None,
        grpc_port=0,
        http_port=0,
        journal_max_bytes=args.journal_max_bytes,
        auth_tokens={token_digest(TOKEN): "runtime", token_digest(ADMIN_TOKEN): "admin"},
        scoring_enabled=False,  # ingest only: the scorer runs elsewhere (issue 24, build 4)
    )
    service = build_service(settings, policies=None)
    timer = AppendTimer()
    append = service.journal.append

    def timed_append(*a: Any, **kw: Any) -> int | None:
        started = time.perf_counter()
        try:
            return append(*a, **kw)
        finally:
            timer.observe(time.perf_counter() - started)

    service.journal.append = timed_append  # type: ignore[method-assign]
    pauses = GcPauses()
    gc.callbacks.append(pauses.callback)
    service.start()
    service.wait_started()
    announce(grpc_port=service.grpc_port, http_port=service.http_port)
    stopper = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopper.set())
    signal.signal(signal.SIGINT, lambda *_: stopper.set())
    while not stopper.wait(1.0):
        service.update_health()
    if args.stats:
        stats = {"journal_append": timer.as_json(), "gc_pauses": pauses.as_json()}
        Path(args.stats).write_text(json.dumps(stats))
    service.stop(grace=0.5, drain_timeout_s=2.0)


def main() -> None:
    """Parse arguments and serve until SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=["understudy", "bare-sync", "bare-aio"])
    parser.add_argument("--transport", choices=["grpc", "http"], default="grpc")
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--journal-max-bytes", type=int, default=8 << 30)
    parser.add_argument("--stats", default="")
    args = parser.parse_args()
    if args.kind == "understudy":
        understudy(args)
    elif args.transport == "grpc":
        (bare_sync_grpc if args.kind == "bare-sync" else bare_aio_grpc)()
    else:
        (bare_sync_http if args.kind == "bare-sync" else bare_aio_http)()


__all__ = ["ADMIN_TOKEN", "TOKEN"]

if __name__ == "__main__":
    main()
