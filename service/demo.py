"""`understudy demo` at the foundation stage: the ingest loop a newcomer can watch.

Starts the real service (gRPC + HTTP on loopback, journal on disk), mirrors
sample requests built from ``../shared/data`` over all three paths (gRPC
unary, the gRPC stream, HTTP), sends a few malformed ones to show how they
are refused, and prints what the service accepted, shed and rejected next to
what its journal holds. Later stages replace the sample traffic with the
simulator's production emulator.
"""

from __future__ import annotations

import secrets
import shutil
import time
from pathlib import Path

import grpc
import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from service.app import build_service
from service.auth import token_digest
from service.pipeline.journal import read_all
from service.pipeline.journal_format import RecordKind
from service.samples import sample_requests
from service.settings import Settings
from service.transport.http.convert import mirror_to_json
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import contract_pb2, shadow_pb2, shadow_pb2_grpc


def run_demo(requests: int, data_dir: str, console: Console) -> None:
    """Run the demo end to end and print a summary."""
    root = Path(data_dir)
    shutil.rmtree(root, ignore_errors=True)
    token = secrets.token_urlsafe(24)
    settings = Settings(
        data_dir=root,
        grpc_port=0,
        http_port=0,
        auth_tokens={token_digest(token): "runtime"},
    )
    service = build_service(settings)
    service.start()
    service.wait_started()
    console.print(
        f"[bold]Understudy[/] listening: gRPC 127.0.0.1:{service.grpc_port}, "
        f"HTTP 127.0.0.1:{service.http_port}, journal {settings.resolved_journal_dir}"
    )
    requests_ = list(sample_requests(requests, seed=7))
    samples = [mirror_request_to_pb(r) for r in requests_]
    thirds = [samples[0::3], samples[1::3]]
    http_requests = requests_[2::3]
    metadata = (("authorization", f"Bearer {token}"),)
    started = time.perf_counter()
    try:
        with (
            grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel,
            httpx.Client(
                base_url=f"http://127.0.0.1:{service.http_port}",
                headers={"authorization": f"Bearer {token}"},
            ) as http,
            Progress(console=console) as progress,
        ):
            stub = shadow_pb2_grpc.ShadowEvaluationStub(channel)  # type: ignore[no-untyped-call]
            task = progress.add_task("mirroring", total=len(samples))
            for msg in thirds[0]:
                stub.Mirror(msg, metadata=metadata)
                progress.advance(task)
            stream = (
                shadow_pb2.MirrorStreamRequest(sequence=i + 1, request=m)
                for i, m in enumerate(thirds[1])
            )
            for ack in stub.MirrorStream(stream, metadata=metadata):
                if ack.status == shadow_pb2.ACK_STATUS_ACCEPTED:
                    progress.update(task, completed=len(thirds[0]) + ack.accepted)
            for request in http_requests:
                http.post("/v1/mirror", content=mirror_to_json(request))
                progress.advance(task)
            refusals = _send_bad_inputs(stub, http, metadata, samples[0])
    finally:
        elapsed = time.perf_counter() - started
        service.stop()
    _report(console, service, settings, refusals, elapsed)


def _send_bad_inputs(
    stub: shadow_pb2_grpc.ShadowEvaluationStub,
    http: httpx.Client,
    metadata: tuple[tuple[str, str], ...],
    good: contract_pb2.MirrorRequest,
) -> list[tuple[str, str]]:
    refusals = []
    bad = contract_pb2.MirrorRequest()
    bad.CopyFrom(good)
    bad.state.accelerators_free[2] = -1
    try:
        stub.Mirror(bad, metadata=metadata)
    except grpc.RpcError as exc:
        refusals.append((f"gRPC {exc.code().name}", exc.details() or ""))
    response = http.post("/v1/mirror", content=b'{"schema_version": 1, "request_id": "x"')
    refusals.append((f"HTTP {response.status_code}", response.json()["message"]))
    response = http.post("/v1/mirror", content=b"{}", headers={"authorization": "Bearer wrong"})
    refusals.append((f"HTTP {response.status_code}", response.json()["message"]))
    return refusals


def _report(
    console: Console,
    service: object,
    settings: Settings,
    refusals: list[tuple[str, str]],
    elapsed: float,
) -> None:
    from service.app import Service

    assert isinstance(service, Service)
    table = Table("transport", "accepted", "shed", "rejected", title="What the service acked")
    registry = service.metrics.registry
    for transport in ("grpc", "grpc_stream", "http"):
        row = [
            registry.get_sample_value(
                "understudy_ingest_total",
                {"transport": transport, "kind": "mirror", "result": result},
            )
            or 0.0
            for result in ("accepted", "shed", "rejected")
        ]
        table.add_row(transport, *(f"{v:.0f}" for v in row))
    console.print(table)
    records = read_all(settings.resolved_journal_dir)
    mirrors = [r for r in records if r.kind == RecordKind.MIRROR]
    console.print(
        f"Journal holds {len(mirrors)} mirrored requests (seq {mirrors[0].seq}..{mirrors[-1].seq}) "
        f"in {elapsed:.2f}s; every accepted ack is there."
        if mirrors
        else "Journal is empty."
    )
    refused = Table("refused as", "message", title="Bad input is refused, named and counted")
    for code, message in refusals:
        refused.add_row(code, message)
    console.print(refused)
    console.print(
        "Next stages score these with every candidate policy and log the decisions "
        "to PostgreSQL (issues 3-4)."
    )
