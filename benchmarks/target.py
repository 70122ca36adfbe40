"""The servers under test, each in its own process: Understudy, or a bare one that only acks.

``python -m benchmarks.target understudy --data-dir D [--onnx 3 --baselines 3]
[--scorer-mode thread|process]`` wires the real service (`build_service`:
journal, scorer, decision log in the embedded PostgreSQL with raw requests
stored, evaluator) with the cut policy set, and times every journal append
in-process (the service exposes no append histogram), written to ``--stats``
at SIGTERM. In process mode its line also names the scorer process's pid.

``python -m benchmarks.target bare-sync|bare-aio --transport grpc|http``
serves the same method paths but does nothing except ack: the raw limit of
the transport stack on this machine.

Each prints one JSON line (ports, pid) when it is serving and stops on SIGTERM.
Loopback only.
"""

from __future__ import annotations

import argparse
import bisect
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
from benchmarks.workload import read_varint

TOKEN = "bench-token"
ADMIN_TOKEN = "bench-admin"
SERVICE = "understudy.v1.ShadowEvaluation"
MIRROR_ACK = b"\x08\x01"  # MirrorAck{status: ACCEPTED}
HTTP_ACK = b'{"status":"accepted","request_id":"x"}'
EDGES = [1e-7 * 10 ** (i / 20) for i in range(141)]  # 0.1 us .. 10 s, 20 per decade


class AppendTimer:
    """A bounded log-bucket histogram of journal append durations."""

    def __init__(self) -> None:
        self.counts = [0] * (len(EDGES) + 1)
        self.lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(EDGES, seconds)
        with self.lock:
            self.counts[i] += 1

    def as_json(self) -> dict[str, Any]:
        return {"upper_edges_s": EDGES, "counts": self.counts}


def _stream_ack(sequence: int) -> bytes:
    from benchmarks.workload import varint

    return b"\x08\x01\x10" + varint(sequence)  # StreamAck{status: ACCEPTED, sequence}


def _sequence(raw: bytes) -> int:
    return read_varint(raw, 1)[0] if raw[:1] == b"\x08" else 0


def _handlers(unary: Any, stream: Any) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Mirror": grpc.unary_unary_rpc_method_handler(unary),
            "MirrorStream": grpc.stream_stream_rpc_method_handler(stream),
        },
    )


def bare_sync_grpc() -> None:
    def unary(raw: bytes, ctx: Any) -> bytes:
        return MIRROR_ACK

    def stream(requests: Iterator[bytes], ctx: Any) -> Iterator[bytes]:
        for raw in requests:
            yield _stream_ack(_sequence(raw))

    serve_sync_grpc(_handlers(unary, stream))


def bare_aio_grpc() -> None:
    async def unary(raw: bytes, ctx: Any) -> bytes:
        return MIRROR_ACK

    async def stream(requests: AsyncIterator[bytes], ctx: Any) -> AsyncIterator[bytes]:
        async for raw in requests:
            yield _stream_ack(_sequence(raw))

    serve_aio_grpc(_handlers(unary, stream))


def _http_ack(path: str, body: bytes) -> tuple[int, bytes]:
    return 202, HTTP_ACK


def bare_aio_http() -> None:
    serve_aio_http(_http_ack, read_body=False)


def bare_sync_http() -> None:
    serve_sync_http(_http_ack, read_body=False)


def understudy(args: argparse.Namespace) -> None:
    from functools import partial

    from benchmarks.policyset import policy_set
    from service.auth import token_digest
    from service.pipeline.scorer import ScorerLoop
    from service.pipeline.scorer_process import ProcessScorer
    from service.server.app import build_service
    from service.settings import Settings

    settings = Settings(
        data_dir=Path(args.data_dir),
        database_url=None,  # always the embedded PostgreSQL in data_dir, whatever the env says
        grpc_port=0,
        http_port=0,
        journal_max_bytes=args.journal_max_bytes,
        auth_tokens={token_digest(TOKEN): "runtime", token_digest(ADMIN_TOKEN): "admin"},
        scorer_mode=args.scorer_mode,
    )
    service = build_service(
        settings,
        policies=policy_set(args.onnx, args.baselines),
        # process mode: the scorer process cuts the same set itself (ONNX sessions do not pickle)
        policy_factory=partial(policy_set, args.onnx, args.baselines),
    )
    timer = AppendTimer()
    append = service.journal.append

    def timed_append(*args: Any, **kwargs: Any) -> int | None:
        started = time.perf_counter()
        try:
            return append(*args, **kwargs)
        finally:
            timer.observe(time.perf_counter() - started)

    service.journal.append = timed_append  # type: ignore[method-assign]
    service.start()
    service.wait_started()
    pg = settings.data_dir / "postgres" / "postmaster.pid"
    pg_pid = int(pg.read_text().split()[0]) if pg.exists() else None
    scorer = service.scorer
    handler = scorer.handler if isinstance(scorer, ScorerLoop) else None
    announce(
        grpc_port=service.grpc_port,
        http_port=service.http_port,
        pg_pid=pg_pid,
        scorer_pid=handler.child_pid if isinstance(handler, ProcessScorer) else None,
        policies=sorted(service.policies.policies) if service.policies else [],
    )
    stopper = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopper.set())
    signal.signal(signal.SIGINT, lambda *_: stopper.set())
    while not stopper.wait(1.0):
        service.update_health()
    if args.stats:
        Path(args.stats).write_text(json.dumps({"journal_append": timer.as_json()}))
    service.stop(grace=0.5, drain_timeout_s=2.0)


def main() -> None:
    """Parse arguments and serve until SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=["understudy", "bare-sync", "bare-aio"])
    parser.add_argument("--transport", choices=["grpc", "http"], default="grpc")
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--onnx", type=int, default=3)
    parser.add_argument("--baselines", type=int, default=3)
    parser.add_argument("--journal-max-bytes", type=int, default=1 << 30)
    parser.add_argument("--stats", default="")
    parser.add_argument("--scorer-mode", choices=["thread", "process"], default="thread")
    args = parser.parse_args()
    if args.kind == "understudy":
        understudy(args)
    elif args.transport == "grpc":
        (bare_sync_grpc if args.kind == "bare-sync" else bare_aio_grpc)()
    else:
        (bare_sync_http if args.kind == "bare-sync" else bare_aio_http)()


if __name__ == "__main__":
    main()
