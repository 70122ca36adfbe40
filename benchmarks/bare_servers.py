"""The bare servers' plumbing: serve given handlers on gRPC (sync or aio) or HTTP (sync or aio).

The raw limit of a transport on this machine is a server that does as little as a
server of that stack can: no validation, no journal, an ack. `benchmarks.target`
(acks only) and `benchmarks.batch_target` (parses each message as ingest's first
step does, then acks its count) differ in what they answer, not in how they
serve, so both hand their answers to these four functions. Each prints one JSON
line (ports, pid) when serving and returns on SIGTERM or SIGINT. Loopback only.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc

HttpReply = Callable[[str, bytes], tuple[int, bytes]]
"""(path, body) -> (status, JSON body) of one POST; the body is b"" unless `read_body`."""

GrpcOptions = Sequence[tuple[str, Any]]


def announce(**fields: Any) -> None:
    """The one line the benchmark waits for: serving, with its ports and pid."""
    print(json.dumps({"event": "listening", "pid": os.getpid(), **fields}), flush=True)


def wait_for_sigterm() -> None:
    """Block until SIGTERM or SIGINT (the benchmark stops its servers by pid)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass


def serve_sync_grpc(handlers: grpc.GenericRpcHandler, options: GrpcOptions = ()) -> None:
    """The thread-pool gRPC server (16 workers, as the service's)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=list(options))
    server.add_generic_rpc_handlers((handlers,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    announce(grpc_port=port)
    wait_for_sigterm()
    server.stop(0)


def serve_aio_grpc(handlers: grpc.GenericRpcHandler, options: GrpcOptions = ()) -> None:
    """The asyncio gRPC server."""

    async def main() -> None:
        server = grpc.aio.server(options=list(options))
        server.add_generic_rpc_handlers((handlers,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        announce(grpc_port=port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        await stop.wait()
        await server.stop(0)

    asyncio.run(main())


def serve_aio_http(reply: HttpReply, *, read_body: bool) -> None:
    """A bare ASGI app under uvicorn: read the body (kept only if `read_body`), answer."""
    import uvicorn

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if read_body:
                chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        status, body = reply(scope["path"], b"".join(chunks))
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    # proto=IPPROTO_TCP, so asyncio sets TCP_NODELAY on accepted connections (it checks
    # the proto); without it Nagle + delayed ACK add ~40 ms to a two-write response.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    announce(http_port=sock.getsockname()[1])
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


def serve_sync_http(reply: HttpReply, *, read_body: bool) -> None:
    """The standard library's threading HTTP server, answering as `serve_aio_http`."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body are separate writes

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status, answer = reply(self.path, body if read_body else b"")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    announce(http_port=server.server_address[1])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    wait_for_sigterm()
    server.shutdown()
