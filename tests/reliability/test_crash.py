"""SIGKILL mid-load, restart: every acked request logged once; embedded PostgreSQL reused."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sqlalchemy import text

from service.contract import MirrorRequest
from service.storage import make_engine, running_pid, start_embedded, stop_embedded
from tests.reliability.load import LoadResult, steady_load
from tests.transport.test_crash_recovery import ServerProcess


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
        load = threading.Thread(
            target=lambda: results.append(
                steady_load(first.grpc_port, runtime_token, requests_sample, 60.0, 4.0, "a")
            )
        )
        load.start()
        time.sleep(2.0)
        first.kill()  # mid-load: some calls in flight fail, every ack before it must survive
        load.join(30)
        before = results[0]
        assert running_pid(data / "postgres") == db_pid, "the database outlives its SIGKILLed owner"

        second = ServerProcess(data, runtime_token, database_url=None)
        servers.append(second)
        assert running_pid(data / "postgres") == db_pid, "the restarted service reused it"
        after = steady_load(second.grpc_port, runtime_token, requests_sample, 60.0, 2.0, "b")
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
