"""The ingest routes served straight from ASGI answer exactly as FastAPI's routing does.

Two apps share one real `Ingest` and journal: one with the fast path
(`HttpApp.fast_routes`, as the service runs), one with ``fast_ingest=False``
(the same handlers behind FastAPI's routing and middleware). Each is served
by a real uvicorn on loopback with the service's HTTP protocol; a table of
good and bad requests goes to both, and status, body and headers must match
byte for byte, with every refusal counted once per app. Also on the fast
server: pipelined requests with large bodies on one connection, and a large
(but allowed) request head, are served.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from service.auth import TokenAuthority, token_digest
from service.contract import MirrorRequest, RequestLimits
from service.metrics import ServiceMetrics
from service.pipeline.ingest import Ingest
from service.pipeline.journal import FsyncMode, IngestJournal, JournalConfig
from service.pipeline.journal_format import RecordKind
from service.readiness import Readiness
from service.server.runtime import bind_socket
from service.transport.http.app import create_http_app
from service.transport.http.convert import mirror_to_json
from service.transport.http.slow_clients import RequestDeadlineProtocol
from service.wire.understudy.v1 import contract_pb2

TOKEN = "runtime-token"
LIMIT = 256 * 1024


@contextmanager
def _serve(app: FastAPI) -> Iterator[str]:
    sock = bind_socket("127.0.0.1", 0)
    config = uvicorn.Config(app, http=RequestDeadlineProtocol, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # a hang guard: the server starts in milliseconds
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn never started"
        time.sleep(0.01)  # poll interval of a condition wait
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(5)
        sock.close()


class Pair:
    """The fast app and the FastAPI-routed app over one ingest, each on its own server."""

    def __init__(self, tmp_path: Path, offload: bool) -> None:
        config = JournalConfig(directory=tmp_path / "journal", fsync_mode=FsyncMode.NEVER)
        self.journal = IngestJournal(config, consumers=("scorer",))
        self.metrics = ServiceMetrics(CollectorRegistry())
        ingest = Ingest(self.journal, self.metrics, RequestLimits())
        authority = TokenAuthority(
            {token_digest(TOKEN): "runtime", token_digest("r-tok"): "reviewer"}
        )
        self.apps = [
            create_http_app(
                ingest, authority, self.metrics, Readiness(), LIMIT, offload, fast_ingest=fast
            )
            for fast in (True, False)
        ]

    def counter(self, name: str, **labels: str) -> float:
        """Sum of `name`'s samples on the HTTP transport with `labels`."""
        total = 0.0
        for family in self.metrics.registry.collect():
            for sample in family.samples:
                wanted = {"transport": "http", **labels}.items()
                if sample.name == name and wanted <= sample.labels.items():
                    total += sample.value
        return total


@pytest.fixture(params=[False, True], ids=["on the loop", "appends offloaded"])
def pair(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Pair, list[str]]]:
    """Both apps; appends on the event loop, or in the thread pool (journal_fsync=always)."""
    made = Pair(tmp_path, offload=request.param)
    with _serve(made.apps[0]) as fast, _serve(made.apps[1]) as routed:
        yield made, [fast, routed]
    made.journal.close()


def _chunked(data: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def _cases(valid: bytes) -> list[tuple[str, str, str, dict[str, str], Any]]:
    """(id, method, path, headers, content) — content may be a generator factory (chunked)."""
    good = {"authorization": f"Bearer {TOKEN}"}
    body = json.loads(valid)
    nan = json.loads(valid)
    nan["state"]["cpu_free"][0] = float("nan")
    bad_type = dict(body, schema_version="1")
    return [
        ("valid mirror", "POST", "/v1/mirror", good, valid),
        ("valid mirror, chunked", "POST", "/v1/mirror", good, lambda: _chunked(valid, 4096)),
        ("valid outcome", "POST", "/v1/outcomes", good, b'{"request_id":"o","observed_at":1e9}'),
        ("outcome refused", "POST", "/v1/outcomes", good, b'{"request_id":"o","observed_at":1e15}'),
        ("no token", "POST", "/v1/mirror", {}, valid),
        ("wrong token", "POST", "/v1/outcomes", {"authorization": "Bearer nope"}, b"{}"),
        ("reviewer token", "POST", "/v1/mirror", {"authorization": "Bearer r-tok"}, valid),
        ("not json", "POST", "/v1/mirror", good, b"{not json"),
        ("empty", "POST", "/v1/mirror", good, b""),
        ("NaN", "POST", "/v1/mirror", good, json.dumps(nan).encode()),
        ("wrong type", "POST", "/v1/mirror", good, json.dumps(bad_type).encode()),
        ("declared too large", "POST", "/v1/mirror", good, b"x" * (LIMIT + 1)),
        ("chunked too large", "POST", "/v1/mirror", good, lambda: _chunked(b"x" * 2 * LIMIT)),
        ("GET on an ingest path", "GET", "/v1/mirror", good, None),
        ("trailing slash", "POST", "/v1/mirror/", good, valid),
    ]


def test_fast_routes_answer_byte_for_byte_as_fastapi_routing(
    pair: tuple[Pair, list[str]], requests_sample: list[MirrorRequest]
) -> None:
    made, urls = pair
    cases = _cases(mirror_to_json(requests_sample[0]))
    refused = 0
    for case_id, method, path, headers, content in cases:
        replies = []
        for url in urls:
            with httpx.Client(base_url=url, timeout=10, follow_redirects=False) as http:
                sent = content() if callable(content) else content
                r = http.request(method, path, headers=headers, content=sent)
            replies.append(
                (
                    r.status_code,
                    r.content,
                    r.headers.get("content-type"),
                    r.headers.get("www-authenticate"),
                )
            )
        assert replies[0] == replies[1], case_id
        if path in ("/v1/mirror", "/v1/outcomes") and method == "POST" and replies[0][0] >= 400:
            refused += 1
    assert refused == 10  # the table's refusals; each counted once per app below
    auth = made.counter("understudy_auth_failures_total")
    assert made.counter("understudy_ingest_total", result="rejected") + auth == 2 * refused
    assert auth == 2 * 3
    journaled = [r for r in made.journal.read("scorer", 100)]
    # one request accepted by both apps: journaled once, the re-sends acked as
    # duplicates (docs/ingest.md, "Identity"); outcomes are journaled as sent
    assert [r.kind for r in journaled] == [RecordKind.MIRROR] + [RecordKind.OUTCOME] * 2


def _read_responses(sock: socket.socket, n: int) -> list[bytes]:
    data = b""
    responses: list[bytes] = []
    sock.settimeout(10)
    while len(responses) < n:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"closed after {len(responses)} responses"
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(data) < length:
            data += sock.recv(65536)
        responses.append(head.split(b"\r\n")[0] + b" " + data[:length])
        data = data[length:]
    return responses


def _request(port: int, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST /v1/mirror HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}"
        f"\r\nContent-Type: application/json\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def test_pipelined_requests_and_a_large_head_are_served(
    pair: tuple[Pair, list[str]], requests_sample: list[MirrorRequest]
) -> None:
    """A chunk that ends one body and begins the next head is not a too-large head."""
    made, urls = pair
    port = int(urls[0].rsplit(":", 1)[1])
    bodies = [
        mirror_to_json(r).replace(r.request_id.encode(), f"pipe-{i}".encode())
        for i, r in enumerate(requests_sample[:3])
    ]
    filler = f"X-Filler: {'a' * 12 * 1024}\r\n"  # under the 16 KiB head bound
    wire = b"".join(_request(port, b) for b in bodies) + _request(port, bodies[0], filler)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(wire)
        responses = _read_responses(sock, 4)
    assert all(r.startswith(b"HTTP/1.1 202") for r in responses), responses
    ids = [json.loads(r.split(b" ", 3)[3])["request_id"] for r in responses]
    assert ids == ["pipe-0", "pipe-1", "pipe-2", "pipe-0"]
    journaled = [
        contract_pb2.MirrorRequest.FromString(r.payload).request_id
        for r in made.journal.read("scorer", 100)
    ]
    assert journaled == ids[:3]  # the last is a re-send of pipe-0: acked, not journaled again
