"""Contract v2 on the wire: round trips, the version-1 rule, derived node counts.

pb <-> dataclass <-> HTTP JSON for devices, shares, open kinds and QoS,
unknown capabilities, named devices and production's distribution (carried by
a request and by an outcome); and the one documented mapping of schema 1
(docs/contract.md, "Versioning"): unset capability = 0, kind from the enum, no
schema-2 field. Pure conversions, no server: tests/transport/test_bad_input_v2.py
sends the refusals over real servers.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest

from service.contract import (
    FailureKind,
    InvalidInput,
    MirrorRequest,
    Outcome,
    ProductionDecision,
    validate_request,
)
from service.metrics import field_label
from service.transport.http import convert, decode
from service.transport.http.convert import mirror_to_json
from service.wire.convert import (
    mirror_request_from_pb,
    mirror_request_to_pb,
    outcome_from_pb,
    outcome_to_pb,
)
from service.wire.field_paths import KNOWN_FIELD_PATHS
from service.wire.understudy.v1 import contract_pb2 as pb
from tests.contract import v2_requests as v2

Variant = Callable[[MirrorRequest], MirrorRequest]


def _everything(r: MirrorRequest) -> MirrorRequest:
    return v2.with_distribution(v2.sharing(v2.naming_devices(v2.unknown_capabilities(r))))


VARIANTS: dict[str, Variant] = {
    "devices": v2.with_devices,
    "named devices": v2.naming_devices,
    "share, QoS, open kind": v2.sharing,
    "unknown capabilities": v2.unknown_capabilities,
    "production distribution": v2.with_distribution,
    "all of them": _everything,
}
V2_JSON_KEYS = {
    "state": {
        "device_offsets",
        "device_hardware",
        "device_free_share",
        "device_free_memory_gb",
        "device_ids",
    },
    "workload": {"qos_class", "accelerator_share"},
    "options": {"device_offsets", "device_index"},
    "production": {"probabilities", "defer_probability"},
}


@pytest.fixture(scope="module")
def base(requests_sample: list[MirrorRequest]) -> MirrorRequest:
    return requests_sample[0]


@pytest.mark.parametrize("variant", list(VARIANTS.values()), ids=list(VARIANTS))
def test_v2_requests_round_trip_through_protobuf_and_json(
    base: MirrorRequest, variant: Variant
) -> None:
    request = variant(base)
    validate_request(request)  # a valid v2 request, not just a decodable one
    assert request.schema_version == 2
    v2.assert_same(mirror_request_from_pb(mirror_request_to_pb(request)), request)
    body = mirror_to_json(request)
    for decoder in (convert.mirror_from_json, decode.mirror_from_json):
        got, payload = decoder(body)
        v2.assert_same(got, request)
        v2.assert_same(mirror_request_from_pb(pb.MirrorRequest.FromString(payload)), request)


def test_the_json_body_carries_the_v2_fields_by_their_protobuf_names(base: MirrorRequest) -> None:
    request = _everything(base)
    body = json.loads(mirror_to_json(request))
    s, w, o = request.state, request.workload, request.options
    assert body["state"]["device_offsets"] == s.device_offsets.tolist()
    assert body["state"]["device_free_share"] == pytest.approx(s.device_free_share.tolist())
    assert body["state"]["device_ids"][:2] == ["gpu0", "gpu1"]
    assert body["state"]["hardware"][0]["peak_dense_tflops"] is None  # unknown, not 0
    assert body["state"]["hardware"][-1]["accelerator_memory_gb"] is None
    assert (
        body["workload"].items() >= {"kind": "serve", "qos_class": "LS", "accelerators": 0}.items()
    )
    assert body["workload"]["accelerator_share"] == 0.44
    assert body["options"]["device_index"] == o.device_index.tolist()
    assert sum(body["production"]["probabilities"]) == 1.0
    assert "defer_probability" in body["production"]
    assert w.kind == "serve" and not w.kind_known


def test_unknown_capabilities_travel_as_unset_fields_never_as_zero(base: MirrorRequest) -> None:
    msg = mirror_request_to_pb(v2.unknown_capabilities(base))
    first, new = msg.state.hardware[0], msg.state.hardware[-1]
    assert first.HasField("accelerator_memory_gb") and not first.HasField("peak_dense_tflops")
    assert not any(new.HasField(name) for name in ("accelerator_memory_gb", "interconnect_gbps"))
    decoded = mirror_request_from_pb(msg).state.hardware
    assert decoded[0].peak_dense_tflops is None and decoded[-1].accelerator_memory_gb is None
    # a stated 0 is kept as a 0 in schema 2 (optional fields carry presence)
    msg.state.hardware[0].interconnect_gbps = 0.0
    assert mirror_request_from_pb(msg).state.hardware[0].interconnect_gbps == 0.0


def test_an_open_kind_travels_as_kind_name_and_a_known_one_as_both(base: MirrorRequest) -> None:
    open_kind = mirror_request_to_pb(v2.sharing(base)).workload
    assert (open_kind.kind_name, open_kind.kind) == ("serve", pb.WORKLOAD_KIND_UNSPECIFIED)
    known = mirror_request_to_pb(base).workload  # an older reader still gets the enum
    assert known.kind_name == base.workload.kind and known.kind != pb.WORKLOAD_KIND_UNSPECIFIED
    msg = mirror_request_to_pb(base)
    msg.workload.kind_name = ""  # schema 2 with the enum only: read from the enum
    assert mirror_request_from_pb(msg).workload.kind == base.workload.kind
    msg.workload.kind_name = "infer" if base.workload.kind != "infer" else "train"
    with pytest.raises(InvalidInput) as err:
        mirror_request_from_pb(msg)
    assert err.value.field == "workload.kind_name" and "disagrees" in str(err.value)


# ------------------------------------------------------------------ version 1


def test_a_v1_request_round_trips_unchanged_and_speaks_only_v1(base: MirrorRequest) -> None:
    request = v2.as_schema_1(base)
    validate_request(request)
    msg = mirror_request_to_pb(request)
    assert msg.schema_version == 1 and msg.workload.kind_name == ""  # kind from the enum
    assert not msg.state.device_offsets and not msg.options.device_offsets
    v2.assert_same(mirror_request_from_pb(msg), request)
    body = json.loads(mirror_to_json(request))
    for part, keys in V2_JSON_KEYS.items():
        assert not keys & set(body.get(part) or {}), part  # the body a v1 sender wrote
    for decoder in (convert.mirror_from_json, decode.mirror_from_json):
        got, payload = decoder(json.dumps(body).encode())
        v2.assert_same(got, request)
        assert pb.MirrorRequest.FromString(payload).workload.kind_name == ""


def test_v1_reads_an_unset_capability_as_zero_and_v2_as_unknown(base: MirrorRequest) -> None:
    """Proto3 schema 1 could not send a 0: an old sender's 0 arrives as an unset field."""
    msg = mirror_request_to_pb(v2.as_schema_1(base))
    cpu = next(i for i, h in enumerate(base.state.hardware) if h.interconnect_gbps == 0)
    assert base.state.hardware[cpu].accelerator_memory_gb == 0  # a CPU pool, as sent
    msg.state.hardware[cpu].ClearField("interconnect_gbps")
    msg.state.hardware[cpu].ClearField("accelerator_memory_gb")
    as_v1 = mirror_request_from_pb(msg)
    assert as_v1.state.hardware[cpu] == base.state.hardware[cpu]  # 0 stays 0
    validate_request(as_v1)
    msg.schema_version = 2
    as_v2 = mirror_request_from_pb(msg).state.hardware[cpu]
    assert as_v2.accelerator_memory_gb is None and as_v2.interconnect_gbps is None


def test_v1_old_wire_bytes_decode_as_before(base: MirrorRequest) -> None:
    """Bytes a schema-1 sender (non-optional doubles: zeros not written) produced."""
    msg = mirror_request_to_pb(v2.as_schema_1(base))
    for h in msg.state.hardware:
        for name in ("accelerator_memory_gb", "peak_dense_tflops", "interconnect_gbps"):
            if getattr(h, name) == 0.0:
                h.ClearField(name)  # what the old encoder wrote for a 0
    old_bytes = msg.SerializeToString()
    v2.assert_same(
        mirror_request_from_pb(pb.MirrorRequest.FromString(old_bytes)).state,
        v2.as_schema_1(base).state,
    )


@pytest.mark.parametrize(
    ("variant", "field"),
    [
        (v2.with_devices, "state.device_offsets"),
        (v2.sharing, "workload.kind"),  # the open kind comes first
        (lambda r: v2.sharing(r, kind="infer"), "workload.accelerator_share"),
        (v2.with_distribution, "production.probabilities"),
        (v2.unknown_capabilities, "state.hardware[0].peak_dense_tflops"),
    ],
    ids=["devices", "open kind", "share", "distribution", "unknown capability"],
)
def test_a_v1_request_that_sets_a_v2_field_is_refused_naming_it(
    base: MirrorRequest, variant: Variant, field: str
) -> None:
    request = v2.as_schema_1(variant(base))
    with pytest.raises(InvalidInput) as err:
        validate_request(request)
    assert err.value.field == field
    with pytest.raises(InvalidInput) as over_http:  # refused before it is encoded
        convert.mirror_from_json(mirror_to_json(request))
    assert over_http.value.field == field


def test_a_v1_message_with_kind_name_is_refused_by_the_decoder(base: MirrorRequest) -> None:
    msg = mirror_request_to_pb(v2.as_schema_1(base))
    msg.workload.kind_name = base.workload.kind
    with pytest.raises(InvalidInput) as err:
        mirror_request_from_pb(msg)
    assert err.value.field == "workload.kind_name" and "schema 2 field" in str(err.value)


# ------------------------------------------------------------------ devices


def test_node_counts_left_empty_are_derived_from_the_devices(base: MirrorRequest) -> None:
    request = v2.with_devices(base)
    msg = mirror_request_to_pb(request)
    del msg.state.accelerators_free[:], msg.state.accelerators_total[:]
    body = json.loads(mirror_to_json(request))
    del body["state"]["accelerators_free"], body["state"]["accelerators_total"]
    got = [
        mirror_request_from_pb(msg),
        convert.mirror_from_json(json.dumps(body).encode())[0],
        decode.mirror_from_json(json.dumps(body).encode())[0],
    ]
    for state in (r.state for r in got):
        assert state.accelerators_total.tolist() == np.diff(state.device_offsets).tolist()
        np.testing.assert_array_equal(state.accelerators_free, base.state.accelerators_free)
        np.testing.assert_array_equal(state.accelerators_total, base.state.accelerators_total)
        assert (
            state.accelerators_free.dtype == np.int32
            and not state.accelerators_free.flags.writeable
        )
    validate_request(got[0])


def test_a_partly_free_device_is_not_counted_free(base: MirrorRequest) -> None:
    """Free = wholly free (share >= 1): 0.999 of a device is not a free device."""
    request = v2.with_devices(base)
    share = request.state.device_free_share.copy()
    first_free = int(np.flatnonzero(share >= 1.0)[0])
    share[first_free] = 0.999
    msg = mirror_request_to_pb(request)
    msg.state.device_free_share[first_free] = 0.999
    del msg.state.accelerators_free[:]
    state = mirror_request_from_pb(msg).state
    node = int(np.searchsorted(state.device_offsets, first_free, side="right") - 1)
    assert state.accelerators_free[node] == base.state.accelerators_free[node] - 1


# ------------------------------------------------------------------ production, outcomes


def test_an_outcome_carries_production_distribution_both_ways() -> None:
    production = ProductionDecision(
        option=1, propensity=0.5, probabilities=(0.25, 0.5, 0.0), defer_probability=0.25
    )
    outcome = Outcome(
        request_id="r-1",
        observed_at=1.7e9,
        queue_delay_s=None,
        throughput=None,
        completion_time_s=None,
        slo_met=None,
        failure=FailureKind.NONE,
        production=production,
    )
    assert outcome_from_pb(outcome_to_pb(outcome)) == outcome
    body = json.dumps(
        {
            "request_id": "r-1",
            "observed_at": 1.7e9,
            "production": {
                "option": 1,
                "propensity": 0.5,
                "probabilities": [0.25, 0.5, 0.0],
                "defer_probability": 0.25,
            },
        }
    ).encode()
    for decoder in (convert.outcome_from_json, decode.outcome_from_json):
        got, payload = decoder(body)
        assert got.production == production
        assert outcome_from_pb(pb.Outcome.FromString(payload)).production == production


def test_no_distribution_is_none_on_both_transports(base: MirrorRequest) -> None:
    assert base.production is not None and base.production.probabilities is None
    body = json.loads(mirror_to_json(base))
    body["production"]["probabilities"] = []  # an empty list is "not sent", as in protobuf
    got, _ = convert.mirror_from_json(json.dumps(body).encode())
    assert got.production == base.production


# ------------------------------------------------------------------ metrics labels


@pytest.mark.parametrize(
    "field",
    [
        "state.device_offsets[3]",
        "state.device_hardware[0]",
        "state.device_free_share[7]",
        "state.device_free_memory_gb[1]",
        "state.device_ids[2]",
        "state.hardware[1].accelerator_memory_gb",
        "workload.kind_name",
        "workload.qos_class",
        "workload.accelerator_share",
        "options.device_offsets[0]",
        "options.device_index[4]",
        "production.probabilities",
        "production.defer_probability",
    ],
)
def test_rejections_of_the_new_fields_are_counted_by_name(field: str) -> None:
    label = field_label(field)
    assert label != "other" and label in KNOWN_FIELD_PATHS


def test_derived_and_sent_node_counts_give_the_same_request(base: MirrorRequest) -> None:
    request = v2.with_devices(base)
    msg = mirror_request_to_pb(request)
    del msg.state.accelerators_free[:], msg.state.accelerators_total[:]
    v2.assert_same(mirror_request_from_pb(msg), request)
