"""`understudy demo`: the whole loop a newcomer can watch, on real components.

Starts the real service (gRPC + HTTP on loopback, journal on disk, embedded
PostgreSQL, the committed ONNX policies and the baselines, the evaluator). A
simulated Runtime — the simulator's production emulator on the ``demo``
scenario (the training cluster's hardware and workload, built on the
Gavel/Philly/PAI data, with a fleet large enough that most requests have a
choice) — mirrors every placement request through the real `MirrorClient` and
reports each job's outcome when the simulation says it completed; one
episode in four mirrors *before* deciding, so production's choice arrives
with the outcome.

Before the traffic, the demo starts the predeclared shadow protocol
``protocols/first-fit-shadow.yaml`` over the HTTP API, as its owner
would. A live view shows ingest rate, journal depth, decisions per policy,
agreement with production, outcomes joined and the protocol's stop criterion
as the evaluator reports it; the evaluator's stop is printed when the
protocol store records it. The demo ends with each candidate against
production (decision log), each candidate's off-policy estimate with its
interval and verdict (`understudy ope`'s numbers), and the next commands to
type, with the data directory filled in; the decision log stays in
``out/demo``.
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

from service.auth import token_digest
from service.cli.demo_cluster import cluster_lines
from service.cli.demo_noise import collapsed_noise, transitions_shown_by_demo
from service.cli.demo_payoff import NextCommands, demo_ope, drift_lines, print_next, print_ope
from service.cli.demo_protocol import OWNER, ProtocolWatch, describe_stop, load_protocol
from service.cli.demo_view import LiveView, closing_tables, mask_lines, summed
from service.client import MirrorClient
from service.contract import MirrorRequest, Outcome
from service.environment import World, load_scenario, log_episode
from service.pipeline.scorer import ScorerLoop
from service.pipeline.scorer_process import ProcessScorer
from service.protocols import ProtocolEvent
from service.server.app import Service, build_service
from service.settings import Settings
from service.storage import stop_embedded
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import contract_pb2, shadow_pb2_grpc

DEMO_SCENARIO = "demo"
"""service/environment/scenarios/demo.yaml: `train` with a fleet that is not saturated."""
EVALUATOR_INTERVAL_S = 1.0
"""The demo's evaluator looks once a second (the service's default is every 5 s)."""
REVIEWER_TOKEN_BYTES = 18


def simulated_runtime(
    episodes: int, seed: int, scenario: str = "train"
) -> list[MirrorRequest | Outcome]:
    """Every event the simulated Runtime sends, episode after episode, in time order."""
    world = World(load_scenario(scenario))
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
    episodes: int,
    duration_s: float,
    data_dir: str,
    console: Console,
    seed: int = 0,
    scenario: str = DEMO_SCENARIO,
) -> None:
    """Run the demo end to end and print what it found."""
    root = Path(data_dir)
    shutil.rmtree(root, ignore_errors=True)
    token, admin = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    reviewer = secrets.token_urlsafe(REVIEWER_TOKEN_BYTES)
    settings = Settings(
        data_dir=root,
        grpc_port=0,
        http_port=0,
        auth_tokens={
            token_digest(token): "runtime",
            token_digest(admin): f"admin:{OWNER}",
            token_digest(reviewer): "reviewer:rita",
        },
        evaluator_interval_s=EVALUATOR_INTERVAL_S,
    )
    with console.status(f"simulating Runtime's traffic ({scenario} scenario)"):
        events = simulated_runtime(episodes, seed, scenario)
    with collapsed_noise(console), console.status("starting the service, PostgreSQL, policies"):
        service = build_service(settings)
        service.start()
        service.wait_started()
    console.print(
        f"[bold]Understudy[/] gRPC 127.0.0.1:{service.grpc_port}, "
        f"HTTP 127.0.0.1:{service.http_port}, "
        f"data in {root}/; {len(events)} events to mirror over ~{duration_s:.0f}s"
    )
    console.print(_scoring_line(service), highlight=False)
    for line in cluster_lines(events):
        console.print(line, highlight=False)
    try:
        watch = ProtocolWatch(service, load_protocol())
        sha = watch.start(admin)
        console.print(
            f"started shadow protocol [bold]{watch.protocol_id}[/] v{watch.version} "
            f"(sha256 {sha[:12]}, locked):\n  {watch.candidate} vs production; the "
            "evaluator stops it if the candidate is confidently worse",
            highlight=False,
        )
        with transitions_shown_by_demo():
            _drive(service, token, events, duration_s, console, watch)
        _show_refusals(service, token, events, console)
        _close(service, watch, root, console, events, reviewer)
    finally:
        service.stop()
        if service.embedded_db is not None:
            stop_embedded(root / "postgres")


def _scoring_line(service: Service) -> str:
    """Where this service scores: a newcomer sees that ingest and scoring are apart."""
    placement = service.scorer_placement
    scorer = service.scorer
    handler = scorer.handler if isinstance(scorer, ScorerLoop) else None
    if isinstance(handler, ProcessScorer):
        return (
            f"scoring in scorer process {handler.child_pid} ({placement.reason}): the "
            "ingest process only validates, journals and acks, never waiting on scoring"
        )
    return f"scoring on a thread of the ingest process ({placement.reason})"


def _close(
    service: Service,
    watch: ProtocolWatch,
    root: Path,
    console: Console,
    events: list[MirrorRequest | Outcome],
    reviewer: str,
) -> None:
    """The closing tables, the estimates, the protocol's outcome and the next commands."""
    assert service.engine is not None
    accepted = summed(service, "understudy_ingest_total", kind="mirror", result="accepted")
    stopped = {}
    if watch.stop_event is not None:
        stopped[watch.document["candidate"]["policy"]] = (
            f"stopped by protocol {watch.protocol_id} ({watch.stop_event.criterion}), "
            "not scored after"
        )
    table, checks = closing_tables(service, accepted, stopped)
    console.print(table)
    for line in checks:
        console.print(line)
    mirrored = [e.request_id for e in events if isinstance(e, MirrorRequest)][:20]
    for line in mask_lines(f"http://127.0.0.1:{service.http_port}", reviewer, mirrored):
        console.print(line, highlight=False)
    with console.status("estimating every candidate off-policy (as `understudy ope`)"):
        report = demo_ope(service.engine)
    print_ope(console, report)
    with console.status("comparing the inputs with each policy's training data"):
        drift = drift_lines(service.engine, service.settings.policies_dir)
    for line in drift:
        console.print(line, highlight=False)
    if watch.stop_event is None:
        console.print(
            f"[yellow]{watch.criterion_line()}: not stopped within this traffic[/]",
            highlight=False,
        )
    else:
        console.print(
            f"protocol {watch.protocol_id}: {watch.stop_event.to_state.value} on "
            f"`{watch.stop_event.criterion}` (the stop above; its evidence is in the store)",
            highlight=False,
        )
    first = next(e for e in events if isinstance(e, MirrorRequest))
    print_next(
        console,
        NextCommands(
            data_dir=str(root),
            request_id=first.request_id,
            policy="gavel-scorer",
            protocol=watch.protocol_id,
            reviewer_token=reviewer,
        ),
    )


def _drive(
    service: Service,
    token: str,
    events: list[MirrorRequest | Outcome],
    duration_s: float,
    console: Console,
    watch: ProtocolWatch,
) -> None:
    view = LiveView(service, watch.criterion_line)
    client = MirrorClient(f"127.0.0.1:{service.grpc_port}", token)
    sent = 0
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        last = polled = 0.0

        def announce(event: ProtocolEvent) -> None:
            for line in describe_stop(event, watch.candidate):
                live.console.print(line, highlight=False)

        def look() -> None:
            nonlocal polled
            if time.monotonic() - polled > 1.0:
                polled = time.monotonic()
                if (event := watch.poll()) is not None:
                    announce(event)

        for i in _paced(events, duration_s):
            event = events[i]
            if isinstance(event, MirrorRequest):  # batched by the client (MirrorManyStream)
                client.mirror_request(event)
            else:
                client.report(event)
            sent = i + 1
            if time.monotonic() - last > 0.25:
                live.update(view.render(client.stats(), sent, len(events)))
                last = time.monotonic()
                look()
        client.flush(60)
        deadline = time.monotonic() + 120
        while service.journal.depth_records("scorer") > 0 and time.monotonic() < deadline:
            live.update(view.render(client.stats(), sent, len(events)))
            look()
            time.sleep(0.25)
        live.update(view.render(client.stats(), sent, len(events)))
        stuck = watch.settle(announce)  # the evaluator's last looks cover all the traffic
        if stuck is not None:
            live.console.print(f"[yellow]{stuck}[/]", highlight=False)
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
