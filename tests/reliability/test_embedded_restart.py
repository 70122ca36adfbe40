"""The embedded PostgreSQL's postmaster is SIGKILLed; the service brings it back.

Issue 20 item 9: nothing restarted the embedded server after its postmaster
died, so the journal grew until it shed. Here the service owns its embedded
server (no `database_url`). One backend is held stopped before the kill, so
it keeps the dead server's shared memory and the first restarts fail the way
they do when old backends linger ("pre-existing shared memory block is still
in use"): readiness says "restarting (attempt N)" meanwhile, failed attempts
are counted and backed off. Once it is let go, the next attempt brings the
server back; the restart is counted, db_up returns to 1, and every request
acked before, during and after is in the log exactly once (journal replay).
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from service.contract import MirrorRequest
from service.policies.baselines import LeastLoaded
from service.policies.registry import Registry
from service.server.app import Service
from service.storage import running_pid, stop_embedded
from service.storage.admin import EMBEDDED_SUBDIR
from service.transport.http.convert import mirror_to_json
from tests.reliability.pg_signals import children
from tests.transport.test_decision_log_e2e import wait_until

HANG_GUARD_S = 120.0
"""Bound on any one wait: a hang guard, never a speed requirement."""


@pytest.fixture()
def own_pg(pg_dir: Path) -> Iterator[Path]:
    """A data directory whose embedded server the service starts; stopped after the service.

    Requested before `make_service`, so it is torn down after the service stopped.
    """
    yield pg_dir
    stop_embedded(pg_dir / EMBEDDED_SUBDIR)


@pytest.mark.live
def test_a_killed_embedded_postmaster_is_restarted_and_nothing_is_lost(
    own_pg: Path,
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    service = make_service(
        database_url=None,
        data_dir=own_pg,
        policies=Registry(policies={"least-loaded": LeastLoaded()}, predictors={}),
        evaluator_enabled=False,
        chain_seal_interval_s=0,
    )
    assert service.embedded_db is not None and service.embedded_watch is not None
    data_dir = service.embedded_db.data_dir
    sample = requests_sample[0]
    value = service.metrics.registry.get_sample_value

    def restarts(result: str) -> float:
        return value("understudy_embedded_db_restarts_total", {"result": result}) or 0.0

    with httpx.Client(
        base_url=f"http://127.0.0.1:{service.http_port}",
        headers={"authorization": f"Bearer {runtime_token}"},
        timeout=HANG_GUARD_S,
    ) as http:
        acked: list[str] = []

        def mirror(tag: str, n: int) -> None:
            for i in range(n):
                request_id = f"{tag}-{i}"
                content = mirror_to_json(sample).replace(
                    sample.request_id.encode(), request_id.encode()
                )
                assert http.post("/v1/mirror", content=content).status_code == 202
                acked.append(request_id)

        def database_detail() -> str:
            checks = http.get("/readyz").json()["checks"]
            return str(next(c["detail"] for c in checks if c["name"] == "database"))

        mirror("before", 20)
        wait_until(lambda: service.journal.depth_records("scorer") == 0)
        wait_until(lambda: value("understudy_db_up") == 1.0, timeout=HANG_GUARD_S)
        postmaster = running_pid(data_dir)
        assert postmaster is not None
        held = children(postmaster)[0]  # any backend keeps the shared memory attached
        os.kill(held, signal.SIGSTOP)
        seen: set[str] = set()
        try:
            os.kill(postmaster, signal.SIGKILL)
            mirror("down", 20)  # acks go on into the journal

            def restarting_again() -> bool:
                seen.add(database_detail())
                return restarts("failed") >= 2 and any(
                    re.fullmatch(r"restarting \(attempt [2-9]\d*\)", d) for d in seen
                )

            wait_until(restarting_again, timeout=HANG_GUARD_S)
            assert value("understudy_db_up") == 0.0
            assert restarts("ok") == 0.0
            mirror("restarting", 20)
        finally:
            os.kill(held, signal.SIGCONT)  # it sees its postmaster gone and exits
        wait_until(lambda: restarts("ok") == 1.0, timeout=HANG_GUARD_S)
        wait_until(lambda: http.get("/readyz").status_code == 200, timeout=HANG_GUARD_S)
        assert value("understudy_db_up") == 1.0
        back = running_pid(data_dir)
        assert back is not None and back != postmaster
        mirror("after", 20)
        wait_until(lambda: service.journal.depth_records("scorer") == 0, timeout=HANG_GUARD_S)
    print(
        f"\n[embedded restart] postmaster {postmaster} killed, back as {back} after "
        f"{restarts('failed'):.0f} failed attempt(s); readiness said {sorted(seen)}"
    )
    assert service.engine is not None
    with service.engine.connect() as conn:
        ids = conn.execute(text("SELECT request_id FROM requests")).scalars().all()
    assert sorted(ids) == sorted(acked), "every acked request is in the log, once"
