"""The running service: its parts, and how they start and stop in order.

Start: gRPC and HTTP accept (ingest only needs the journal), then the scorer
consumes (on a thread, or feeding a scorer process: `Settings.scorer_mode`,
resolved once into `Service.scorer_placement`).
Stop: stop accepting, let the scorer drain what was journaled into the
decision log (bounded; in process mode the child is then stopped and joined),
close the journal (fsync), release the database.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import grpc
import uvicorn
from fastapi import FastAPI
from grpc_health.v1 import health, health_pb2
from sqlalchemy import Engine

from service.evaluator.loop import Evaluator
from service.metrics import ServiceMetrics
from service.pipeline.journal import IngestJournal
from service.pipeline.scorer import ScorerLoop
from service.policies.registry import Registry
from service.readiness import Readiness
from service.server.scorer_wiring import ScorerPlacement
from service.settings import Settings
from service.storage.chain.sealer import SealerLoop
from service.storage.db_probe import DatabaseProbe
from service.storage.embedded_watch import EmbeddedWatch
from service.storage.reviewer.guard import ReviewerGuardLoop
from service.transport.grpc.servicer import SERVICE_NAME
from service.transport.http.slow_clients import RequestDeadlineProtocol


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket, bound before uvicorn starts so port 0 can be reported."""
    # proto must be IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted
    # connections only when sock.proto says TCP, and without it Nagle's algorithm
    # holds every keep-alive HTTP response ~40 ms (measured: 21 req/s on one connection).
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


@dataclass
class Service:
    """Every long-lived part of a running Understudy process."""

    settings: Settings
    metrics: ServiceMetrics
    journal: IngestJournal
    readiness: Readiness
    scorer_placement: ScorerPlacement
    """Where this service scores, resolved from `settings.scorer_mode` (never `auto`)."""
    grpc_server: grpc.Server = field(init=False)
    grpc_port: int = field(init=False)
    health: health.HealthServicer = field(init=False)
    http_app: FastAPI = field(init=False)
    http_socket: socket.socket = field(init=False)
    engine: Engine | None = None
    embedded_db: Any = None
    policies: Registry | None = None
    scorer: ScorerLoop | None = None
    evaluator: Evaluator | None = None
    sealer: SealerLoop | None = None
    reviewer_guard: ReviewerGuardLoop | None = None
    db_probe: DatabaseProbe | None = None
    embedded_watch: EmbeddedWatch | None = None
    _http_server: uvicorn.Server | None = field(default=None, repr=False)
    _http_thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def http_port(self) -> int:
        """The port the HTTP socket is bound to."""
        return int(self.http_socket.getsockname()[1])

    def start(self) -> None:
        """Start gRPC (its own threads), HTTP (a uvicorn loop in a thread), the scorer."""
        self.grpc_server.start()
        tls: dict[str, Any] = {}
        if self.settings.tls_cert_file is not None:
            tls = {
                "ssl_certfile": str(self.settings.tls_cert_file),
                "ssl_keyfile": str(self.settings.tls_key_file),
            }
        config = uvicorn.Config(
            self.http_app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            http=RequestDeadlineProtocol,  # slow-loris: timeout_keep_alive also bounds a request
            **tls,
        )
        server = uvicorn.Server(config)
        self._http_server = server
        self._http_thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=[self.http_socket])),
            name="http",
            daemon=True,
        )
        self._http_thread.start()
        if self.scorer is not None:
            self.scorer.start()
        if self.evaluator is not None:
            self.evaluator.start()
        if self.sealer is not None:
            self.sealer.start()
        if self.reviewer_guard is not None:
            self.reviewer_guard.start()
        if self.embedded_watch is not None:
            self.embedded_watch.start()
        # Readiness rounds run in the background; gRPC health and understudy_ready follow each.
        self.readiness.subscribe(lambda _: self.update_health())
        self.readiness.evaluate()  # one round first (bounded), so health starts out right
        self.readiness.start()
        self.update_health()

    def wait_started(self, timeout: float = 10.0) -> None:
        """Block until uvicorn reports it is serving."""
        waiter = threading.Event()
        for _ in range(int(timeout / 0.01)):
            if self._http_server is not None and self._http_server.started:
                return
            waiter.wait(0.01)
        raise TimeoutError("HTTP server did not start")

    def update_health(self) -> None:
        """Mirror the latest readiness round into gRPC health and `understudy_ready`.

        Reads the snapshot only (`Readiness.ready`): never waits on a check.
        """
        ready = self.readiness.ready()
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ready
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        self.health.set(SERVICE_NAME, status)
        self.metrics.ready.set(1 if ready else 0)

    def stop(self, grace: float = 2.0, drain_timeout_s: float = 10.0) -> None:
        """Stop accepting, drain the journal into the log (bounded), close everything."""
        if self.embedded_watch is not None:
            self.embedded_watch.stop()  # a server stopped during shutdown stays stopped
        self.readiness.stop()
        self.health.enter_graceful_shutdown()
        if self._http_server is not None:
            self._http_server.should_exit = True
        self.grpc_server.stop(grace).wait(grace + 1)
        if self._http_thread is not None:
            self._http_thread.join(grace + 1)
        self.http_socket.close()
        if self.evaluator is not None:
            self.evaluator.stop()  # gives up the lease: another replica takes over at once
        if self.scorer is not None:
            self.scorer.stop(drain_timeout_s)
        if self.sealer is not None:
            self.sealer.stop()  # seals what the scorer drained
        if self.reviewer_guard is not None:
            self.reviewer_guard.stop()
        self.journal.close()
        if self.db_probe is not None:
            self.db_probe.close()
        if self.engine is not None:
            self.engine.dispose()
