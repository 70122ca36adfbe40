"""The mirroring client speaks schema 2: what it delivers is a v2 request, devices and all.

The client sends the protobuf messages it is given; our encoder (what the demo
and Runtime adapters built from `service.wire.convert` use) writes
``schema_version = 2`` and the v2 fields. This checks the whole road over the
client's batch stream into a real service's journal, and that a v1 message the
client carries goes on the single-request stream (a batch speaks schema 2
only) and is still accepted and journaled as v1 (the client does not rewrite
what it is given).
"""

from __future__ import annotations

import dataclasses

from service.client import MirrorClient
from service.contract import MirrorRequest
from service.pipeline.journal_format import RecordKind
from service.server.app import Service
from service.wire.convert import mirror_request_to_pb
from tests.client.journaled import journal_kinds, journaled_requests
from tests.contract import v2_requests as v2


def test_the_client_delivers_v2_requests_as_schema_2(
    service: Service, runtime_token: str, requests_sample: list[MirrorRequest]
) -> None:
    sent = [
        dataclasses.replace(v2.naming_devices(requests_sample[0]), request_id="v2-named"),
        dataclasses.replace(v2.sharing(requests_sample[1]), request_id="v2-share"),
        dataclasses.replace(v2.as_schema_1(requests_sample[2]), request_id="v1-plain"),
    ]
    client = MirrorClient(f"127.0.0.1:{service.grpc_port}", runtime_token)
    try:
        for request in sent:
            assert client.mirror(mirror_request_to_pb(request))
        assert client.flush(60), client.stats()
        stats = client.close()
    finally:
        client.close(0.1)
    assert stats.mirrors.delivered == len(sent) and stats.mirrors.dropped == 0
    journaled = {m.request_id: m for m in journaled_requests(service, 100)}
    assert {k: m.schema_version for k, m in journaled.items()} == {
        "v2-named": 2,
        "v2-share": 2,
        "v1-plain": 1,
    }
    named = journaled["v2-named"]
    v2.assert_same(named.state, sent[0].state)
    v2.assert_same(named.options, sent[0].options)
    share = journaled["v2-share"].workload
    assert (share.accelerator_share, share.kind, share.qos_class) == (0.44, "serve", "LS")
    kinds = journal_kinds(service, 100)
    assert kinds.count(RecordKind.MIRROR) == 1, "only the v1 request went one by one"
    assert RecordKind.MIRROR_BATCH in kinds
    assert stats.mirror_batches.diverted == 0 and stats.mirror_batches.requests_batched == 2
