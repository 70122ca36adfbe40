"""Overload with batches: the bounded journal sheds, and the accounting is exact per
request (issue 24, acceptance).

As tests/reliability/test_overload.py, capacity is cut to zero by a policy that
blocks until the test lets it go, so the journal fills after the same number of
batches on any machine. Meanwhile 64-request batches (8 snapshots each, some
with bad requests at chosen indexes) are mirrored over MirrorMany and POST
/v1/mirror/batch: for every batch accepted + shed + rejected is its size and the
bad requests are the rejected ones; summed over the run it is what was sent, in
the acks and in `understudy_ingest_total`; some batches are shed (asserted);
a batch is one journal record, so it is shed whole or not at all. Once the
scorer is let go, exactly the accepted requests are logged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import httpx
import pytest
from sqlalchemy import text

from service.policies.registry import Registry
from service.server.app import Service
from service.wire.understudy.v1 import shadow_pb2, shadow_pb2_grpc
from tests.reliability.batch_load import BatchStreamRun, shaped_batches
from tests.reliability.test_overload import GatedPolicy
from tests.transport.batch_helpers import counted, spoil
from tests.transport.test_decision_log_e2e import wait_until

JOURNAL_BYTES = 400_000
"""About five batches of the shape (a record of 64 requests is ~70 kB)."""
OFFERED = 40
"""Batches mirrored while the scorer is stalled: eight times what the journal holds."""
BAD = {3: "gang_size", 17: "request_time", 40: "gang_size"}
"""Requests spoiled in every third batch (per-request faults: no shared snapshot touched)."""
SIZE = 64
STREAMED = 5
"""Batches then sent on a MirrorManyStream while the journal is still full."""
SHED = shadow_pb2.ACK_STATUS_SHED


@pytest.mark.live
def test_batch_overload_sheds_and_accounts_for_every_request(
    make_service: Callable[..., Service], runtime_token: str
) -> None:
    gated = GatedPolicy()
    service = make_service(
        policies=Registry(policies={"gated": gated}, predictors={}),
        journal_max_bytes=JOURNAL_BYTES,
        journal_segment_bytes=256_000,
        policy_time_budget_ms=600_000,
        scorer_max_batch=SIZE,
    )
    assert service.engine is not None
    batches = shaped_batches(2 + OFFERED, "ov")
    auth = (("authorization", f"Bearer {runtime_token}"),)
    results: list[tuple[str, dict[str, Any], tuple[str, ...], set[int]]] = []
    with (
        grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel,
        httpx.Client(
            base_url=f"http://127.0.0.1:{service.http_port}",
            headers={"authorization": f"Bearer {runtime_token}"},
            timeout=60,
        ) as http,
    ):
        stub = shadow_pb2_grpc.ShadowEvaluationStub(channel)  # type: ignore[no-untyped-call]

        def send(k: int) -> None:
            batch = batches[k]
            msg = type(batch.msg)()
            msg.CopyFrom(batch.msg)
            bad = set(BAD) if k % 3 == 2 else set()
            for index in bad:
                spoil(msg, index, BAD[index])
            if k % 2 == 0:
                ack = stub.MirrorMany(msg, metadata=auth, timeout=60)  # a hang guard
                fate = {
                    "accepted": ack.accepted,
                    "shed": ack.shed,
                    "rejected": ack.rejected,
                    "rejections": [r.index for r in ack.rejections],
                }
                results.append(("grpc_batch", fate, batch.ids, bad))
            else:
                reply = http.post(
                    "/v1/mirror/batch",
                    content=msg.SerializeToString(),
                    headers={"content-type": "application/x-protobuf"},
                )
                assert reply.status_code == 200, reply.text
                body = reply.json()
                body["rejections"] = [r["index"] for r in body["rejections"]]
                results.append(("http_batch", body, batch.ids, bad))

        send(0)
        send(1)
        wait_until(lambda: service.journal.depth_records("scorer") == 0)
        assert all(r[1]["accepted"] == SIZE for r in results), results
        gated.open.clear()  # the stall: the scorer's next step waits, the journal fills
        for k in range(2, 2 + OFFERED):
            send(k)
        depth_peak = service.journal.depth_bytes
        # the batch stream, journal still full: every batch shed whole, acked alone as SHED
        streamed = BatchStreamRun(
            service.grpc_port, runtime_token, shaped_batches(STREAMED, "ovs"), window=STREAMED
        ).start()
        streamed.wait_for(lambda r: r.done, "the stream's acks")
        streamed.join()

    totals = {"accepted": 0, "shed": 0, "rejected": 0}
    by_transport: dict[tuple[str, str], int] = {}
    accepted_ids: set[str] = set()
    shed_ids: set[str] = set()
    for transport, fate, ids, bad in results:
        assert fate["accepted"] + fate["shed"] + fate["rejected"] == len(ids) == SIZE, fate
        assert fate["rejected"] == len(bad) and fate["rejections"] == sorted(bad), fate
        assert fate["accepted"] == 0 or fate["shed"] == 0, "one record: shed whole or not at all"
        for result in totals:
            totals[result] += fate[result]
            by_transport[(transport, result)] = (
                by_transport.get((transport, result), 0) + fate[result]
            )
        good = {i for row, i in enumerate(ids) if row not in bad}
        (accepted_ids if fate["accepted"] else shed_ids).update(good)
    shed_batches = sum(1 for r in results if r[1]["shed"])
    print(
        f"\n[batch overload] {len(results)} batches of {SIZE}: accepted {totals['accepted']}, "
        f"shed {totals['shed']} ({shed_batches} batches), rejected {totals['rejected']}; "
        f"journal {depth_peak} B of {JOURNAL_BYTES}"
    )
    assert sum(totals.values()) == SIZE * len(results), "every request sent is accounted for"
    assert shed_batches > 0, "the journal's bound was reached"
    assert any(r[1]["accepted"] for r in results[2:]), "the stall accepted some first"
    assert totals["rejected"] > 0
    for (transport, result), n in by_transport.items():
        labels = {"transport": transport, "kind": "mirror", "result": result}
        assert counted(service, "understudy_ingest_total", **labels) == n, (transport, result)
    assert depth_peak <= JOURNAL_BYTES
    assert streamed.error is None, streamed.error
    assert sorted(streamed.individual) == list(range(1, STREAMED + 1)), streamed.acks
    for ack in streamed.individual.values():
        assert (ack.status, ack.accepted, ack.shed, ack.rejected) == (SHED, 0, SIZE, 0), ack
    last = streamed.acks[-1]
    assert (last.stream_accepted, last.stream_shed, last.stream_rejected) == (0, STREAMED * SIZE, 0)
    stream_labels = {"transport": "grpc_batch_stream", "kind": "mirror", "result": "shed"}
    assert counted(service, "understudy_ingest_total", **stream_labels) == STREAMED * SIZE
    shed_ids.update(i for b in streamed.batches for i in b.ids)

    gated.open.set()
    engine = service.engine
    wait_until(lambda: service.journal.depth_records("scorer") == 0)
    wait_until(lambda: _logged_count(engine) >= len(accepted_ids))
    with engine.connect() as conn:
        logged = list(conn.execute(text("SELECT request_id FROM requests")).scalars())
    assert len(logged) == len(set(logged))
    assert set(logged) == accepted_ids, "accepted requests logged, shed and rejected ones not"
    assert not shed_ids & set(logged)


def _logged_count(engine: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM requests")).scalar_one())
