"""Bad input for every contract-v2 field, over a real gRPC server and a real HTTP server.

Each row takes a valid v2 request (tests/contract/v2_requests.py), breaks one
new field on its protobuf form and on its JSON form, sends both, and checks
INVALID_ARGUMENT / HTTP 400, that the message names the field, and that the
rejection was counted under that field's path (not ``other``: the label code
must know the new paths). docs/contract.md, "Bad input for every new field",
tables the same rows.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest

from service.contract import MirrorRequest
from service.contract.state import EMPTY_F32, EMPTY_I32, EMPTY_I64
from service.server.app import Service
from service.transport.http.convert import mirror_to_json
from service.wire.convert import mirror_request_to_pb
from service.wire.understudy.v1 import contract_pb2, shadow_pb2, shadow_pb2_grpc
from tests.contract import v2_requests as v2

Proto = contract_pb2.MirrorRequest
Body = dict[str, Any]
Mutation = Callable[[Any], None]


def _walk(root: Any, names: list[str]) -> Any:
    for name in names:
        if name.lstrip("-").isdigit():
            root = root[int(name)]
        else:
            root = root[name] if isinstance(root, dict) else getattr(root, name)
    return root


def _set(path: str, value: Any) -> Mutation:
    """Set `path` ("state.device_free_share.0"; last part "+" appends, "-" drops the last
    entry, "clear" empties the list) on a protobuf message or a JSON body alike."""
    *parents, last = path.split(".")

    def mutate(root: Any) -> None:
        if last in ("+", "-", "clear"):
            column = _walk(root, parents)
            if last == "+":
                column.append(value)
            elif last == "-":
                del column[-1]
            else:
                del column[:]
            return
        parent = _walk(root, parents)
        if last.lstrip("-").isdigit():
            parent[int(last)] = value
        elif isinstance(parent, dict):
            parent[last] = value
        else:
            setattr(parent, last, value)

    return mutate


def _both(*mutations: Mutation) -> Mutation:
    def mutate(root: Any) -> None:
        for m in mutations:
            m(root)

    return mutate


def _clear_state_devices(root: Any) -> None:
    for name in v2_DEVICE_COLUMNS:
        _set(f"state.{name}.clear", None)(root)


v2_DEVICE_COLUMNS = (
    "device_offsets",
    "device_hardware",
    "device_free_share",
    "device_free_memory_gb",
    "device_ids",
)


def _pb_kind(name: str) -> Mutation:
    """The protobuf form of a workload kind given by name only (enum unspecified)."""
    return _both(
        _set("workload.kind", contract_pb2.WORKLOAD_KIND_UNSPECIFIED),
        _set("workload.kind_name", name),
    )


@dataclass(frozen=True)
class Case:
    """One bad input: the base request, how to break it on each form, what is named."""

    id: str
    base: Callable[[MirrorRequest], MirrorRequest]
    grpc: Mutation | None  # None: the protobuf form cannot say this
    http: Mutation | None  # None: the JSON form cannot say this
    named: str  # text the message must contain (the field in backticks, and more)
    label: str  # the rejection metric's field label (indices dropped)
    http_named: str | None = None  # when HTTP words it differently
    http_label: str | None = None  # when HTTP names another field


def _same(path: str, value: Any) -> tuple[Mutation, Mutation]:
    return _set(path, value), _set(path, value)


DEV = v2.with_devices
NAMED = v2.naming_devices
SHARE = v2.sharing
DIST = v2.with_distribution


def _plain(r: MirrorRequest) -> MirrorRequest:
    return r


def _v1(r: MirrorRequest) -> MirrorRequest:
    return v2.as_schema_1(r)


def _spread(r: MirrorRequest) -> MirrorRequest:
    return v2.spread(r, gang_size=2)  # its last option spans 2 nodes, as gang_size allows


def _v1_spread_beyond_gang(r: MirrorRequest) -> MirrorRequest:
    return v2.as_schema_1(v2.spread(r, gang_size=1))  # v1: gang_size keeps its old meaning


def _v1_devices(r: MirrorRequest) -> MirrorRequest:
    return v2.as_schema_1(v2.with_devices(r))


def _v1_named(r: MirrorRequest) -> MirrorRequest:
    return v2.as_schema_1(v2.naming_devices(r))


def _v1_share(r: MirrorRequest) -> MirrorRequest:
    return v2.as_schema_1(v2.sharing(r, kind="infer"))  # a kind schema 1 can say


def _v1_dist(r: MirrorRequest) -> MirrorRequest:
    return v2.as_schema_1(v2.with_distribution(r))


def _v1_unknown(r: MirrorRequest) -> MirrorRequest:
    return v2.as_schema_1(v2.unknown_capabilities(r))


NAN, INF = float("nan"), float("inf")

CASES: list[Case] = [
    # ---- state.device_offsets: the CSR over nodes
    Case(
        "device offsets short",
        DEV,
        *_same("state.device_offsets.-", None),
        "`state.device_offsets` must have n_nodes + 1",
        "state.device_offsets",
    ),
    Case(
        "device offsets not from 0",
        DEV,
        *_same("state.device_offsets.0", 1),
        "`state.device_offsets[0]` must be 0",
        "state.device_offsets[]",
    ),
    Case(
        "device offsets decreasing",
        DEV,
        *_same("state.device_offsets.1", 10**6),
        "must be non-decreasing",
        "state.device_offsets[]",
    ),
    Case(
        "device offsets past the devices",
        DEV,
        *_same("state.device_offsets.-1", 10**6),
        "must end at len(the state.device_* columns)",
        "state.device_offsets[]",
    ),
    Case(
        "device columns without offsets",
        DEV,
        *_same("state.device_offsets.clear", None),
        "`state.device_offsets` must be set when device columns are given",
        "state.device_offsets",
    ),
    # ---- per-device columns
    Case(
        "device class out of range",
        DEV,
        *_same("state.device_hardware.0", 99),
        "`state.device_hardware[0]` must index state.hardware",
        "state.device_hardware[]",
    ),
    Case(
        "device class beyond int32",
        DEV,
        *_same("state.device_hardware.0", 2**32 - 1),
        "`state.device_hardware[0]` must index state.hardware",
        "state.device_hardware[]",
    ),
    Case(
        "device class is a CPU pool",
        DEV,
        *_same("state.device_hardware.0", 0),
        "`state.hardware[0].accelerator_memory_gb` is 0 (a CPU pool) but device 0",
        "state.hardware[].accelerator_memory_gb",
    ),
    Case(
        "share above 1",
        DEV,
        *_same("state.device_free_share.1", 1.5),
        "`state.device_free_share[1]` must be finite and in [0, 1]",
        "state.device_free_share[]",
    ),
    Case(
        "share negative",
        DEV,
        *_same("state.device_free_share.1", -0.1),
        "`state.device_free_share[1]` must be finite and in [0, 1]",
        "state.device_free_share[]",
    ),
    Case(
        "share NaN",
        DEV,
        *_same("state.device_free_share.1", NAN),
        "`state.device_free_share[1]` must be finite",
        "state.device_free_share[]",
        http_named="`state.device_free_share[1]`",  # pydantic refuses NaN / inf itself
    ),
    Case(
        "share column short",
        DEV,
        *_same("state.device_free_share.-", None),
        "`state.device_free_share` must have one value per device",
        "state.device_free_share",
    ),
    Case(
        "device memory negative",
        DEV,
        *_same("state.device_free_memory_gb.0", -1.0),
        "`state.device_free_memory_gb[0]` must be finite and >= 0",
        "state.device_free_memory_gb[]",
    ),
    Case(
        "device memory infinite",
        DEV,
        *_same("state.device_free_memory_gb.0", INF),
        "`state.device_free_memory_gb[0]` must be finite",
        "state.device_free_memory_gb[]",
        http_named="`state.device_free_memory_gb[0]`",  # pydantic refuses NaN / inf itself
    ),
    Case(
        "device memory above its class",
        DEV,
        *_same("state.device_free_memory_gb.0", 1e6),
        "`state.device_free_memory_gb[0]` must be <= state.hardware[",
        "state.device_free_memory_gb[]",
    ),
    Case(
        "device memory column short",
        DEV,
        *_same("state.device_free_memory_gb.-", None),
        "`state.device_free_memory_gb` must have one value per device",
        "state.device_free_memory_gb",
    ),
    Case(
        "device ids one too many",
        DEV,
        *_same("state.device_ids.+", "gpu-extra"),
        "`state.device_ids` must be empty or one per device",
        "state.device_ids",
    ),
    Case(
        "NUL in a device id",
        DEV,
        *_same("state.device_ids.0", "gpu\x000"),
        "`state.device_ids[0]` must not contain control characters",
        "state.device_ids[]",
    ),
    Case(
        "device id too long",
        DEV,
        *_same("state.device_ids.0", "g" * 300),
        "`state.device_ids[0]` must be at most",
        "state.device_ids[]",
    ),
    # ---- node counts against the devices
    Case(
        "node total disagrees with devices",
        DEV,
        *_same("state.accelerators_total.0", 7),
        "`state.accelerators_total[0]` must equal node 0's devices",
        "state.accelerators_total[]",
    ),
    Case(
        "node free disagrees with devices",
        DEV,
        *_same("state.accelerators_free.1", 7),
        "`state.accelerators_free[1]` must equal node 1's wholly free devices",
        "state.accelerators_free[]",
    ),
    # ---- named devices on options
    Case(
        "named device out of range",
        NAMED,
        *_same("options.device_index.0", 10**6),
        "`options.device_index[0]` must index the state's devices",
        "options.device_index[]",
    ),
    Case(
        "named device on another node",
        NAMED,
        *_same("options.device_index.0", 2),
        "`options.device_index[0]` device 2 is on node 1",
        "options.device_index[]",
    ),
    Case(
        "named offsets short",
        NAMED,
        *_same("options.device_offsets.-", None),
        "`options.device_offsets` must have n_entries + 1",
        "options.device_offsets",
    ),
    Case(
        "named offsets not from 0",
        NAMED,
        *_same("options.device_offsets.0", 1),
        "`options.device_offsets[0]` must be 0",
        "options.device_offsets[]",
    ),
    Case(
        "named index without offsets",
        NAMED,
        *_same("options.device_offsets.clear", None),
        "`options.device_offsets` must be set when device_index is given",
        "options.device_offsets",
    ),
    Case(
        "named devices, state without devices",
        NAMED,
        _clear_state_devices,
        _clear_state_devices,
        "names devices, so the state must send them",
        "options.device_offsets",
    ),
    # ---- workload: share, kind, QoS
    Case(
        "share 0",
        SHARE,
        *_same("workload.accelerator_share", 0.0),
        "`workload.accelerator_share` must be in (0, 1]",
        "workload.accelerator_share",
    ),
    Case(
        "share above 1 (workload)",
        SHARE,
        *_same("workload.accelerator_share", 1.5),
        "`workload.accelerator_share` must be in (0, 1]",
        "workload.accelerator_share",
    ),
    Case(
        "share NaN (workload)",
        SHARE,
        *_same("workload.accelerator_share", NAN),
        "`workload.accelerator_share` must be in (0, 1]",
        "workload.accelerator_share",
    ),
    Case(
        "share with whole devices",
        SHARE,
        *_same("workload.accelerators", 2),
        "`workload.accelerators` must be 0 with workload.accelerator_share",
        "workload.accelerators",
    ),
    Case(
        "kind empty",
        _plain,
        _pb_kind(""),
        _set("workload.kind", ""),
        "`workload.kind_name` must be set",
        "workload.kind_name",
        http_named="`workload.kind` must be a non-empty string",
        http_label="workload.kind",
    ),
    Case(
        "kind too long",
        _plain,
        _pb_kind("k" * 65),
        _set("workload.kind", "k" * 65),
        "`workload.kind` must be at most 64 characters",
        "workload.kind",
    ),
    Case(
        "NUL in kind",
        _plain,
        _pb_kind("in\x00fer"),
        _set("workload.kind", "in\x00fer"),
        "`workload.kind` must not contain control characters",
        "workload.kind",
    ),
    Case(
        "kind name disagrees with the enum",
        _plain,
        _set("workload.kind_name", "infer"),
        None,
        "`workload.kind_name` disagrees with workload.kind",
        "workload.kind_name",
    ),
    Case(
        "QoS too long",
        SHARE,
        *_same("workload.qos_class", "q" * 65),
        "`workload.qos_class` must be at most 64 characters",
        "workload.qos_class",
    ),
    Case(
        "escape in QoS",
        SHARE,
        *_same("workload.qos_class", "LS\x1b[31m"),
        "`workload.qos_class` must not contain control characters",
        "workload.qos_class",
    ),
    Case(
        "fractional accelerators (HTTP)",
        _plain,
        None,
        _set("workload.accelerators", 0.44),
        "`workload.accelerator_share`",
        "workload.accelerators",
        http_named="`workload.accelerators` is invalid",
    ),
    # ---- hardware: a zero-memory class on a node with accelerators
    Case(
        "accelerator class with zero memory",
        _plain,
        *_same("state.hardware.1.accelerator_memory_gb", 0.0),
        "`state.hardware[1].accelerator_memory_gb` is 0 (a CPU pool) but node 0",
        "state.hardware[].accelerator_memory_gb",
    ),
    Case(
        "more devices than a snapshot may hold",
        _plain,
        *_same("state.accelerators_total.0", 2**31 - 1),
        "`state.accelerators_total` must sum to at most 1000000 devices",
        "state.accelerators_total",
    ),
    # ---- workload.gang_size: the most nodes one option may span (schema 2)
    Case(
        "option spanning more nodes than gang_size",
        _spread,
        *_same("workload.gang_size", 1),
        "spans 2 nodes, more than `workload.gang_size` (1)",
        "options[]",
    ),
    Case(
        "gang_size below 1",
        _plain,
        *_same("workload.gang_size", 0),
        "`workload.gang_size` must be >= 1, got 0",
        "workload.gang_size",
    ),
    # ---- schema 1 may carry no schema-2 field
    Case(
        "v1 with devices",
        _v1_devices,
        None,
        None,
        "`state.device_offsets` is a schema 2 field",
        "state.device_offsets",
    ),
    Case(
        "v1 naming devices",
        lambda r: v2.as_schema_1(_named_only(r)),
        None,
        None,
        "`options.device_offsets` is a schema 2 field",
        "options.device_offsets",
    ),
    Case(
        "v1 with a share",
        _v1_share,
        None,
        None,
        "`workload.accelerator_share` is a schema 2 field",
        "workload.accelerator_share",
    ),
    Case(
        "v1 with a QoS class",
        _v1,
        *_same("workload.qos_class", "BE"),
        "`workload.qos_class` is a schema 2 field",
        "workload.qos_class",
    ),
    Case(
        "v1 with production's distribution",
        _v1_dist,
        None,
        None,
        "`production.probabilities` is a schema 2 field",
        "production.probabilities",
    ),
    Case(
        "v1 with a kind name",
        _v1,
        _set("workload.kind_name", "train"),
        None,
        "`workload.kind_name` is a schema 2 field",
        "workload.kind_name",
    ),
    Case(
        "v1 with an open kind",
        _v1,
        None,
        _set("workload.kind", "serve"),
        "`workload.kind` must be train, finetune, infer or batch in schema_version 1",
        "workload.kind",
    ),
    Case(
        "v1 leaving a capability out (HTTP)",
        _v1,
        None,
        lambda b: b["state"]["hardware"][0].pop("peak_dense_tflops"),
        "`state.hardware[0].peak_dense_tflops` must be set in schema_version 1",
        "state.hardware[].peak_dense_tflops",
    ),
]


def _named_only(r: MirrorRequest) -> MirrorRequest:
    """Options naming devices, the state without them: in a v1 request the state's
    devices would be refused first, so this isolates the options' field."""
    named = v2.naming_devices(r)
    state = dataclasses.replace(
        named.state,
        device_offsets=EMPTY_I64,
        device_hardware=EMPTY_I32,
        device_free_share=EMPTY_F32,
        device_free_memory_gb=EMPTY_F32,
        device_ids=(),
    )
    return dataclasses.replace(named, state=state)


def _rejections(service: Service, transport: str, label: str) -> float:
    labels = {"transport": transport, "kind": "mirror", "field": label}
    value = service.metrics.registry.get_sample_value("understudy_ingest_rejections_total", labels)
    return value or 0.0


def _counted(service: Service, transport: str) -> float:
    labels = {"transport": transport, "kind": "mirror", "result": "rejected"}
    return service.metrics.registry.get_sample_value("understudy_ingest_total", labels) or 0.0


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_bad_v2_input_is_refused_naming_the_field_on_both_transports(
    service: Service,
    stub: shadow_pb2_grpc.ShadowEvaluationStub,
    auth: tuple[tuple[str, str], ...],
    http: httpx.Client,
    requests_sample: list[MirrorRequest],
    case: Case,
) -> None:
    base = case.base(requests_sample[0])
    msg = mirror_request_to_pb(base)
    body: Body = json.loads(mirror_to_json(base))
    sent_grpc = case.grpc is not None or case.http is None
    sent_http = case.http is not None or case.grpc is None
    if sent_grpc:
        if case.grpc is not None:
            case.grpc(msg)
        with pytest.raises(grpc.RpcError) as err:
            stub.Mirror(msg, metadata=auth)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert case.named in (err.value.details() or ""), err.value.details()
        assert _counted(service, "grpc") == 1
        assert _rejections(service, "grpc", case.label) == 1, "counted under another field"
    if sent_http:
        if case.http is not None:
            case.http(body)
        response = http.post("/v1/mirror", content=json.dumps(body))
        assert response.status_code == 400, response.text
        message = response.json()["message"]
        assert (case.http_named or case.named) in message, message
        if case.http_named is not None and case.grpc is None:
            assert case.named in message, message  # both parts, e.g. the share hint
        assert _counted(service, "http") == 1
        label = case.http_label or case.label
        assert _rejections(service, "http", label) == 1, "counted under another field"
    assert service.journal.head_seq == 0, "a refused request must not reach the journal"


def test_every_v2_variant_used_above_is_accepted_on_both_transports(
    service: Service,
    stub: shadow_pb2_grpc.ShadowEvaluationStub,
    auth: tuple[tuple[str, str], ...],
    http: httpx.Client,
    requests_sample: list[MirrorRequest],
) -> None:
    """The rows above fail because of their one change: the bases themselves are valid."""
    bases = [DEV, NAMED, SHARE, DIST, v2.unknown_capabilities, _plain, _v1, _spread]
    bases += [_v1_spread_beyond_gang]  # schema 1: a gang beyond gang_size keeps its meaning
    for i, make in enumerate(bases):
        request = dataclasses.replace(make(requests_sample[i]), request_id=f"v2-ok-{i}")
        ack = stub.Mirror(mirror_request_to_pb(request), metadata=auth)
        assert ack.status == shadow_pb2.ACK_STATUS_ACCEPTED, ack
        body = json.loads(mirror_to_json(request))
        body["request_id"] = f"v2-ok-http-{i}"
        response = http.post("/v1/mirror", content=json.dumps(body))
        assert response.status_code == 202, response.text
    assert _counted(service, "grpc") == 0 and _counted(service, "http") == 0
