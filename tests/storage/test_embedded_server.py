"""The embedded server: outage and restart, and a crashed owner's server reused.

Each test runs its own server in a fresh temp directory (as root, pgserver
runs it as the ``pgserver`` user: the directory permissions are part of the test).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import text

from service.contract import MirrorRequest, Unavailable
from service.storage import (
    Counts,
    DecisionLogWriter,
    count_requests,
    create_database,
    database_healthy,
    make_engine,
    running_pid,
    start_embedded,
    stop_embedded,
    upgrade,
)
from tests.storage.storage_helpers import request_batch

pytestmark = pytest.mark.slow


def test_writer_reports_an_outage_and_recovers_after_restart(
    pg_dir: Path, requests_sample: list[MirrorRequest]
) -> None:
    data_dir = pg_dir
    server = start_embedded(data_dir, stop_at_exit=False)
    try:
        if os.geteuid() == 0:  # pgserver runs the server as its own user
            assert data_dir.stat().st_uid != 0
        url = create_database(server.url(), "log")
        upgrade(url)
        engine = make_engine(url)
        writer = DecisionLogWriter(engine)
        assert writer.write(request_batch(requests_sample[:3])).requests == Counts(3, 0)

        assert stop_embedded(data_dir) is True
        assert running_pid(data_dir) is None
        assert stop_embedded(data_dir) is False
        batch = request_batch(requests_sample[3:6])
        with pytest.raises(Unavailable, match="database unavailable while writing") as err:
            writer.write(batch)
        assert err.value.__cause__ is not None
        healthy, why = database_healthy(engine)
        assert not healthy and "database unavailable" in why

        restarted = start_embedded(data_dir, stop_at_exit=False)
        assert restarted.url() == server.url()
        assert restarted.pid != server.pid
        assert database_healthy(engine) == (True, "ok")
        # The same writer and engine carry on; the failed batch was not committed.
        assert writer.write(batch).requests == Counts(3, 0)
        assert count_requests(engine) == 6
        engine.dispose()
    finally:
        stop_embedded(data_dir)


_OWNER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from sqlalchemy import create_engine, text
    from service.storage import start_embedded
    server = start_embedded(Path(sys.argv[1]))
    engine = create_engine(server.url(), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("CREATE TABLE survivor (x int)"))
        conn.execute(text("INSERT INTO survivor VALUES (42)"))
    print(server.pid, flush=True)
    time.sleep(600)  # the owner idles until the test SIGKILLs it (a bound, not a wait)
    """
)


def test_a_killed_owner_leaves_its_server_to_the_next(pg_dir: Path) -> None:
    data_dir = pg_dir
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert owner.stdout is not None
        pid = int(owner.stdout.readline())
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        assert running_pid(data_dir) == pid  # the server outlived its owner

        reused = start_embedded(data_dir, stop_at_exit=False)
        assert reused.pid == pid
        handles = json.loads((data_dir / ".handle_pids.json").read_text())
        assert owner.pid not in handles  # the dead owner no longer blocks stop-at-exit
        engine = make_engine(reused.url())
        with engine.connect() as conn:
            assert conn.execute(text("SELECT x FROM survivor")).scalar() == 42
        engine.dispose()
    finally:
        if owner.poll() is None:
            owner.kill()
        owner.wait(10)
        if owner.stdout is not None:
            owner.stdout.close()
        stop_embedded(data_dir)
    assert running_pid(data_dir) is None
