"""The composition root: builds every part from `Settings` and wires them.

Nothing else constructs settings, registries, journals or servers; tests call
`build_service` with their own settings (free ports, temp dirs) and get the
same wiring as production.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field

import grpc
import uvicorn
from fastapi import FastAPI
from grpc_health.v1 import health, health_pb2
from prometheus_client import CollectorRegistry

from service.auth import TokenAuthority
from service.contract import RequestLimits
from service.metrics import ServiceMetrics
from service.pipeline.ingest import Ingest
from service.pipeline.journal import FsyncMode, IngestJournal, JournalConfig
from service.readiness import Readiness
from service.settings import Settings
from service.transport.grpc.server import build_grpc_server
from service.transport.grpc.servicer import SERVICE_NAME, ShadowEvaluationServicer
from service.transport.http.app import create_http_app

log = logging.getLogger(__name__)

JOURNAL_CONSUMERS = ("scorer",)


@dataclass
class Service:
    """Every long-lived part of a running Understudy process."""

    settings: Settings
    metrics: ServiceMetrics
    journal: IngestJournal
    ingest: Ingest
    readiness: Readiness
    grpc_server: grpc.Server
    grpc_port: int
    health: health.HealthServicer
    http_app: FastAPI
    http_socket: socket.socket
    _http_server: uvicorn.Server | None = field(default=None, repr=False)
    _http_thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def http_port(self) -> int:
        """The port the HTTP socket is bound to."""
        return int(self.http_socket.getsockname()[1])

    def start(self) -> None:
        """Start gRPC (its own threads) and HTTP (a uvicorn loop in a thread)."""
        self.grpc_server.start()
        config = uvicorn.Config(
            self.http_app, log_level="warning", access_log=False, lifespan="off"
        )
        server = uvicorn.Server(config)
        self._http_server = server
        self._http_thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=[self.http_socket])),
            name="http",
            daemon=True,
        )
        self._http_thread.start()
        self._update_health()

    def wait_started(self, timeout: float = 10.0) -> None:
        """Block until uvicorn reports it is serving."""
        deadline = threading.Event()
        for _ in range(int(timeout / 0.01)):
            if self._http_server is not None and self._http_server.started:
                return
            deadline.wait(0.01)
        raise TimeoutError("HTTP server did not start")

    def _update_health(self) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.readiness.ready()
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        self.health.set(SERVICE_NAME, status)
        self.metrics.ready.set(1 if status == health_pb2.HealthCheckResponse.SERVING else 0)

    def stop(self, grace: float = 2.0) -> None:
        """Stop accepting, drain in-flight calls, close the journal (fsync)."""
        self.health.enter_graceful_shutdown()
        if self._http_server is not None:
            self._http_server.should_exit = True
        self.grpc_server.stop(grace).wait(grace + 1)
        if self._http_thread is not None:
            self._http_thread.join(grace + 1)
        self.http_socket.close()
        self.journal.close()


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def build_service(settings: Settings, registry: CollectorRegistry | None = None) -> Service:
    """Wire the service from settings; nothing is started."""
    metrics = ServiceMetrics(registry or CollectorRegistry())
    journal = IngestJournal(
        JournalConfig(
            directory=settings.resolved_journal_dir,
            segment_bytes=settings.journal_segment_bytes,
            max_bytes=settings.journal_max_bytes,
            fsync_mode=FsyncMode(settings.journal_fsync),
            fsync_interval_s=settings.journal_fsync_interval_s,
        ),
        consumers=JOURNAL_CONSUMERS,
    )
    metrics.watch_journal(
        depth_records=lambda: journal.depth_records(),
        depth_bytes=lambda: journal.depth_bytes,
        capacity_bytes=lambda: journal.capacity_bytes,
        head_seq=lambda: journal.head_seq,
    )
    limits = RequestLimits(max_options=settings.max_options, max_nodes=settings.max_nodes)
    ingest = Ingest(journal, metrics, limits)
    authority = TokenAuthority(settings.auth_tokens)
    readiness = Readiness()

    def journal_check() -> tuple[bool, str]:
        used = journal.depth_bytes / journal.capacity_bytes
        return True, f"{used:.1%} of {journal.capacity_bytes} bytes used"

    readiness.register("journal", journal_check)
    servicer = ShadowEvaluationServicer(ingest, authority, metrics, settings.max_request_bytes)
    grpc_server, grpc_port, health_servicer = build_grpc_server(
        servicer,
        settings.grpc_host,
        settings.grpc_port,
        settings.grpc_max_workers,
        settings.max_request_bytes,
    )
    http_app = create_http_app(
        ingest,
        authority,
        metrics,
        readiness,
        settings.max_request_bytes,
        offload_appends=settings.journal_fsync == "always",
    )
    return Service(
        settings=settings,
        metrics=metrics,
        journal=journal,
        ingest=ingest,
        readiness=readiness,
        grpc_server=grpc_server,
        grpc_port=grpc_port,
        health=health_servicer,
        http_app=http_app,
        http_socket=_bind(settings.http_host, settings.http_port),
    )


def serve(settings: Settings) -> None:
    """Run until SIGINT/SIGTERM; print one JSON line with the bound ports when ready."""
    service = build_service(settings)
    service.start()
    service.wait_started()
    print(
        json.dumps(
            {
                "event": "listening",
                "grpc_port": service.grpc_port,
                "http_port": service.http_port,
                "journal": str(settings.resolved_journal_dir),
            }
        ),
        flush=True,
    )
    stop = threading.Event()

    def on_signal(signum: int, _: object) -> None:
        log.info("signal %s: shutting down", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(1.0):
        service._update_health()
    service.stop()
    sys.stdout.flush()
