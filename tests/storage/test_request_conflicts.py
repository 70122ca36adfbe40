"""A request reusing a logged (request_id, request_time) with other content is a conflict.

It used to be acked and silently dropped by ``ON CONFLICT DO NOTHING`` (issue 20,
item 9). Now the first request stays and the contradicting one is recorded in
``conflicts`` (``kind = 'request'``), once per distinct content; an exact replay,
or the same request encoded differently, is a plain duplicate. The last test
drives a running service, whose ingest refuses the contradiction in the ack.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

import httpx
from sqlalchemy import Engine, text

from service.contract import MirrorRequest
from service.policies.baselines import LeastLoaded
from service.policies.registry import Registry
from service.server.app import Service
from service.storage import DecisionLogWriter, LogBatch, conflicts, rows_from
from service.transport.http.convert import mirror_to_json
from tests.live_traffic import wait_for
from tests.storage.storage_helpers import FEATURES, payload_of, request_batch


def _retenanted(request: MirrorRequest, tenant: str) -> MirrorRequest:
    return dataclasses.replace(
        request, workload=dataclasses.replace(request.workload, tenant=tenant)
    )


def _stored_tenant(engine: Engine, request_id: str) -> list[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT tenant FROM requests WHERE request_id = :r"), {"r": request_id}
        )
        return [r[0] for r in rows]


def test_same_key_other_content_is_recorded_once_and_the_first_stays(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    writer = DecisionLogWriter(engine)
    first = requests_sample[0]
    other = _retenanted(first, "someone-else")
    assert writer.write(request_batch([first])).requests.inserted == 1

    replay = writer.write(request_batch([first]))  # the same journal record again
    assert (replay.requests.duplicates, replay.request_conflicts) == (1, 0)
    assert conflicts(engine, request_id=first.request_id) == []

    clash = writer.write(request_batch([other], first_seq=7))
    assert (clash.requests.inserted, clash.request_conflicts) == (0, 1)
    assert _stored_tenant(engine, first.request_id) == [first.workload.tenant]
    [recorded] = conflicts(engine, request_id=first.request_id)
    assert recorded.kind == "request"
    assert recorded.existing["tenant"] == first.workload.tenant
    assert recorded.existing["journal_seq"] == 1
    assert recorded.incoming["tenant"] == "someone-else"
    sha = hashlib.sha256(payload_of(other)).hexdigest()
    assert recorded.incoming["payload_sha256"] == sha
    assert recorded.existing["payload_sha256"] == hashlib.sha256(payload_of(first)).hexdigest()

    again = writer.write(request_batch([other], first_seq=9))  # re-sent: same conflict
    assert again.request_conflicts == 0
    assert len(conflicts(engine, request_id=first.request_id)) == 1


def test_other_state_and_a_clash_inside_one_batch_are_conflicts(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    writer = DecisionLogWriter(engine)
    a, b = requests_sample[1], requests_sample[2]
    writer.write(request_batch([a]))
    other_state = dataclasses.replace(a, state=b.state, options=b.options)
    assert writer.write(request_batch([other_state], first_seq=5)).request_conflicts == 1

    one_batch = writer.write(request_batch([b, _retenanted(b, "twin")], first_seq=10))
    assert (one_batch.requests.inserted, one_batch.request_conflicts) == (1, 1)
    assert _stored_tenant(engine, b.request_id) == [b.workload.tenant]  # the first stays
    kinds = [c.kind for c in conflicts(engine)]
    assert kinds == ["request", "request"]


def test_the_same_request_encoded_otherwise_is_a_duplicate(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    writer = DecisionLogWriter(engine)
    r = requests_sample[3]
    writer.write(request_batch([r]))
    # Field 999 (varint 1), unknown to the schema: other bytes, same request.
    padded = payload_of(r) + bytes([0xB8, 0x3E, 0x01])
    row, snapshot = rows_from(r, padded, 42, r.request_time + 3.0, *FEATURES)
    result = writer.write(LogBatch(requests=[row], snapshots=[snapshot] if snapshot else []))
    assert (result.requests.duplicates, result.request_conflicts) == (1, 0)
    assert conflicts(engine) == []


def test_the_service_refuses_a_request_conflict_at_ingest(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    """Ingest remembers the id: the contradicting send is refused in its ack (409).

    The writer's side (a conflict ingest could not know) is driven through
    running services in tests/transport/test_request_identity.py.
    """
    service = make_service(
        policies=Registry(policies={"least-loaded": LeastLoaded()}, predictors={})
    )
    assert service.engine is not None
    engine = service.engine
    first = requests_sample[4]
    value = service.metrics.registry.get_sample_value
    with httpx.Client(
        base_url=f"http://127.0.0.1:{service.http_port}",
        headers={"authorization": f"Bearer {runtime_token}"},
        timeout=10,
    ) as http:
        for body in (mirror_to_json(first), mirror_to_json(first)):  # a re-send: a duplicate
            assert http.post("/v1/mirror", content=body).json()["status"] == "accepted"
        clash = http.post("/v1/mirror", content=mirror_to_json(_retenanted(first, "impostor")))
    assert (clash.status_code, clash.json()["field"]) == (409, "request_id")
    assert value("understudy_request_conflicts_total", {"stage": "ingest"}) == 1
    assert value("understudy_ingest_duplicates_total", {"transport": "http"}) == 1
    wait_for(lambda: _stored_tenant(engine, first.request_id) != [], "the first logged", 60.0)
    assert _stored_tenant(engine, first.request_id) == [first.workload.tenant]
    assert conflicts(engine, request_id=first.request_id) == []  # never journaled, never logged
