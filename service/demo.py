"""`understudy demo`: the whole loop a newcomer can watch, on real components.

Starts the real service (gRPC + HTTP on loopback, journal on disk, embedded
PostgreSQL, the committed ONNX policies and the baselines). A simulated
Runtime — the simulator's production emulator on the ``train`` scenario,
built on the Gavel/Philly/PAI data — mirrors every placement request through
the real `MirrorClient` and reports each job's outcome when the simulation
says it completed; one episode in four mirrors *before* deciding, so
production's choice arrives with the outcome. A live view shows ingest rate,
journal depth, decisions per policy, agreement with production and outcomes
joined. It ends with each candidate against production and leaves the
decision log in ``out/demo`` for the next commands.
"""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
from rich.console import Console
from rich.live import Live
from rich.table import Table

from service.app import Service, build_service
from service.auth import token_digest
from service.client import MirrorClient
from service.contract import MirrorRequest, Outcome
from service.demo_view import LiveView, closing_tables, summed
from service.environment import World, load_scenario, log_episode
from service.settings import Settings
from service.storage import stop_embedded
from service.wire.convert import mirror_request_to_pb, outcome_to_pb
from service.wire.understudy.v1 import contract_pb2, shadow_pb2_grpc


def simulated_runtime(episodes: int, seed: int) -> list[MirrorRequest | Outcome]:
    """Every event the simulated Runtime sends, episode after episode, in time order."""
    world = World(load_scenario("train"))
    events: list[MirrorRequest | Outcome] = []
    for episode in range(episodes):
        log = log_episode(world, seed=seed, episode=episode, mirror_before=episode % 4 == 3)
        events += log.events()
    return events


def _paced(events: list[MirrorRequest | Outcome], duration_s: float) -> Iterator[int]:
    """Yield event indices, sleeping so the whole stream takes about `duration_s`."""
    chunk = 25
    pause = duration_s * chunk / max(len(events), 1)
    for start in range(0, len(events), chunk):
        yield from range(start, min(start + chunk, len(events)))
        time.sleep(pause)


def run_demo(
    episodes: int, duration_s: float, data_dir: str, console: Console, seed: int = 0
) -> None:
    """Run the demo end to end and print what it found."""
    root = Path(data_dir)
    shutil.rmtree(root, ignore_errors=True)
    token = secrets.token_urlsafe(24)
    settings = Settings(
        data_dir=root, grpc_port=0, http_port=0, auth_tokens={token_digest(token): "runtime"}
    )
    with console.status("simulating Runtime's traffic (train scenario)"):
        events = simulated_runtime(episodes, seed)
    with console.status("starting the service, embedded PostgreSQL and policies"):
        service = build_service(settings)
        service.start()
        service.wait_started()
    console.print(
        f"[bold]Understudy[/] gRPC 127.0.0.1:{service.grpc_port}, "
        f"HTTP 127.0.0.1:{service.http_port}, "
        f"data in {root}/; {len(events)} events to mirror over ~{duration_s:.0f}s"
    )
    try:
        _drive(service, token, events, duration_s, console)
        _show_refusals(service, token, events, console)
        accepted = summed(service, "understudy_ingest_total", kind="mirror", result="accepted")
        table, checks = closing_tables(service, accepted)
        console.print(table)
        for line in checks:
            console.print(line)
        console.print(
            f"The decision log is left in {root}/ (UNDERSTUDY_DATA_DIR={root}). Try: "
            f"`UNDERSTUDY_DATA_DIR={root} .venv/bin/understudy replay --request-id "
            f"train-s{seed}-e0-j0-r0 --policy gavel-scorer`"
        )
    finally:
        service.stop()
        if service.embedded_db is not None:
            stop_embedded(root / "postgres")


def _drive(
    service: Service,
    token: str,
    events: list[MirrorRequest | Outcome],
    duration_s: float,
    console: Console,
) -> None:
    view = LiveView(service)
    client = MirrorClient(f"127.0.0.1:{service.grpc_port}", token)
    sent = 0
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        last = 0.0
        for i in _paced(events, duration_s):
            event = events[i]
            if isinstance(event, MirrorRequest):
                client.mirror(mirror_request_to_pb(event))
            else:
                client.report_outcome(outcome_to_pb(event))
            sent = i + 1
            if time.monotonic() - last > 0.25:
                live.update(view.render(client.stats(), sent, len(events)))
                last = time.monotonic()
        client.flush(60)
        deadline = time.monotonic() + 120
        while service.journal.depth_records("scorer") > 0 and time.monotonic() < deadline:
            live.update(view.render(client.stats(), sent, len(events)))
            time.sleep(0.25)
        live.update(view.render(client.close(), sent, len(events)))
    console.print()


def _show_refusals(
    service: Service, token: str, events: list[MirrorRequest | Outcome], console: Console
) -> None:
    """Bad input is refused, named and counted; the service keeps serving."""
    good = next(e for e in events if isinstance(e, MirrorRequest))
    bad = mirror_request_to_pb(good)
    bad.request_id = "bad-1"
    bad.state.accelerators_free[0] = -1
    table = Table("refused as", "message", title="Bad input is refused, named and counted")
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = shadow_pb2_grpc.ShadowEvaluationStub(channel)  # type: ignore[no-untyped-call]
        try:
            stub.Mirror(bad, metadata=(("authorization", f"Bearer {token}"),))
        except grpc.RpcError as exc:
            table.add_row(f"gRPC {exc.code().name}", exc.details() or "")
    base = f"http://127.0.0.1:{service.http_port}"
    auth = {"authorization": f"Bearer {token}"}
    response = httpx.post(f"{base}/v1/mirror", content=b'{"request_id": "x"', headers=auth)
    table.add_row(f"HTTP {response.status_code}", response.json()["message"])
    response = httpx.post(
        f"{base}/v1/mirror", content=b"{}", headers={"authorization": "Bearer no"}
    )
    table.add_row(f"HTTP {response.status_code}", response.json()["message"])
    console.print(table)
    _ = contract_pb2  # the wire types Runtime uses (see docs/client.md)
