"""Online-bounded reports: the wire messages match the dataclasses; breaches are named."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from service.protocols import ActedPlacement, RuntimeRequestCount, authority_breaches, load_protocol
from service.wire.understudy.v1 import contract_pb2, online_pb2
from tests.protocols.conftest import ONLINE_FILE, SHADOW_FILE

STARTED = 1_700_000_000.0
PROTOCOL = load_protocol(ONLINE_FILE)
GOOD = ActedPlacement(
    request_id="r-1",
    protocol_id=PROTOCOL.id,
    protocol_version=PROTOCOL.version,
    policy_name=PROTOCOL.candidate.name,
    policy_version=PROTOCOL.candidate.version,
    policy_sha256=PROTOCOL.candidate.sha256 or "",
    option=2,
    pool="V100",
    workload_kind="batch",
    acted_at=STARTED + 3600,
    concurrent_placements=5,
)


@pytest.mark.parametrize(
    ("message", "cls"),
    [
        (online_pb2.ActedPlacement, ActedPlacement),
        (online_pb2.RuntimeRequestCount, RuntimeRequestCount),
    ],
)
def test_wire_messages_match_the_dataclasses_field_for_field(message: Any, cls: Any) -> None:
    wire = [f.name for f in message.DESCRIPTOR.fields]
    assert wire == [f.name for f in dataclasses.fields(cls)]


def test_an_acted_placement_round_trips_through_the_wire() -> None:
    fields = {f.name: getattr(GOOD, f.name) for f in dataclasses.fields(GOOD)}
    fields["workload_kind"] = contract_pb2.WORKLOAD_KIND_BATCH
    raw = online_pb2.ActedPlacements(placements=[online_pb2.ActedPlacement(**fields)])
    back = online_pb2.ActedPlacements.FromString(raw.SerializeToString()).placements[0]
    assert back.policy_sha256 == GOOD.policy_sha256 and back.option == 2


BREACHES = [
    ("within authority", {}, []),
    ("other artifact", {"policy_sha256": "0" * 64}, ["`policy_sha256`"]),
    ("other version", {"policy_version": "1.0.1"}, ["`policy_sha256`"]),
    ("pool not allowed", {"pool": "A100"}, ["`pool`"]),
    ("kind not allowed", {"workload_kind": "train"}, ["`workload_kind`"]),
    ("too many live", {"concurrent_placements": 21}, ["`concurrent_placements`"]),
    ("too late", {"acted_at": STARTED + 4 * 86400}, ["`acted_at`"]),
    ("other protocol", {"protocol_version": 2}, ["`protocol_id`"]),
    ("several at once", {"pool": "K80", "workload_kind": "train"}, ["`pool`", "`workload_kind`"]),
]


@pytest.mark.parametrize(("changes", "named"), [pytest.param(c, n, id=i) for i, c, n in BREACHES])
def test_authority_breaches_are_named(changes: dict[str, Any], named: list[str]) -> None:
    found = authority_breaches(PROTOCOL, dataclasses.replace(GOOD, **changes), STARTED)
    assert [b.split(" ")[0] for b in found] == named


def test_a_shadow_protocol_grants_no_authority() -> None:
    (only,) = authority_breaches(load_protocol(SHADOW_FILE), GOOD, STARTED)
    assert "grants no authority" in only
