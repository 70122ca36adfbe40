"""Size limits and slow clients on the HTTP server, with raw sockets on loopback.

- A body over the limit is refused with 413 as soon as that is known — from
  its Content-Length, or once the limit is passed for a chunked body — not
  after reading it all; the refusal is counted.
- Slow-loris: connections that dribble their headers, stall half-way through
  a body, or connect and say nothing are closed once the request deadline
  passes (uvicorn's `timeout_keep_alive`, see
  `service/transport/http/slow_clients.py`), while other clients keep being
  served promptly. A body cut short is a counted rejection, not an error log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import pytest
import uvicorn

from service.contract import MirrorRequest
from service.server.app import Service
from service.server.runtime import bind_socket
from service.transport.http.convert import mirror_to_json
from service.transport.http.slow_clients import RequestDeadlineProtocol
from tests.hostile.metrics_read import counter_sum

pytestmark = pytest.mark.live  # waits on a real service: run under load by make test-busy

LIMIT = 64 * 1024


def _rejected(service: Service) -> float:
    return counter_sum(service, "understudy_ingest_total", transport="http", result="rejected")


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_response(sock: socket.socket, timeout: float = 5.0) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _headers(port: int, token: str, extra: str) -> bytes:
    return (
        f"POST /v1/mirror HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n{extra}\r\n"
    ).encode()


def test_declared_oversized_body_is_413_before_it_is_sent(
    make_service: Callable[..., Service], runtime_token: str
) -> None:
    service = make_service(scoring_enabled=False, max_request_bytes=LIMIT)
    port = service.http_port
    with _connect(port) as sock:
        sock.sendall(_headers(port, runtime_token, "Content-Length: 1073741824\r\n") + b"{")
        response = _read_response(sock)
    # An answer at all proves it came before the body: the gigabyte is never sent, so a
    # server that waited for it would only ever close the connection at its deadline.
    assert response.startswith(b"HTTP/1.1 413"), response[:200]
    assert _rejected(service) == 1


def test_chunked_oversized_body_is_413_once_the_limit_is_passed(
    make_service: Callable[..., Service], runtime_token: str
) -> None:
    service = make_service(scoring_enabled=False, max_request_bytes=LIMIT)
    port = service.http_port
    chunk = b"x" * 65536
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    planned = 1024 * len(chunk)  # 64 MiB, 1024x the limit
    sent = 0
    response = b""
    with _connect(port) as sock:
        sock.settimeout(2)
        sock.sendall(_headers(port, runtime_token, "Transfer-Encoding: chunked\r\n"))
        while sent < planned and not response:
            try:
                sock.sendall(framed)
            except OSError:  # the server stopped reading (or closed): stop sending
                break
            sent += len(chunk)
            if select.select([sock], [], [], 0.001)[0]:  # also lets the server thread run
                response = _read_response(sock)
        response = response or _read_response(sock)
    assert response.startswith(b"HTTP/1.1 413"), response[:200]
    # What was sent before the answer came: the server's read plus socket buffers.
    assert sent < planned / 8, f"{sent} bytes sent before the refusal"
    assert _rejected(service) == 1


LATE_S = 30.0
"""How much later than its deadline a loaded server may cut a slow client off."""


@dataclass
class SlowClient:
    """One hostile connection and what the server did to it."""

    kind: str
    closed_after: float | None = None
    response: bytes = b""


def drip_until_closed(
    sock: socket.socket, client: SlowClient, pending: bytes, started: float, give_up_s: float
) -> None:
    """Send `pending` a byte at a time while reading, until the server closes the
    connection (`client.closed_after`, from `started`) or `give_up_s` passes."""
    while time.perf_counter() - started < give_up_s:
        if pending:
            try:
                sock.send(pending[:1])
            except OSError:
                break
            pending = pending[1:]
        readable, _, _ = select.select([sock], [], [], 0.25)
        if readable:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            client.response += data
            if not data:
                client.closed_after = time.perf_counter() - started
                return


def _dribble(port: int, token: str, client: SlowClient, give_up_s: float) -> None:
    """Act out `client.kind` until the server closes the connection (or we give up)."""
    body = b'{"schema_version": 1, "request_id": "slow"'
    started = time.perf_counter()
    with _connect(port) as sock:
        pending = b""
        if client.kind == "headers":
            pending = _headers(port, token, "Content-Length: 10\r\n")
        elif client.kind == "body":
            sock.sendall(_headers(port, token, f"Content-Length: {len(body) * 4}\r\n") + body)
        drip_until_closed(sock, client, pending, started, give_up_s)


@contextmanager
def _slow_clients(
    port: int, token: str, kinds: list[str], give_up_s: float
) -> Iterator[list[SlowClient]]:
    clients = [SlowClient(kind) for kind in kinds]
    threads = [
        threading.Thread(target=_dribble, args=(port, token, c, give_up_s), daemon=True)
        for c in clients
    ]
    for t in threads:
        t.start()
    try:
        yield clients
    finally:
        for t in threads:
            t.join(give_up_s + 5)


def _check_slow_clients_are_cut_off(
    port: int,
    token: str,
    deadline_s: float,
    good_request: bytes,
    count_rejected: Callable[[], float],
) -> None:
    kinds = ["headers"] * 6 + ["body"] * 4 + ["idle"] * 2
    rejected_before = count_rejected()
    latencies: list[float] = []
    served_while_all_open = 0  # good requests answered while every slow client still hung on
    with (
        httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"authorization": f"Bearer {token}"},
            timeout=60,
        ) as http,
        _slow_clients(port, token, kinds, give_up_s=deadline_s + LATE_S + 30) as clients,
    ):
        until = time.perf_counter() + deadline_s + 0.5
        while time.perf_counter() < until:
            started = time.perf_counter()
            assert http.post("/v1/mirror", content=good_request).status_code == 202
            latencies.append(time.perf_counter() - started)
            if all(c.closed_after is None for c in clients):
                served_while_all_open += 1
            time.sleep(0.1)  # pacing of the good client, not a synchronisation
    closed = sorted((c.kind, c.closed_after) for c in clients)
    print(
        f"\nslow clients closed after (s): {closed}; {len(latencies)} good requests meanwhile, "
        f"slowest {max(latencies) * 1000:.0f} ms"
    )
    for client in clients:
        assert client.closed_after is not None, f"{client.kind} client was never cut off"
        # Not before the deadline (load only delays); later only as late as load can
        # make it, far before the clients give up.
        assert deadline_s - 0.5 <= client.closed_after <= deadline_s + LATE_S, client
        assert client.response == b"", client.response[:200]
    # Served meanwhile: a server stuck on slow clients could answer none of these.
    assert served_while_all_open >= 1, (served_while_all_open, closed)
    assert count_rejected() - rejected_before == kinds.count("body")


@contextmanager
def _server_with_deadline(service: Service, deadline_s: int) -> Iterator[int]:
    """The service's HTTP app behind the service's protocol, with a short deadline."""
    sock = bind_socket("127.0.0.1", 0)
    config = uvicorn.Config(
        service.http_app,
        http=RequestDeadlineProtocol,
        timeout_keep_alive=deadline_s,
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    guard = time.monotonic() + 120  # a hang guard: the server starts in milliseconds
    while not server.started:
        assert time.monotonic() < guard and thread.is_alive(), "uvicorn never started"
        time.sleep(0.01)  # poll interval of a condition wait
    try:
        yield int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(5)
        sock.close()


def test_slow_clients_are_cut_off_while_others_are_served(
    service: Service,
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    with _server_with_deadline(service, deadline_s=1) as port:
        _check_slow_clients_are_cut_off(
            port,
            runtime_token,
            1.0,
            mirror_to_json(requests_sample[0]),
            lambda: _rejected(service),
        )
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.slow
def test_the_service_cuts_off_slow_clients_at_its_configured_deadline(
    service: Service,
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    assert service._http_server is not None
    deadline = float(service._http_server.config.timeout_keep_alive)
    assert deadline <= 10
    _check_slow_clients_are_cut_off(
        service.http_port,
        runtime_token,
        deadline,
        mirror_to_json(requests_sample[0]),
        lambda: _rejected(service),
    )
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_client_that_goes_away_mid_body_is_a_counted_rejection_not_an_error(
    service: Service, runtime_token: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    port = service.http_port
    body = json.dumps({"schema_version": 1}).encode()
    with _connect(port) as sock:
        sock.sendall(_headers(port, runtime_token, f"Content-Length: {len(body) * 10}\r\n") + body)
        time.sleep(0.2)  # the client's own pause mid-body before it goes away (the scenario)
    guard = time.monotonic() + 120  # a hang guard, not a speed requirement
    while _rejected(service) < 1:
        assert time.monotonic() < guard, "the rejection was never counted (hang guard)"
        time.sleep(0.05)  # poll interval of a condition wait
    assert _rejected(service) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_oversized_headers_are_refused_by_the_parser_and_others_served(
    service: Service, runtime_token: str, requests_sample: list[MirrorRequest]
) -> None:
    port = service.http_port
    head = _headers(port, runtime_token, f"X-Filler: {'a' * 1024 * 1024}\r\n")
    response = b""
    with _connect(port) as sock:
        try:  # in pieces, as a network delivers them: an incomplete head is bounded
            for start in range(0, len(head), 8192):
                sock.sendall(head[start : start + 8192])
                if select.select([sock], [], [], 0.001)[0]:
                    break
            response = _read_response(sock)
        except OSError:  # reset before the answer could be read: refused all the same
            pass
    assert response == b"" or response.startswith(b"HTTP/1.1 400"), response[:200]
    ok = httpx.post(
        f"http://127.0.0.1:{port}/v1/mirror",
        content=mirror_to_json(requests_sample[0]),
        headers={"authorization": f"Bearer {runtime_token}"},
    )
    assert ok.status_code == 202
    assert _rejected(service) == 0  # refused before any route ran: nothing to count
