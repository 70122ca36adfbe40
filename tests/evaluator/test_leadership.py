"""Leadership with two real service processes on one PostgreSQL.

Two replicas (tests/evaluator/evaluating_server.py: the service plus the
evaluator, as a process each, like `ServerProcess` in
tests/transport/test_crash_recovery.py) share the session's embedded
database. A shadow protocol with a 6 s maximum duration runs; at 6 s its
verdict is "inconclusive". Then:

1. exactly one replica (A, started first) holds the lease and evaluates;
2. A decides the verdict and, just before applying it, is SIGSTOPped;
3. its lease expires (TTL 10 s); B takes over (generation + 1) and decides
   the same verdict;
4. while B is held before applying, A is SIGCONTed and let go: it applies
   its verdict at the current sequence number and PostgreSQL fences it (its
   generation is stale); then B is let go and its verdict is recorded. No
   transition happens twice, and A applies none.

Each step waits on a condition (a lease row, a marker file, a log line, a
metric), and each replica applies only when the test lets it
(evaluating_server.py's go file), so the order holds on a loaded machine.
The waits' time limits are hang guards only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from service.auth import token_digest
from service.protocols import ActorRole, Identity, ProtocolDesk, State
from service.storage import ProtocolStore, make_engine
from service.storage.stores.evaluation import EvaluationStore
from tests.evaluator.conftest import protocol_doc

TTL_S = 10.0
"""Long enough that B, held before applying while A is woken and fenced, keeps its term."""
INTERVAL_S = 0.2
HANG_GUARD_S = 120.0
ADMIN = Identity("alice", ActorRole.ADMIN)
TOKEN = "leadership-reviewer-token"


class Replica:
    """One evaluating service process; stdout's first line says it is listening."""

    def __init__(self, root: Path, holder: str, database_url: str) -> None:
        root.mkdir(parents=True)
        (root / "policies").mkdir()
        self.marker = root / "marker"
        self.log = root / "stderr.log"
        env = dict(os.environ)
        env.update(
            UNDERSTUDY_DATABASE_URL=database_url,
            UNDERSTUDY_DATA_DIR=str(root / "data"),
            UNDERSTUDY_POLICIES_DIR=str(root / "policies"),  # baselines only: a quick start
            UNDERSTUDY_GRPC_PORT="0",
            UNDERSTUDY_HTTP_PORT="0",
            UNDERSTUDY_JOURNAL_FSYNC="never",
            UNDERSTUDY_EVALUATOR_ENABLED="false",
            UNDERSTUDY_AUTH_TOKENS=json.dumps({token_digest(TOKEN): "reviewer"}),
            EVAL_MARKER=str(self.marker),
            EVAL_INTERVAL_S=str(INTERVAL_S),
            EVAL_LEASE_TTL_S=str(TTL_S),
            EVAL_HOLDER=holder,
        )
        self._stderr = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.evaluator.evaluating_server"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{holder} exited with {self.proc.wait(5)}: {self.log.read_text()}")
        listening = json.loads(line)
        assert listening["event"] == "listening"
        self.http_port = int(listening["http_port"])

    def let_go(self) -> None:
        """Let the replica apply the verdict it holds (evaluating_server.py's go file)."""
        self.marker.with_name(self.marker.name + ".go").touch()

    def follower_ticks(self) -> float:
        """Its evaluator's ticks as a follower so far (its own /metrics)."""
        body = httpx.get(
            f"http://127.0.0.1:{self.http_port}/metrics",
            headers={"authorization": f"Bearer {TOKEN}"},
            timeout=30,
        ).text
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                if (sample.name, sample.labels.get("result")) == (
                    "understudy_evaluator_ticks_total",
                    "follower",
                ):
                    return float(sample.value)
        return 0.0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, signum: signal.Signals) -> None:
        os.kill(self.proc.pid, signum)

    def end(self) -> int:
        """SIGCONT (in case it is stopped), SIGTERM, wait; SIGKILL if it hangs."""
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()
        return self.proc.returncode


def _until(what: str, predicate: Callable[[], bool], step: float = 0.05) -> None:
    """Wait on `predicate`; the limit is a hang guard, not a speed requirement."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not predicate():
        assert time.monotonic() < deadline, f"still waiting for {what} (hang guard)"
        time.sleep(step)  # poll interval of a condition wait


@pytest.fixture()
def replicas(tmp_path: Path) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for replica in started:
        replica.end()


@pytest.fixture()
def engine(db_url: str) -> Iterator[Engine]:
    e = make_engine(db_url)
    yield e
    e.dispose()


@pytest.mark.slow
def test_one_leader_takeover_after_sigstop_and_a_fenced_wake_up(
    tmp_path: Path, db_url: str, engine: Engine, replicas: list[Replica]
) -> None:
    store = EvaluationStore(engine)
    desk = ProtocolDesk(ProtocolStore(engine), policies=lambda: None, logging=lambda: None)

    a = Replica(tmp_path / "a", "replica-a", db_url)
    replicas.append(a)
    _until(
        "A to lead",
        lambda: (g := store.lease("evaluator")) is not None and g.holder == "replica-a",
    )
    b = Replica(tmp_path / "b", "replica-b", db_url)
    replicas.append(b)
    first = store.lease("evaluator")
    assert first is not None and first.holder == "replica-a"

    desk.start("lead", 1, ADMIN, "go", document=protocol_doc(id="lead", max_duration=6))
    _until("A's evaluations", lambda: len(store.history("lead", 1)) > 0)
    assert {s.holder for s in store.history("lead", 1)} == {"replica-a"}  # one evaluates

    _until("A about to apply its verdict", a.marker.exists, step=0.01)
    a.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    assert a.marker.read_text().split()[1:] == ["inconclusive", "max_duration"]

    _until("B to take over", lambda: store.lease("evaluator").holder == "replica-b")  # type: ignore[union-attr]
    took_over_s = time.monotonic() - stopped_at
    second = store.lease("evaluator")
    assert second is not None and second.generation == first.generation + 1
    # B decided too and is held before applying: wake A and let it go first, so its stale
    # verdict, at the current sequence number, reaches PostgreSQL first.
    _until("B about to apply its verdict", b.marker.exists, step=0.01)
    a.signal(signal.SIGCONT)
    a.let_go()
    _until("A's refusal in its log", lambda: "evaluator fenced" in a.log.read_text())
    b.let_go()
    _until("B's verdict", lambda: desk.records.find("lead", 1).state is State.INCONCLUSIVE)  # type: ignore[union-attr]
    ticks = a.follower_ticks()
    _until("A's next ticks, as a follower", lambda: a.follower_ticks() >= ticks + 3)

    events = desk.records.events("lead", 1)
    verdicts = [e for e in events if e.actor_role == "system"]
    assert [(e.action.value, e.criterion) for e in verdicts] == [("inconclusive", "max_duration")]
    assert verdicts[0].evidence["lease"] == {"holder": "replica-b", "generation": second.generation}
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    history = store.history("lead", 1)
    assert {s.holder for s in history if s.generation == second.generation} == {"replica-b"}
    assert all(s.holder == "replica-a" for s in history if s.generation == first.generation)
    lease = store.lease("evaluator")
    assert lease is not None and lease.holder == "replica-b"
    last_a = max(s.evaluated_at for s in history if s.holder == "replica-a")
    assert last_a <= min(s.evaluated_at for s in history if s.holder == "replica-b")
    print(
        f"\n[evaluator] leadership: A (generation {first.generation}) SIGSTOPped before applying;"
        f" B took over after {took_over_s:.1f} s (TTL {TTL_S:.0f} s, generation"
        f" {second.generation}) and applied the one verdict; A after SIGCONT was fenced"
    )
    assert a.end() == 0 and b.end() == 0
