"""The mirroring client reads a refused message's reason, and acks about no message it holds
(`REPEATED_SEQUENCE`, `REJECTED` under sequence 0) never change a sent message's fate.

With batching, `bad` (a NaN in its state) travels in a batch and is refused by
index; `no_state` cannot be read into a request, so the client sends it on the
single stream, where the service names its missing field as it always did."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.client import MirrorClient
from service.client.lane import ACCEPTED, REJECTED, REPEATED_SEQUENCE, SHED, Lane
from service.contract import MirrorRequest
from service.server.app import Service
from service.wire.convert import mirror_request_to_pb


def test_client_counts_a_rejection_by_the_reason_the_server_gave(
    make_service: Callable[..., Service],
    runtime_token: str,
    requests_sample: list[MirrorRequest],
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = make_service(scoring_enabled=False)
    good = mirror_request_to_pb(requests_sample[0])
    bad = mirror_request_to_pb(requests_sample[1])
    bad.request_id = "bad"
    bad.state.cpu_free[0] = float("nan")
    no_state = mirror_request_to_pb(requests_sample[2])
    no_state.request_id = "no-state"
    no_state.ClearField("state")
    with MirrorClient(f"127.0.0.1:{service.grpc_port}", runtime_token) as client:
        for msg in (good, bad, no_state):
            assert client.mirror(msg)
        assert client.flush(30), "the client never got its acks"
        everything = client.stats()
        stats = everything.mirrors
    assert everything.mirror_batches.diverted == 1, "no_state went on the single stream"
    assert (stats.accepted, stats.rejected, stats.protocol_errors) == (1, 2, 0)
    assert stats.rejected_by_reason == {"invalid_value": 1, "missing_field": 1}
    logged = [r.getMessage() for r in caplog.records if "REJECTED" in r.getMessage()]
    assert any("field state.cpu_free[], reason invalid_value" in m for m in logged), logged
    assert any("field state, reason missing_field" in m for m in logged), logged


def _lane_with_sent(n: int) -> Lane:
    lane = Lane(100)
    for i in range(n):
        lane.offer(f"m{i}")
        assert lane.next_to_send(0) is not None
    return lane


def test_a_repeated_sequence_ack_leaves_the_earlier_message_accepted() -> None:
    """Old client: a refusal under an accepted message's number marked that message's fate."""
    lane = _lane_with_sent(3)
    lane.acknowledge(ACCEPTED, 2)
    lane.acknowledge(REPEATED_SEQUENCE, 2, "repeated_sequence")  # about a later message
    lane.acknowledge(REPEATED_SEQUENCE, 3, "repeated_sequence")  # before 3's own fate arrived
    lane.acknowledge(REJECTED, 0, "malformed_message")  # about no numbered message
    lane.acknowledge(SHED, 3)
    lane.acknowledge(ACCEPTED, 3)
    stats = lane.stats()
    assert (stats.accepted, stats.shed, stats.rejected, stats.in_flight) == (2, 1, 0, 0)
    assert stats.protocol_errors == 3
    assert stats.offered == stats.delivered + stats.dropped + stats.in_flight
