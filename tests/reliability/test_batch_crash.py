"""SIGKILL mid-batch-stream, restart on the same journal and database: nothing acked lost
or doubled (issue 24, acceptance).

A real `understudy serve` process with the embedded PostgreSQL and its shipped
policies. A client streams 64-request batches (8 cluster snapshots each) on
MirrorManyStream, a few batches ahead of its acks; the server is SIGKILLed once
some batches were acked (asserted) and others were sent but not acked. A second
server on the same data directory takes the journal and the database; the
client resends every batch it holds no ack for, plus the last acked one (an ack
lost in the crash looks the same to a client). Then every request of every
acked batch, and every resent one, is logged exactly once, with a decision of
every registered policy, and nothing else is logged.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import text

from service.storage import make_engine, running_pid, start_embedded, stop_embedded
from tests.reliability.batch_load import HANG_GUARD_S, BatchStreamRun, shaped_batches
from tests.transport.test_crash_recovery import ServerProcess

N_BATCHES = 16
"""Batches the client has to send: 1,024 requests."""
ACKED_BEFORE_KILL = 4
"""The kill comes only after this many batches were acked, so there are acks to check."""
WINDOW = 4
"""Batches the client sends ahead of its acks: some are in flight at the kill."""


def _logged(url: str) -> tuple[list[str], dict[str, set[str]], set[str]]:
    """Request ids logged, each request's policies with a decision, registered policies."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ids = list(conn.execute(text("SELECT request_id FROM requests")).scalars())
            decided: dict[str, set[str]] = {}
            for request_id, policy in conn.execute(
                text("SELECT request_id, policy_name FROM decisions")
            ):
                decided.setdefault(request_id, set()).add(policy)
            n_decisions = conn.execute(text("SELECT count(*) FROM decisions")).scalar_one()
            policies = set(conn.execute(text("SELECT name FROM policies")).scalars())
    finally:
        engine.dispose()
    assert n_decisions == sum(len(p) for p in decided.values()), "one decision per policy"
    return ids, decided, policies


@pytest.mark.live
def test_sigkill_mid_batch_stream_loses_and_doubles_nothing(
    pg_dir: Path, runtime_token: str
) -> None:
    data = pg_dir  # a directory the embedded server's own user can reach
    batches = shaped_batches(N_BATCHES, "k")
    servers: list[ServerProcess] = []
    try:
        first = ServerProcess(data, runtime_token, database_url=None)
        servers.append(first)
        db_pid = running_pid(data / "postgres")
        assert db_pid is not None
        before = BatchStreamRun(first.grpc_port, runtime_token, batches, window=WINDOW).start()
        before.wait_for(lambda r: r.through >= ACKED_BEFORE_KILL or r.done, "the first acks")
        first.kill()  # mid-stream: batches in flight are lost to the client, acked ones not
        before.join()
        assert before.error is not None, "the stream saw the server go"
        acked = before.acked_sequences()
        assert len(acked) >= ACKED_BEFORE_KILL, before.acks
        assert not before.individual, before.individual  # every batch valid, none shed
        assert len(acked) < before.sent < N_BATCHES, "the kill came with batches in flight"
        assert running_pid(data / "postgres") == db_pid, "the database outlives its owner"

        second = ServerProcess(data, runtime_token, database_url=None)
        servers.append(second)
        resend = [b for s, b in enumerate(batches, start=1) if s not in acked]
        resend.insert(0, batches[acked[-1] - 1])  # its ack might as well have been lost
        after = BatchStreamRun(second.grpc_port, runtime_token, resend, window=WINDOW).start()
        after.wait_for(lambda r: r.done or r.through == len(resend), "the resent batches' acks")
        after.stop.set()
        after.join()
        assert after.through == len(resend) and not after.individual, after.acks
        assert after.acks[-1].stream_accepted == 64 * len(resend)

        expected = {i for b in batches for i in b.ids}
        url = start_embedded(data / "postgres", stop_at_exit=False).url()
        deadline = time.monotonic() + 4 * HANG_GUARD_S  # a hang guard, not a speed bound
        while True:  # the second server scores the journal's backlog and the resent ones
            ids, decided, policies = _logged(url)
            if len(ids) >= len(expected) and all(
                len(decided.get(i, ())) == len(policies) for i in ids
            ):
                break
            assert time.monotonic() < deadline, f"logged {len(ids)} of {len(expected)}"
            time.sleep(0.5)  # poll interval of a condition wait
        assert second.terminate() == 0
    finally:
        for s in servers:
            if s.proc.poll() is None:
                s.kill()
    try:
        ids, decided, policies = _logged(
            start_embedded(data / "postgres", stop_at_exit=False).url()
        )
    finally:
        stop_embedded(data / "postgres")
    print(
        f"\n[batch crash] before the kill: {before.sent} batches sent, {len(acked)} acked; "
        f"resent {len(resend)}; logged {len(ids)} requests (expected {len(expected)}), "
        f"duplicates {len(ids) - len(set(ids))}; policies {sorted(policies)}"
    )
    assert len(policies) >= 2, policies
    assert len(ids) == len(set(ids)), "no request logged twice"
    assert set(before.acked_ids()) <= set(ids), "every request of every acked batch is logged"
    assert set(ids) == expected, "the resent batches logged, nothing else"
    assert all(decided[i] == policies for i in ids), "each with every policy's decision"
