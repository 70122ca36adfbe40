"""``request_id`` is the identity of a request, on every transport (issue 22 item 5).

Real servers (gRPC and uvicorn on loopback), the real scorer and PostgreSQL. A
re-send with the same content is a duplicate: acked, logged once. The same id
with other content (here: another ``request_time``) is refused in the ack,
naming ``request_id`` (HTTP 409, gRPC ALREADY_EXISTS, a stream ack REJECTED
with reason ``conflicting_request``) and counted; and when ingest cannot know
(another replica, a restart without its index) the writer keeps it out: one
request row, one set of decisions, a recorded conflict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from sqlalchemy import Engine, text

from service.contract import MirrorRequest
from service.policies.baselines import LeastLoaded
from service.policies.registry import Registry
from service.server.app import Service
from service.storage import conflicts
from service.transport.http.convert import mirror_to_json
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import shadow_pb2, shadow_pb2_grpc
from tests.live_traffic import wait_for

pytestmark = pytest.mark.live  # waits on a real service


def _registry() -> Registry:
    return Registry(policies={"least-loaded": LeastLoaded()}, predictors={})


def _later(request: MirrorRequest, seconds: float = 60.0) -> MirrorRequest:
    return dataclasses.replace(request, request_time=request.request_time + seconds)


def _renamed(request: MirrorRequest, request_id: str) -> MirrorRequest:
    return dataclasses.replace(request, request_id=request_id)


def _logged(engine: Engine, table: str, request_id: str) -> list[float]:
    """The request times of `request_id`'s rows in `table` (requests or decisions)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT extract(epoch FROM request_time) FROM {table} WHERE request_id = :r"
                " ORDER BY 1"
            ),
            {"r": request_id},
        )
        return [float(r[0]) for r in rows]


class Client:
    """The three ways Runtime sends a request, each returning what the ack said."""

    def __init__(self, service: Service, token: str) -> None:
        self._auth = (("authorization", f"Bearer {token}"),)
        self._channel = grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}")
        self._stub = shadow_pb2_grpc.ShadowEvaluationStub(self._channel)  # type: ignore[no-untyped-call]
        self._http = httpx.Client(
            base_url=f"http://127.0.0.1:{service.http_port}",
            headers={"authorization": f"Bearer {token}"},
            timeout=30,
        )

    def close(self) -> None:
        self._channel.close()
        self._http.close()

    def http(self, request: MirrorRequest) -> httpx.Response:
        return self._http.post("/v1/mirror", content=mirror_to_json(request))

    def unary(self, request: MirrorRequest) -> shadow_pb2.MirrorAck:
        return self._stub.Mirror(mirror_request_to_pb(request), metadata=self._auth)

    def stream(self, requests: list[MirrorRequest]) -> list[shadow_pb2.StreamAck]:
        envelopes = [
            shadow_pb2.MirrorStreamRequest(sequence=i + 1, request=mirror_request_to_pb(r))
            for i, r in enumerate(requests)
        ]
        return list(self._stub.MirrorStream(iter(envelopes), metadata=self._auth))


@pytest.fixture()
def client_of(runtime_token: str) -> Iterator[Callable[[Service], Client]]:
    made: list[Client] = []

    def make(service: Service) -> Client:
        made.append(Client(service, runtime_token))
        return made[-1]

    yield make
    for c in made:
        c.close()


def _value(service: Service, name: str, labels: dict[str, str] | None = None) -> float:
    return service.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def test_a_resend_with_the_same_content_is_acked_and_logged_once(
    make_service: Callable[..., Service],
    client_of: Callable[[Service], Client],
    requests_sample: list[MirrorRequest],
) -> None:
    service = make_service(policies=_registry())
    assert service.engine is not None
    engine = service.engine
    client = client_of(service)
    via_http, via_unary, via_stream = (
        _renamed(r, f"same-{i}") for i, r in enumerate(requests_sample[:3])
    )
    assert [client.http(via_http).json()["status"] for _ in range(2)] == ["accepted"] * 2
    accepted = shadow_pb2.ACK_STATUS_ACCEPTED
    assert [client.unary(via_unary).status for _ in range(2)] == [accepted] * 2
    acks = client.stream([via_stream, via_stream])
    assert [a.status for a in acks] == [accepted, accepted]
    assert acks[-1].accepted == 2

    ids = [r.request_id for r in (via_http, via_unary, via_stream)]
    wait_for(
        lambda: all(_logged(engine, "decisions", i) for i in ids), "every request scored", 120.0
    )
    for r in (via_http, via_unary, via_stream):
        assert _logged(engine, "requests", r.request_id) == [pytest.approx(r.request_time)]
        assert _logged(engine, "decisions", r.request_id) == [pytest.approx(r.request_time)]
    for transport in ("http", "grpc", "grpc_stream"):
        assert _value(service, "understudy_ingest_duplicates_total", {"transport": transport}) == 1
    assert conflicts(engine) == []


def test_the_same_id_at_another_time_is_refused_at_ingest_naming_request_id(
    make_service: Callable[..., Service],
    client_of: Callable[[Service], Client],
    requests_sample: list[MirrorRequest],
) -> None:
    service = make_service(policies=_registry())
    assert service.engine is not None
    engine = service.engine
    client = client_of(service)
    first = _renamed(requests_sample[3], "taken-id")
    assert client.http(first).json()["status"] == "accepted"
    moved = _later(first)

    refused = client.http(moved)
    assert refused.status_code == 409
    body = refused.json()
    assert (body["error"], body["field"]) == ("ConflictingRequest", "request_id")
    assert "`request_id`" in body["message"] and "other content" in body["message"]

    with pytest.raises(grpc.RpcError) as caught:
        client.unary(_later(first, 120.0))
    assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "`request_id`" in (caught.value.details() or "")

    ack = client.stream([_later(first, 180.0)])[0]  # then the stream's closing tally
    assert ack.status == shadow_pb2.ACK_STATUS_REJECTED
    assert (ack.field, ack.reason) == ("request_id", "conflicting_request")

    assert _value(service, "understudy_request_conflicts_total", {"stage": "ingest"}) == 3
    for transport in ("http", "grpc", "grpc_stream"):
        labels = {"transport": transport, "kind": "mirror", "field": "request_id"}
        assert _value(service, "understudy_ingest_rejections_total", labels) == 1, transport
    wait_for(lambda: bool(_logged(engine, "decisions", first.request_id)), "first scored", 120.0)
    assert _logged(engine, "requests", first.request_id) == [pytest.approx(first.request_time)]
    assert _logged(engine, "decisions", first.request_id) == [pytest.approx(first.request_time)]
    assert service.journal.head_seq == 1  # the refused ones never reached the journal


def test_a_conflict_the_index_cannot_know_is_kept_out_by_the_writer(
    make_service: Callable[..., Service],
    client_of: Callable[[Service], Client],
    requests_sample: list[MirrorRequest],
    tmp_path: Path,
) -> None:
    """Another replica (its own journal and index, the same database) gets the clash."""
    first = _renamed(requests_sample[4], "replicated-id")
    one = make_service(policies=_registry())
    assert one.engine is not None
    engine = one.engine
    assert client_of(one).http(first).json()["status"] == "accepted"
    wait_for(lambda: bool(_logged(engine, "decisions", first.request_id)), "first scored", 120.0)

    other = make_service(policies=_registry(), data_dir=tmp_path / "replica")
    moved = _later(first)
    assert client_of(other).unary(moved).status == shadow_pb2.ACK_STATUS_ACCEPTED  # it cannot know
    wait_for(
        lambda: _value(other, "understudy_request_conflicts_total", {"stage": "writer"}) >= 1,
        "the writer's conflict counted",
        120.0,
    )
    assert _value(other, "understudy_request_conflicts_total", {"stage": "writer"}) == 1
    assert _logged(engine, "requests", first.request_id) == [pytest.approx(first.request_time)]
    assert _logged(engine, "decisions", first.request_id) == [pytest.approx(first.request_time)]
    [recorded] = conflicts(engine, request_id=first.request_id)
    assert recorded.kind == "request"
    assert recorded.existing["request_time"] == pytest.approx(first.request_time)
    assert recorded.incoming["request_time"] == pytest.approx(moved.request_time)
