"""Leadership with two real service processes on one PostgreSQL.

Two replicas (tests/evaluator/evaluating_server.py: the service plus the
evaluator, as a process each, like `ServerProcess` in
tests/transport/test_crash_recovery.py) share the session's embedded
database. A shadow protocol with a 6 s maximum duration runs; at 6 s its
verdict is "inconclusive". Then:

1. exactly one replica (A, started first) holds the lease and evaluates;
2. A decides the verdict and, just before applying it, is SIGSTOPped;
3. its lease expires (TTL 3 s); B takes over (generation + 1) and decides the
   same verdict;
4. while B waits a moment before applying, A is SIGCONTed and applies its
   verdict at the current sequence number: PostgreSQL fences it (its
   generation is stale); then B's verdict is recorded. No transition happens
   twice, and A applies none.
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

import pytest
from sqlalchemy import Engine

from service.protocols import ActorRole, Identity, ProtocolDesk, State
from service.storage import ProtocolStore, make_engine
from service.storage.evaluation_store import EvaluationStore
from tests.evaluator.conftest import protocol_doc

TTL_S = 3.0
INTERVAL_S = 0.2
ADMIN = Identity("alice", ActorRole.ADMIN)


class Replica:
    """One evaluating service process; stdout's first line says it is listening."""

    def __init__(self, root: Path, holder: str, database_url: str, pause_s: float) -> None:
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
            EVAL_MARKER=str(self.marker),
            EVAL_PAUSE_S=str(pause_s),
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
        assert json.loads(line)["event"] == "listening"

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


def _until(what: str, predicate: Callable[[], bool], timeout_s: float, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(step)


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

    a = Replica(tmp_path / "a", "replica-a", db_url, pause_s=1.0)
    replicas.append(a)
    _until(
        "A to lead",
        lambda: (g := store.lease("evaluator")) is not None and g.holder == "replica-a",
        15,
    )
    b = Replica(tmp_path / "b", "replica-b", db_url, pause_s=1.0)
    replicas.append(b)
    first = store.lease("evaluator")
    assert first is not None and first.holder == "replica-a"

    desk.start("lead", 1, ADMIN, "go", document=protocol_doc(id="lead", max_duration=6))
    _until("A's evaluations", lambda: len(store.history("lead", 1)) > 0, 10)
    assert {s.holder for s in store.history("lead", 1)} == {"replica-a"}  # one evaluates

    _until("A about to apply its verdict", a.marker.exists, 15, step=0.01)
    a.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    assert a.marker.read_text().split()[1:] == ["inconclusive", "max_duration"]

    _until("B to take over", lambda: store.lease("evaluator").holder == "replica-b", 10)  # type: ignore[union-attr]
    took_over_s = time.monotonic() - stopped_at
    second = store.lease("evaluator")
    assert second is not None and second.generation == first.generation + 1
    # B decided too and waits 1 s before applying: wake A now, so its stale verdict, at the
    # current sequence number, reaches PostgreSQL first.
    _until("B about to apply its verdict", b.marker.exists, 10, step=0.01)
    a.signal(signal.SIGCONT)
    _until("A's refusal in its log", lambda: "evaluator fenced" in a.log.read_text(), 10)
    _until("B's verdict", lambda: desk.records.find("lead", 1).state is State.INCONCLUSIVE, 10)  # type: ignore[union-attr]
    time.sleep(3 * INTERVAL_S)  # A's next ticks, as a follower

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
