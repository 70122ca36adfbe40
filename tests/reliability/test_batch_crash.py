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

from service.client import MirrorClient
from service.pipeline import batch_record
from service.pipeline.journal_format import RecordKind, read_all
from service.storage import make_engine, running_pid, start_embedded, stop_embedded
from service.wire.convert import mirror_request_to_pb
from tests.reliability.batch_load import (
    BATCH_SIZE,
    HANG_GUARD_S,
    BatchStreamRun,
    batch_requests,
    shaped_batches,
)
from tests.transport.test_crash_recovery import ServerProcess

N_BATCHES = 16
"""Batches the client has to send: 1,024 requests."""
ACKED_BEFORE_KILL = 4
"""The kill comes only after this many batches were acked, so there are acks to check."""
WINDOW = 4
"""Batches the client sends ahead of its acks: some are in flight at the kill."""


def _wait_logged(url: str, expected: set[str]) -> None:
    """Until at least `expected`'s count is logged, each with every policy's decision."""
    deadline = time.monotonic() + 4 * HANG_GUARD_S  # a hang guard, not a speed bound
    while True:
        ids, decided, policies = _logged(url)
        if len(ids) >= len(expected) and all(len(decided.get(i, ())) == len(policies) for i in ids):
            return
        assert time.monotonic() < deadline, f"logged {len(ids)} of {len(expected)}"
        time.sleep(0.5)  # poll interval of a condition wait


def _journaled(data: Path) -> list[str]:
    """Request ids in the journal's batch records (read offline, consumed ones too)."""
    ids: list[str] = []
    for record in read_all(data / "journal"):
        assert record.kind == RecordKind.MIRROR_BATCH, record.kind
        ids += batch_record.request_ids_of(batch_record.unpack(record.payload))
    return ids


def _logged(url: str) -> tuple[list[str], dict[str, set[str]], set[str]]:
    """Request ids logged, each request's policies with a decision, registered policies."""
    engine = make_engine(url)
    try:
        # one snapshot for every statement: the server may be writing meanwhile
        with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
            ids = list(conn.execute(text("SELECT request_id FROM requests")).scalars())
            decided: dict[str, set[str]] = {}
            for request_id, policy, n in conn.execute(
                text(
                    "SELECT request_id, policy_name, count(*) FROM decisions"
                    " GROUP BY request_id, policy_name"
                )
            ):
                assert n == 1, f"{request_id} has {n} decisions of {policy}"
                decided.setdefault(request_id, set()).add(policy)
            policies = set(conn.execute(text("SELECT name FROM policies")).scalars())
    finally:
        engine.dispose()
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
        # the second server scores the journal's backlog and the resent batches
        _wait_logged(start_embedded(data / "postgres", stop_at_exit=False).url(), expected)
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
    journaled = _journaled(data)
    assert sorted(journaled) == sorted(expected), (
        "journaled once each: a resent batch the journal already held is a duplicate"
    )


@pytest.mark.live
def test_the_client_library_resends_its_batches_across_a_sigkill(
    pg_dir: Path, runtime_token: str
) -> None:
    """The same through `MirrorClient` (batching lanes, 64 requests a batch): the server is
    SIGKILLed with batches acked and others in flight, restarted on the same port; the
    client reconnects and resends what it holds no ack for. Every request offered is
    acked and logged once with every policy's decision; the client dropped nothing."""
    data = pg_dir
    requests = batch_requests(N_BATCHES, "lib")
    servers: list[ServerProcess] = []
    client: MirrorClient | None = None
    try:
        first = ServerProcess(data, runtime_token, database_url=None)
        servers.append(first)
        port = first.grpc_port
        client = MirrorClient(
            f"127.0.0.1:{port}",
            runtime_token,
            max_batch_requests=BATCH_SIZE,
            backoff_max_s=0.2,
        )
        for request in requests:
            assert client.mirror(mirror_request_to_pb(request))
        deadline = time.monotonic() + HANG_GUARD_S  # a hang guard
        while client.stats().mirrors.accepted < ACKED_BEFORE_KILL * BATCH_SIZE:
            assert time.monotonic() < deadline, client.stats()
            time.sleep(0.01)  # poll interval of a condition wait
        first.kill()
        at_kill = client.stats()
        assert at_kill.mirrors.accepted >= ACKED_BEFORE_KILL * BATCH_SIZE, at_kill
        assert at_kill.mirrors.accepted < len(requests), "the kill came mid-traffic"
        second = ServerProcess(data, runtime_token, database_url=None, grpc_port=port)
        servers.append(second)
        assert client.flush(2 * HANG_GUARD_S), client.stats()
        stats = client.close()
        client = None
        expected = {r.request_id for r in requests}
        _wait_logged(start_embedded(data / "postgres", stop_at_exit=False).url(), expected)
        assert second.terminate() == 0
    finally:
        if client is not None:
            client.close(1.0)
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
        f"\n[client crash] acked at the kill {at_kill.mirrors.accepted} of {len(requests)}; "
        f"after: accepted {stats.mirrors.accepted}, resent {stats.mirrors.resent}, dropped "
        f"{stats.mirrors.dropped}, reconnects {stats.reconnects}; batches "
        f"{stats.mirror_batches.batches_sent}; logged {len(ids)}"
    )
    assert stats.mirrors.dropped == 0 and stats.mirrors.shed == stats.mirrors.rejected == 0
    assert stats.mirrors.accepted == len(requests), stats
    assert stats.mirrors.resent > 0, "batches in flight at the kill were resent"
    assert stats.reconnects >= 1
    assert len(ids) == len(set(ids)) and set(ids) == expected
    assert all(decided[i] == policies for i in ids)
    assert sorted(_journaled(data)) == sorted(expected), "journaled once each"
