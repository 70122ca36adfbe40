"""The journal's disk fills up under a running service: shed, counted, shown, healed.

Real servers on loopback, the real embedded PostgreSQL, and a real full disk:
the journal lives on a 2 MiB tmpfs mounted for the test (tests/tinyfs.py;
skipped, saying so, where a tmpfs cannot be mounted). Two ways to fill it:
another file takes the space (then it is deleted), or the journal fills it
itself while the scorer is stalled (then the scorer drains it) -- the issue's
case, where refusals went on for 40 s after everything was logged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from sqlalchemy import Engine, func, select

from service.contract import MirrorRequest
from service.policies.registry import Registry
from service.server.app import Service
from service.storage.log import tables as t
from service.transport.http.convert import mirror_to_json
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import shadow_pb2, shadow_pb2_grpc
from tests.reliability.test_overload import GatedPolicy
from tests.tinyfs import fill, tmpfs
from tests.transport.test_decision_log_e2e import wait_until

pytestmark = pytest.mark.live

ACCEPTED = shadow_pb2.ACK_STATUS_ACCEPTED
SHED = shadow_pb2.ACK_STATUS_SHED
TRANSPORTS = ("http", "grpc", "grpc_stream")


@pytest.fixture()
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB filesystem for the journal; requested before the service, unmounted after it."""
    with tmpfs(tmp_path / "disk", "2m") as mounted:
        yield mounted


class Mirrors:
    """The three ways Runtime mirrors, each answer checked for a leaked path and counted.

    Every message journals the same number of bytes (the sample's largest request,
    ids of one width): once one is refused for want of space, so is the next,
    until space is freed.
    """

    def __init__(self, service: Service, token: str, sample: list[MirrorRequest], disk: Path):
        self._request = max(sample, key=lambda r: mirror_request_to_pb(r).ByteSize())
        self._disk = disk
        self._auth = (("authorization", f"Bearer {token}"),)
        self._channel = grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}")
        self._stub = shadow_pb2_grpc.ShadowEvaluationStub(self._channel)  # type: ignore[no-untyped-call]
        self._http = httpx.Client(
            base_url=f"http://127.0.0.1:{service.http_port}",
            headers={"authorization": f"Bearer {token}"},
            timeout=60,  # a hang guard
        )
        self.sent = dict.fromkeys(TRANSPORTS, 0)
        self.accepted: list[str] = []
        self.shed: list[str] = []
        self._n = 0

    def close(self) -> None:
        self._http.close()
        self._channel.close()

    def _next(self, tag: str) -> tuple[MirrorRequest, str]:
        self._n += 1
        return self._request, f"disk-{tag:>6}-{self._n:05d}"

    def _note(self, request_id: str, accepted: bool) -> bool:
        (self.accepted if accepted else self.shed).append(request_id)
        return accepted

    def http(self, tag: str) -> bool:
        request, rid = self._next(tag)
        body = mirror_to_json(request).replace(request.request_id.encode(), rid.encode())
        self.sent["http"] += 1
        reply = self._http.post("/v1/mirror", content=body)
        assert reply.status_code == 202, reply.text  # never a 500
        assert str(self._disk) not in reply.text and ".seg" not in reply.text
        status = reply.json()["status"]
        assert status in ("accepted", "shed"), reply.text
        return self._note(rid, status == "accepted")

    def http_invalid(self) -> None:
        self.sent["http"] += 1
        reply = self._http.post("/v1/mirror", content=b'{"request_id": 7}')
        assert reply.status_code == 400, reply.text

    def unary(self, tag: str) -> bool:
        request, rid = self._next(tag)
        msg = mirror_request_to_pb(request)
        msg.request_id = rid
        self.sent["grpc"] += 1
        ack = self._stub.Mirror(msg, metadata=self._auth, timeout=60)  # an error raises here
        assert ack.status in (ACCEPTED, SHED), ack
        return self._note(rid, ack.status == ACCEPTED)

    def stream(self, tag: str, n: int) -> list[shadow_pb2.StreamAck]:
        envelopes = []
        for i in range(n):
            request, rid = self._next(tag)
            msg = mirror_request_to_pb(request)
            msg.request_id = rid
            envelopes.append(shadow_pb2.MirrorStreamRequest(sequence=i + 1, request=msg))
        self.sent["grpc_stream"] += n
        call = self._stub.MirrorStream(iter(envelopes), metadata=self._auth, timeout=60)
        acks = list(call)
        assert call.code() == grpc.StatusCode.OK  # ended on its own: every message acked
        assert acks and acks[-1].accepted + acks[-1].shed == n, acks
        shed_seqs = {a.sequence for a in acks if a.status == SHED}
        for i, envelope in enumerate(envelopes):
            # cumulative acks cover a prefix of accepted ones; a shed one is named
            self._note(envelope.request.request_id, i + 1 not in shed_seqs)
        assert len(shed_seqs) == acks[-1].shed
        return acks


def counted(service: Service, transport: str, result: str) -> float:
    labels = {"transport": transport, "kind": "mirror", "result": result}
    return service.metrics.registry.get_sample_value("understudy_ingest_total", labels) or 0.0


def sheds(service: Service, reason: str) -> float:
    value = service.metrics.registry.get_sample_value
    labels = {"kind": "mirror", "reason": reason}
    return sum(
        value("understudy_ingest_sheds_total", labels | {"transport": tr}) or 0.0
        for tr in TRANSPORTS
    )


def journal_check(service: Service) -> tuple[int, dict[str, Any], str]:
    reply = httpx.get(f"http://127.0.0.1:{service.http_port}/readyz", timeout=60)
    (check,) = [c for c in reply.json()["checks"] if c["name"] == "journal"]
    return reply.status_code, check, reply.text


def assert_every_answer_counted(service: Service, mirrors: Mirrors) -> None:
    for transport in TRANSPORTS:
        total = sum(counted(service, transport, r) for r in ("accepted", "shed", "rejected"))
        assert total == mirrors.sent[transport], transport
    assert sum(counted(service, tr, "accepted") for tr in TRANSPORTS) == len(mirrors.accepted)
    assert sum(counted(service, tr, "shed") for tr in TRANSPORTS) == len(mirrors.shed)


def logged_once(engine: Engine, ids: list[str]) -> dict[str, int]:
    """How often each mirrored id of this test is in the decision log."""
    r = t.requests
    with engine.connect() as conn:
        rows = conn.execute(
            select(r.c.request_id, func.count())
            .where(r.c.request_id.like("disk-%"))
            .group_by(r.c.request_id)
        ).all()
    return {rid: n for rid, n in rows}


def _accepted_again(service: Service, mirrors: Mirrors) -> None:
    """After recovery: unary and stream accept too, and readiness says the journal is fine."""
    assert mirrors.unary("after")
    assert mirrors.stream("after", 3)[-1].accepted == 3
    wait_until(lambda: journal_check(service)[1]["ok"])


def _counted_and_logged_once(service: Service, mirrors: Mirrors) -> None:
    """Every answer counted; every accepted request logged once, no shed one at all."""
    assert_every_answer_counted(service, mirrors)
    wait_until(lambda: service.journal.depth_records("scorer") == 0)
    assert service.engine is not None
    assert logged_once(service.engine, mirrors.accepted) == dict.fromkeys(mirrors.accepted, 1)


def start(make_service: Callable[..., Service], disk: Path, gated: GatedPolicy) -> Service:
    return make_service(
        policies=Registry(policies={"gated": gated}, predictors={}),
        journal_dir=disk / "journal",
        journal_segment_bytes=128_000,
        journal_max_bytes=1 << 30,  # far above the disk: the disk is what runs out
        policy_time_budget_ms=600_000,
        scorer_max_batch=16,
    )


def test_a_disk_filled_by_another_file_sheds_counts_shows_and_heals_at_once(
    disk: Path,
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    gated = GatedPolicy()
    service = start(make_service, disk, gated)
    mirrors = Mirrors(service, runtime_token, requests_sample, disk)
    try:
        assert mirrors.http("before") and mirrors.unary("before")
        mirrors.stream("before", 3)
        wait_until(lambda: service.journal.depth_records("scorer") == 0)

        gated.open.clear()  # nothing consumed meanwhile, so the journal frees nothing itself
        filler = fill(disk)
        for _ in range(100):  # a hang guard; the segment's last page may take one or two
            if not mirrors.unary("top-up"):
                break
        for _ in range(4):
            assert not mirrors.http("full")
            assert not mirrors.unary("full")
        mirrors.http_invalid()  # still refused for its content, not shed
        acks = mirrors.stream("full", 4)
        assert [a.sequence for a in acks if a.status == SHED] == [1, 2, 3, 4]
        refused = 13
        assert sheds(service, "disk_full") == refused
        assert sheds(service, "journal_full") == 0
        assert_every_answer_counted(service, mirrors)

        expected = f"write failed: no space left on device, {refused} refused"
        wait_until(lambda: journal_check(service)[1]["detail"] == expected)  # may lag a probe
        status, check, text = journal_check(service)
        assert status == 503 and not check["ok"]
        assert str(disk) not in text

        filler.unlink()
        gated.open.set()
        freed = time.perf_counter()
        assert mirrors.http("after"), "the first request after space returned was refused"
        took_ms = (time.perf_counter() - freed) * 1e3
        _accepted_again(service, mirrors)
        print(
            f"\n[disk full] {refused} shed while full (disk_full), "
            f"first request after freeing accepted in {took_ms:.1f} ms"
        )
        _counted_and_logged_once(service, mirrors)
    finally:
        mirrors.close()


def test_a_disk_the_journal_filled_recovers_once_the_scorer_drains_it(
    disk: Path,
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
) -> None:
    gated = GatedPolicy()
    gated.open.clear()  # the scorer stalls (a database outage would do the same)
    service = start(make_service, disk, gated)
    mirrors = Mirrors(service, runtime_token, requests_sample, disk)
    try:
        for _ in range(5000):  # a hang guard: 2 MiB holds a few hundred
            if not mirrors.unary("fill"):
                break
        else:
            raise AssertionError("the journal never filled its 2 MiB disk")
        filled = len(mirrors.accepted)
        assert not mirrors.http("full") and not mirrors.unary("full")
        assert sheds(service, "disk_full") == 3 and sheds(service, "journal_full") == 0
        wait_until(lambda: not journal_check(service)[1]["ok"])

        released = time.perf_counter()
        gated.open.set()
        wait_until(lambda: service.journal.depth_records("scorer") == 0, timeout=90)
        drained_s = time.perf_counter() - released
        assert mirrors.http("after"), "refused after the scorer drained everything"
        _accepted_again(service, mirrors)
        print(
            f"\n[disk full] the journal filled 2 MiB with {filled} requests; the scorer drained"
            f" it in {drained_s:.1f} s and the next request was accepted"
        )
        _counted_and_logged_once(service, mirrors)
    finally:
        mirrors.close()
