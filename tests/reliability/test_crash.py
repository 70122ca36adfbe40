"""SIGKILL mid-load, restart: every acked request logged once; embedded PostgreSQL reused."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import text

from service.contract import MirrorRequest
from service.storage import make_engine, running_pid, start_embedded, stop_embedded
from tests.reliability.load import LoadResult, steady_load
from tests.transport.test_crash_recovery import ServerProcess

ACKS_BEFORE_KILL = 50
"""The kill comes only after this many acks, so the test always has acks to check."""
ACKS_AFTER_RESTART = 20
LOAD_BOUND_S = 120.0
"""Longest a load runs: a bound on the generator, far above what the acks need."""
HANG_GUARD_S = 120.0


def _when(n: int, event: threading.Event) -> Callable[[int], None]:
    """An `on_accepted` callback that sets `event` once `n` requests are accepted."""

    def check(accepted: int) -> None:
        if accepted >= n:
            event.set()

    return check


@pytest.mark.live
def test_sigkill_mid_load_with_the_embedded_database(
    pg_dir: Path, runtime_token: str, requests_sample: list[MirrorRequest]
) -> None:
    data = pg_dir  # a directory the embedded server's own user can reach
    servers: list[ServerProcess] = []
    try:
        first = ServerProcess(data, runtime_token, database_url=None)
        servers.append(first)
        db_pid = running_pid(data / "postgres")
        assert db_pid is not None
        results: list[LoadResult] = []
        enough = threading.Event()
        load = threading.Thread(
            target=lambda: results.append(
                steady_load(
                    first.grpc_port,
                    runtime_token,
                    requests_sample,
                    60.0,
                    LOAD_BOUND_S,
                    "a",
                    on_accepted=_when(ACKS_BEFORE_KILL, enough),
                )
            )
        )
        load.start()
        assert enough.wait(HANG_GUARD_S), f"fewer than {ACKS_BEFORE_KILL} acks (hang guard)"
        first.kill()  # mid-load: some calls in flight fail, every ack before it must survive
        load.join(HANG_GUARD_S)
        assert not load.is_alive(), "the load did not notice the server was gone"
        before = results[0]
        assert len(before.accepted) >= ACKS_BEFORE_KILL
        assert running_pid(data / "postgres") == db_pid, "the database outlives its SIGKILLed owner"

        second = ServerProcess(data, runtime_token, database_url=None)
        servers.append(second)
        assert running_pid(data / "postgres") == db_pid, "the restarted service reused it"
        stop = threading.Event()
        after = steady_load(
            second.grpc_port,
            runtime_token,
            requests_sample,
            60.0,
            LOAD_BOUND_S,
            "b",
            stop=stop,
            on_accepted=_when(ACKS_AFTER_RESTART, stop),
        )
        assert len(after.accepted) >= ACKS_AFTER_RESTART, after
        assert second.terminate() == 0
    finally:
        for s in servers:
            if s.proc.poll() is None:
                s.kill()
    server = start_embedded(data / "postgres", stop_at_exit=False)
    engine = make_engine(server.url())
    try:
        with engine.connect() as conn:
            ids = conn.execute(text("SELECT request_id FROM requests")).scalars().all()
    finally:
        engine.dispose()
        stop_embedded(data / "postgres")
    acked = before.accepted + after.accepted
    print(
        f"\n[crash] before kill: sent {before.sent}, acked {len(before.accepted)}; after restart: "
        f"sent {after.sent}, acked {len(after.accepted)}; logged {len(ids)}, "
        f"duplicates {len(ids) - len(set(ids))}"
    )
    assert len(ids) == len(set(ids)), "no duplicates"
    assert set(acked) <= set(ids), "every acked request is logged"
    assert set(ids) <= {f"a-{i}" for i in range(before.sent)} | set(after.accepted)
