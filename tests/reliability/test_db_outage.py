"""PostgreSQL stopped under steady load, then restarted: nothing acked is lost or doubled."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from service.contract import MirrorRequest
from service.policies.baselines import LeastLoaded
from service.policies.registry import Registry
from service.server.app import Service
from service.storage import count_requests, start_embedded, stop_embedded, upgrade
from service.wire.convert import mirror_request_to_pb
from tests.reliability.load import LoadResult, rss_mb, steady_load
from tests.transport.test_decision_log_e2e import wait_until

ACKS_AROUND = 50
"""Acks the load must have had before the outage, and again after the restart."""
LOAD_SLACK_S = 300.0
"""The load's bound beyond the outage; the test stops it earlier, once the acks are in."""
RATE = 40.0
"""Mirrored requests per second of the steady load."""
RESTART_SLACK_S = 60.0
"""Seconds of load beyond the outage the journal must hold: the embedded server's restart
and the scorer's catch-up (a few seconds idle, tens under a CPU hog)."""
JOURNAL_OVERHEAD_B = 64
"""Bytes a journal record adds to its payload (header and checksum), rounded up."""


@pytest.mark.live
@pytest.mark.parametrize(
    "outage_s", [pytest.param(10.0, id="10s"), pytest.param(30.0, id="30s", marks=pytest.mark.slow)]
)
def test_database_outage_under_steady_load(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    pg_dir: Path,
    outage_s: float,
) -> None:
    server = start_embedded(pg_dir, stop_at_exit=False)
    try:
        upgrade(server.url())
        # The journal must hold the whole outage plus the restart and the catch-up, which
        # take seconds more on a busy box: the bound is sized from the traffic (record
        # size x rate x (outage + RESTART_SLACK_S)), not a constant that fit an idle one.
        record = max(len(mirror_request_to_pb(r).SerializeToString()) for r in requests_sample)
        bound = int((record + JOURNAL_OVERHEAD_B) * RATE * (outage_s + RESTART_SLACK_S))
        service = make_service(
            database_url=server.url(),
            policies=Registry(policies={"least-loaded": LeastLoaded()}, predictors={}),
            journal_max_bytes=bound,
        )
        assert service.engine is not None and service.scorer is not None
        results: list[LoadResult] = []
        stop = threading.Event()
        acked = [0]  # the load's accepted count, as it goes

        def count(n: int) -> None:
            acked[0] = n

        load = threading.Thread(
            target=lambda: results.append(
                steady_load(
                    service.grpc_port,
                    runtime_token,
                    requests_sample,
                    40.0,
                    outage_s + LOAD_SLACK_S,
                    "load",
                    stop=stop,
                    on_accepted=count,
                )
            )
        )
        load.start()
        engine = service.engine
        # Rows present before the outage: the log had taken traffic when the database went.
        wait_until(lambda: acked[0] >= ACKS_AROUND and count_requests(engine) > 0)
        assert stop_embedded(pg_dir)
        down_at = time.monotonic()
        wait_until(lambda: not service.scorer.sink_healthy)  # type: ignore[union-attr]
        acked_at_down = acked[0]
        ready = httpx.get(f"http://127.0.0.1:{service.http_port}/readyz")
        assert ready.status_code == 503
        assert "database" in {c["name"] for c in ready.json()["checks"] if not c["ok"]}
        # The outage's length is the scenario under test, not a synchronisation.
        time.sleep(max(0.0, outage_s - (time.monotonic() - down_at)))
        depth_at_restart = service.journal.depth_records("scorer")
        bytes_at_restart = service.journal.depth_bytes
        acked_during = acked[0] - acked_at_down
        start_embedded(pg_dir, stop_at_exit=False)
        up_at = time.monotonic()
        after_restart = acked[0]
        wait_until(lambda: acked[0] >= after_restart + ACKS_AROUND)  # acks go on after it
        stop.set()
        load.join(120)
        assert not load.is_alive()
        result = results[0]
        wait_until(lambda: service.journal.depth_records("scorer") == 0)
        with service.engine.connect() as conn:
            ids = conn.execute(text("SELECT request_id FROM requests")).scalars().all()
        duplicates = len(ids) - len(set(ids))
        print(
            f"\n[outage {outage_s:.0f}s] sent {result.sent}, acked {len(result.accepted)}, "
            f"shed {result.shed}, logged {len(ids)}, duplicates {duplicates}; journal grew to "
            f"{depth_at_restart} records / {bytes_at_restart} B (bound {bound}); "
            f"ack p99 during the outage {result.p99_ms(down_at, up_at):.2f} ms vs "
            f"{result.p99_ms(until=down_at):.2f} ms before it; peak RSS {rss_mb('VmHWM'):.0f} MB"
        )
        assert result.shed == 0 and result.rejected == 0
        assert len(result.accepted) == result.sent, "acks continued through the outage"
        assert acked_during > 0, "the outage saw acks"
        assert depth_at_restart >= acked_during, "the journal absorbed the outage"
        assert bytes_at_restart <= bound
        assert duplicates == 0
        assert sorted(ids) == sorted(result.accepted)
        assert httpx.get(f"http://127.0.0.1:{service.http_port}/readyz").status_code == 200
    finally:
        stop_embedded(pg_dir)
