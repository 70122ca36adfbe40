"""PostgreSQL stopped under batch traffic, then restarted: acks go on (journal before
ack), and everything acked is logged once it is back, exactly once (issue 24, acceptance).

As tests/reliability/test_db_outage.py, with a MirrorManyStream of 64-request
batches (8 snapshots each) in place of single requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from service.policies.baselines import LeastLoaded
from service.policies.registry import Registry
from service.server.app import Service
from service.storage import count_requests, start_embedded, stop_embedded, upgrade
from tests.reliability.batch_load import BatchStreamRun, shaped_batches
from tests.transport.test_decision_log_e2e import wait_until

N_BATCHES = 100
"""The most batches the stream may send (a bound: the test stops it once the acks are in)."""
ACKED_AROUND = 5
"""Batches acked before the outage, and again after the restart."""
PACE_S = 0.25
"""Seconds between two batch sends: 256 requests/s."""
OUTAGE_S = 10.0


@pytest.mark.live
def test_database_outage_under_batch_traffic(
    make_service: Callable[..., Service], runtime_token: str, pg_dir: Path
) -> None:
    batches = shaped_batches(N_BATCHES, "out")
    server = start_embedded(pg_dir, stop_at_exit=False)
    try:
        upgrade(server.url())
        service = make_service(
            database_url=server.url(),
            policies=Registry(policies={"least-loaded": LeastLoaded()}, predictors={}),
        )
        assert service.engine is not None and service.scorer is not None
        engine = service.engine
        run = BatchStreamRun(
            service.grpc_port, runtime_token, batches, window=4, pace_s=PACE_S
        ).start()
        # Rows present before the outage: the log had taken batches when the database went.
        run.wait_for(lambda r: r.through >= ACKED_AROUND, "acks before the outage")
        wait_until(lambda: count_requests(engine) > 0)
        assert stop_embedded(pg_dir)
        down_at = time.monotonic()
        wait_until(lambda: not service.scorer.sink_healthy)  # type: ignore[union-attr]
        acked_at_down = run.through
        ready = httpx.get(f"http://127.0.0.1:{service.http_port}/readyz")
        assert ready.status_code == 503
        # The outage's length is the scenario under test, not a synchronisation.
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        acked_during = run.through - acked_at_down
        depth_at_restart = service.journal.depth_records("scorer")
        start_embedded(pg_dir, stop_at_exit=False)
        after_restart = run.through
        run.wait_for(lambda r: r.through >= after_restart + ACKED_AROUND, "acks after it")
        run.stop.set()
        run.join()
        assert run.error is None, run.error
        wait_until(lambda: service.journal.depth_records("scorer") == 0)
        with engine.connect() as conn:
            ids = list(conn.execute(text("SELECT request_id FROM requests")).scalars())
        acked = run.acked_ids()
        print(
            f"\n[batch outage {OUTAGE_S:.0f}s] batches sent {run.sent}, acked {run.through} "
            f"({len(acked)} requests), {acked_during} acked during the outage; journal held "
            f"{depth_at_restart} records at the restart; logged {len(ids)}, "
            f"duplicates {len(ids) - len(set(ids))}"
        )
        assert not run.individual, run.individual  # nothing shed or rejected
        assert run.through == run.sent, "every batch sent was acked"
        assert acked_during > 0, "acks continued through the outage"
        assert depth_at_restart >= acked_during, (
            "the journal absorbed the outage (a record a batch)"
        )
        assert len(ids) == len(set(ids)), "nothing logged twice"
        assert sorted(ids) == sorted(acked), "everything acked is logged, nothing else"
        assert run.acks[-1].stream_accepted == len(acked) == 64 * run.sent
        assert httpx.get(f"http://127.0.0.1:{service.http_port}/readyz").status_code == 200
    finally:
        stop_embedded(pg_dir)
