"""A real Prometheus scrapes two running replicas through one bad day; every panel has series.

Replica A runs the committed policies (ONNX and baselines), a harmful candidate
under a shadow protocol (the setup of tests/evaluator/test_end_to_end.py) and
two failing policies (one raises, one returns NaN: both quarantined), logs to
its own embedded PostgreSQL and joins outcomes. The simulated Runtime mirrors
through the client until the evaluator stops the experiment; then A's
database is stopped while traffic continues (a database outage episode:
`understudy_db_up` drops, write batches fail, `UnderstudyDatabaseDown` goes
pending) and started again (everything journaled during the outage reaches
the log). Replica B journals without scoring into a tiny journal, so it sheds.
Both see rejected input and a wrong token.

Prometheus (Debian package, loopback, 1 s scrapes, the committed rules)
scrapes both with a bearer-token file; then every panel's PromQL runs with its
variables expanded from the label values Prometheus holds and Grafana's
interval macros filled in, and fails if any returns no series. Panels whose
series exist only after a rare event (a dead letter, an online experiment's
rollback) are listed as skipped with the reason; for those the test checks
that Prometheus knows the metric from the targets' metadata, never that it has
series.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from sqlalchemy import text

from service.auth import token_digest
from service.contract import MirrorRequest
from service.policies.base import Policy
from service.policies.registry import load_registry
from service.server.app import Service
from service.storage import start_embedded, stop_embedded, upgrade
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import contract_pb2, shadow_pb2, shadow_pb2_grpc
from tests.evaluator.harmful import NAME, SlowestThroughput
from tests.evaluator.test_end_to_end import (
    ADMIN_TOKEN,
    DOC,
    EPISODES,
    PROTOCOL,
    log_summary,
    runtime_events,
    send_in_steps,
)
from tests.live_traffic import generous
from tests.observability.dashboards import (
    PROMETHEUS_DIR,
    REPO,
    Variable,
    load,
    queries,
    substitute_macros,
    variables,
)
from tests.reliability.test_quarantine import NaNPolicy, RaisingPolicy
from tests.transport.test_decision_log_e2e import mirror_all, wait_until

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus missing: install the Debian package `prometheus`"
)

# (dashboard, panel) -> why it has no series in this test.
NOT_EXERCISED = {
    ("oncall.json", "Dead letters"): "series born at the first dead letter",
    ("experiments.json", "Rollback signalled"): "a shadow experiment never signals rollback",
}
RATE_INTERVAL, INTERVAL = "30s", "5s"
_METRIC = re.compile(r"\bunderstudy_[a-z_]+\b")


@dataclass
class Prom:
    """A Prometheus server's HTTP API on loopback."""

    http: httpx.Client

    def query(self, expr: str) -> list[dict[str, object]]:
        body = self.http.get("/api/v1/query", params={"query": expr}).json()
        assert body["status"] == "success", f"{expr}: {body}"
        result: list[dict[str, object]] = body["data"]["result"]
        return result

    def label_values(self, variable: Variable) -> list[str]:
        body = self.http.get("/api/v1/series", params={"match[]": variable.metric}).json()
        return sorted({s[variable.label] for s in body["data"] if variable.label in s})

    def known_metrics(self) -> set[str]:
        body = self.http.get("/api/v1/targets/metadata", params={"limit": "10000"}).json()
        return {m["metric"] for m in body["data"]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture()
def start_prometheus(tmp_path: Path) -> Iterator[Callable[[list[str]], Prom]]:
    procs: list[subprocess.Popen[bytes]] = []
    clients: list[httpx.Client] = []

    def start(targets: list[str]) -> Prom:
        assert PROMETHEUS is not None
        token = tmp_path / "prom-token"
        token.write_text("r-tok\n")  # the reviewer token tests/conftest.py registers
        config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
        config["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [str(PROMETHEUS_DIR / "rules.yml")]
        (job,) = config["scrape_configs"]
        job["authorization"]["credentials_file"] = str(token)
        job["static_configs"] = [{"targets": targets}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = _free_port()
        log = (tmp_path / "prometheus.log").open("wb")
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        procs.append(proc)
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        clients.append(client)

        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                return client.get("/-/ready").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready)
        return Prom(client)

    yield start
    for client in clients:
        client.close()
    for proc in procs:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def _reject_and_shed(service: Service, token: str, requests: list[MirrorRequest]) -> int:
    """Unary mirrors, every fifth with a NaN; returns how many were shed."""
    auth = (("authorization", f"Bearer {token}"),)
    shed = 0
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = shadow_pb2_grpc.ShadowEvaluationStub(channel)  # type: ignore[no-untyped-call]
        for round_ in range(3):
            for i, r in enumerate(requests):
                msg = mirror_request_to_pb(r)
                msg.request_id = f"shed{round_}-{i}"
                if i % 5 == 4:
                    msg.state.cpu_free[0] = float("nan")
                try:
                    ack = stub.Mirror(msg, metadata=auth)
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
                    continue
                shed += ack.status == shadow_pb2.ACK_STATUS_SHED
    return shed


def _report_outcomes(service: Service, token: str, ids: list[str], request_time: float) -> None:
    """Outcomes for mirrored requests (joined) and one for a request never seen (parked)."""
    auth = (("authorization", f"Bearer {token}"),)
    with grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = shadow_pb2_grpc.ShadowEvaluationStub(channel)  # type: ignore[no-untyped-call]
        for k, request_id in enumerate([*ids, "never-mirrored"]):
            outcome = contract_pb2.Outcome(
                request_id=request_id,
                observed_at=request_time + 600.0 * (k + 1),
                completion_time_s=100.0,
                failure=contract_pb2.FAILURE_KIND_NONE,
            )
            stub.ReportOutcome(outcome, metadata=auth)


def _expand(expr: str, values: dict[str, list[str]]) -> str:
    """`$var` -> Grafana's multi-value "All": a regex alternation of the values.

    Like Grafana, each value is regex-escaped, then backslashes doubled for the
    PromQL string literal.
    """
    for name, vals in values.items():
        alternation = "|".join(re.escape(v).replace("\\", "\\\\") for v in vals)
        expr = expr.replace(f"${name}", f"({alternation})")
    return substitute_macros(expr, RATE_INTERVAL, INTERVAL)


def _run_panels(
    prom: Prom, dashboards: Sequence[str], skip: Mapping[tuple[str, str], str]
) -> list[str]:
    """Run every panel query of `dashboards` but `skip`; fail on any without series.

    A skipped panel's metrics must still be known to Prometheus from the targets'
    metadata (exported, just without series yet). Returns the exercised panels.
    """
    exercised: list[str] = []
    empty: list[str] = []
    known = prom.known_metrics()
    for name in dashboards:
        values = {v.name: prom.label_values(v) for v in variables(load(name))}
        for query in queries(name):
            if (name, query.panel) in skip:
                unseen = {
                    m
                    for m in _METRIC.findall(query.expr)
                    if m not in known and re.sub(r"_(total|bucket|count|sum)$", "", m) not in known
                }
                assert not unseen, f"{query.panel}: Prometheus never saw {unseen}"
                continue
            missing = [v for v in query.variables if not values[v]]
            assert not missing, f"{name} / {query.panel}: no values for {missing}"
            if prom.query(_expand(query.expr, values)):
                exercised.append(f"{name} / {query.panel}")
            else:
                empty.append(f"{name} / {query.panel}: {query.expr}")
    assert not empty, "queries with no series:\n" + "\n".join(empty)
    return exercised


def _alerts(prom: Prom, name: str) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = prom.http.get("/api/v1/alerts").json()["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == name]


def test_every_dashboard_query_returns_series_through_failures_a_stop_and_an_outage(
    make_service: Callable[..., Service],
    start_prometheus: Callable[[list[str]], Prom],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    pg_dir: Path,
    tmp_path: Path,
) -> None:
    server = start_embedded(pg_dir, stop_at_exit=False)
    try:
        upgrade(server.url())
        _bad_day(
            make_service,
            start_prometheus,
            runtime_token,
            requests_sample,
            pg_dir,
            server.url(),
            tmp_path,
        )
    finally:
        stop_embedded(pg_dir)


def _two_more_scrapes(prom: Prom) -> None:
    """Until Prometheus has scraped every target twice more (waits on it, not on a time)."""
    seen: dict[str, set[str]] = {}

    def scraped() -> bool:
        for t in prom.http.get("/api/v1/targets").json()["data"]["activeTargets"]:
            seen.setdefault(t["scrapeUrl"], set()).add(t["lastScrape"])
        return bool(seen) and all(len(times) >= 3 for times in seen.values())

    wait_until(scraped)


def _bad_day(
    make_service: Callable[..., Service],
    start_prometheus: Callable[[list[str]], Prom],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    pg_dir: Path,
    database_url: str,
    data_root: Path,
) -> None:
    loaded = load_registry(REPO / "policies")
    policies: dict[str, Policy] = {
        **loaded.policies,
        NAME: SlowestThroughput(loaded.predictors["gavel-throughput"]),
        "raising-policy": RaisingPolicy(),
        "nan-policy": NaNPolicy(),
    }
    scoring = make_service(
        policies=replace(loaded, policies=policies, manifests=generous(loaded.manifests)),
        database_url=database_url,
        data_dir=data_root / "a",
        # A loaded machine must not time out (and quarantine) a policy: only the two
        # broken ones below may be quarantined. The ONNX policies' manifests set their
        # own budgets, which `generous` raises for the same reason.
        policy_time_budget_ms=60_000.0,
        quarantine_failures=2,
        quarantine_window_s=60.0,
        quarantine_cooldown_s=600.0,
        evaluator_interval_s=0.5,
        # As in the evaluator's end-to-end test: a first tick over ~1,800 joined rounds
        # on a loaded machine must not outlive its lease (a lost lease restarts the
        # experiment's statistics, and a tick as slow again loses it again).
        evaluator_lease_ttl_s=120.0,
        auth_tokens={
            token_digest(runtime_token): "runtime",
            token_digest(ADMIN_TOKEN): "admin:alice",
            token_digest("r-tok"): "reviewer:rita",
        },
    )
    shedding = make_service(
        data_dir=data_root / "b",
        scoring_enabled=False,
        journal_max_bytes=40_000,
        journal_segment_bytes=8192,
    )
    prom = start_prometheus([f"127.0.0.1:{scoring.http_port}", f"127.0.0.1:{shedding.http_port}"])
    started = time.monotonic()
    a_instance = f"127.0.0.1:{scoring.http_port}"

    response = httpx.post(
        f"http://{a_instance}/v1/protocols/{PROTOCOL}/versions/1/start",
        json={"reason": "observability check", "document": DOC},
        headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    # In parts, waiting on the evaluator between them, as the evaluator's end-to-end
    # test does (`send_in_steps`): the stop does not depend on how the box keeps up.
    sent = send_in_steps(scoring, runtime_token, runtime_events(EPISODES))
    ids = mirror_all(scoring, runtime_token, requests_sample[:4], "obs")
    _report_outcomes(scoring, runtime_token, ids[:4], requests_sample[0].request_time)
    assert _reject_and_shed(shedding, runtime_token, requests_sample) > 0
    _reject_and_shed(scoring, runtime_token, requests_sample[:10])
    for service in (scoring, shedding):
        with httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}") as http:
            assert (
                http.get("/metrics", headers={"authorization": "Bearer wrong"}).status_code == 401
            )

    def scraped_after_traffic() -> bool:
        quarantined = prom.query('understudy_policy_quarantined{policy="raising-policy"} == 1')
        shed = prom.query('understudy_ingest_total{result="shed"} > 0')
        fails = prom.query("understudy_auth_failures_total > 0")
        stopped = prom.query('understudy_experiment_transitions_total{action="stop"}')
        seen.update(
            quarantined=bool(quarantined), shed=bool(shed), auth=len(fails), stopped=bool(stopped)
        )
        return bool(quarantined and shed and len(fails) == 2 and stopped)

    seen: dict[str, object] = {}
    try:
        wait_until(scraped_after_traffic)  # a hang guard: the evaluator on a loaded box
    except AssertionError as exc:
        raise AssertionError(
            f"after traffic, Prometheus saw {seen}; the log: {log_summary(scoring, sent)}"
        ) from exc
    assert scoring.engine is not None
    _two_more_scrapes(prom)  # so every rate window holds a change
    # The experiment panels now, while the leader still exports the stopped
    # experiment's criteria: a leader that loses its lease in the outage below
    # clears them, and a stopped experiment is not evaluated again.
    exercised = _run_panels(prom, ["experiments.json"], NOT_EXERCISED)

    # The outage: A's database goes away while Runtime keeps mirroring.
    assert stop_embedded(pg_dir)
    during = mirror_all(scoring, runtime_token, requests_sample[:3], "outage")

    def outage_seen() -> bool:
        down = prom.query(f'understudy_db_up{{instance="{a_instance}"}} == 0')
        failed = prom.query(
            f'understudy_db_write_batches_total{{instance="{a_instance}", result="error"}} > 0'
        )
        pending = [a for a in _alerts(prom, "UnderstudyDatabaseDown") if a["state"] == "pending"]
        return bool(down and failed and pending)

    wait_until(outage_seen)
    start_embedded(pg_dir, stop_at_exit=False)

    def recovered() -> bool:
        up = prom.query(f'understudy_db_up{{instance="{a_instance}"}} == 1')
        return bool(up) and scoring.journal.depth_records("scorer") == 0

    wait_until(recovered)
    with scoring.engine.connect() as conn:
        logged = set(
            conn.execute(
                text("SELECT request_id FROM requests WHERE request_id LIKE 'outage-%'")
            ).scalars()
        )
    assert logged == set(during), "everything acked during the outage reached the log"
    _two_more_scrapes(prom)  # so every rate window holds a change

    targets = prom.http.get("/api/v1/targets").json()["data"]["activeTargets"]
    assert sorted(t["health"] for t in targets) == ["up", "up"], targets
    exercised += _run_panels(prom, ["oncall.json"], NOT_EXERCISED)

    quarantined = {a["labels"]["policy"] for a in _alerts(prom, "UnderstudyPolicyQuarantined")}
    assert quarantined == {"raising-policy", "nan-policy"}
    wait_until(
        lambda: any(
            a["labels"]["experiment"] == f"{PROTOCOL}@1" and a["state"] == "firing"
            for a in _alerts(prom, "UnderstudyExperimentStopped")
        ),
    )
    rules = prom.http.get("/api/v1/rules").json()["data"]["groups"]
    assert all(r["health"] == "ok" for g in rules for r in g["rules"]), rules
    elapsed = time.monotonic() - started
    print(f"\n{len(exercised)} panel queries returned series in {elapsed:.1f} s:")
    print("\n".join(f"  {p}" for p in exercised))
    print("not exercised: " + "; ".join(f"{p} ({why})" for (_, p), why in NOT_EXERCISED.items()))
