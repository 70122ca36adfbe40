"""`understudy demo`: the loop a newcomer can watch, on real components.

Starts the real service (gRPC + HTTP on loopback, journal on disk, embedded
PostgreSQL, the committed ONNX policies and the baselines), mirrors sample
requests built from ``../shared/data`` over all three paths (gRPC unary, the
gRPC stream, HTTP), sends a few malformed ones to show how they are refused,
waits for the scorer to log every counterfactual decision, and prints what was
acked and what each policy decided. Later stages replace the sample traffic
with the simulator's production emulator and its delayed outcomes.
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

from service.app import Service, build_service
from service.auth import token_digest
from service.pipeline.journal import read_all
from service.pipeline.journal_format import RecordKind
from service.samples import sample_requests
from service.settings import Settings
from service.storage import count_requests, policy_summaries, stop_embedded
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
        _wait_for_log(service, console)
        elapsed = time.perf_counter() - started
        _report(console, service, settings, refusals, elapsed)
    finally:
        service.stop()
        if service.embedded_db is not None:
            stop_embedded(root / "postgres")


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


def _wait_for_log(service: Service, console: Console, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    with console.status("scoring and logging every decision"):
        while service.journal.depth_records("scorer") > 0 and time.monotonic() < deadline:
            time.sleep(0.1)


def _report(
    console: Console,
    service: Service,
    settings: Settings,
    refusals: list[tuple[str, str]],
    elapsed: float,
) -> None:
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
    if service.engine is not None:
        _report_decisions(console, service)


def _report_decisions(console: Console, service: Service) -> None:
    assert service.engine is not None
    table = Table(
        "policy",
        "version",
        "n",
        "ok",
        "none feasible",
        "error",
        "agrees w/ prod",
        "fav. masked",
        "us/dec",
        title=f"Counterfactual decisions in the log ({count_requests(service.engine)} requests)",
    )
    for s in policy_summaries(service.engine):
        agreement = f"{s.agreement:.0%}" if s.agreement is not None else "n/a"
        table.add_row(
            s.policy,
            s.version,
            str(s.decisions),
            str(s.ok),
            str(s.all_infeasible),
            str(s.errors),
            agreement,
            str(s.infeasible_favourites),
            f"{s.mean_latency_us:.0f}",
        )
    console.print(table)
    console.print(
        "Nothing was sent back to Runtime: acks carry only accepted/shed/rejected. "
        "Replay any decision: `understudy replay --request-id ID --policy NAME` "
        "(with UNDERSTUDY_DATA_DIR=out/demo)."
    )
