"""Converters from the HTTP models to contract dataclasses (and the journal payload).

Schema versions over HTTP (docs/contract.md, "Versioning"): a schema-1 body keeps
its old meaning — every capability number given, a kind of the four the v1
enum had, no schema-2 field — and is checked for that here, before the body is
encoded for the journal, because the protobuf form of a schema-1 request reads
an unset capability as 0 (service.wire.convert): an HTTP v1 body that left a
number out must be refused, not journaled as 0.
"""

from __future__ import annotations

from typing import Any

import pydantic

from service.contract import (
    FailureKind,
    InvalidInput,
    MirrorRequest,
    Outcome,
    ProductionDecision,
)
from service.contract.actions import options_from_columns
from service.contract.schema_versions import V1_SCHEMA, check_schema_1
from service.contract.state import state_from_columns
from service.contract.workload import workload_from_fields
from service.transport.http import structs
from service.transport.http.models import (
    ClusterStateModel,
    HardwareClassModel,
    MirrorRequestModel,
    OutcomeModel,
    PlacementOptionsModel,
    ProductionDecisionModel,
    WorkloadModel,
)
from service.wire.convert import mirror_request_to_pb, outcome_to_pb


def invalid_from_pydantic(exc: pydantic.ValidationError) -> InvalidInput:
    """The first pydantic error as `InvalidInput` with a dotted field path."""
    first = exc.errors(include_url=False)[0]
    parts: list[str] = []
    for part in first["loc"]:
        if isinstance(part, int) and parts:
            parts[-1] += f"[{part}]"
        else:
            parts.append(str(part))
    field = ".".join(parts) or "body"
    hint = _HINTS.get(field)
    if hint is not None and isinstance(first.get("input"), float):
        return InvalidInput(field, f"is invalid: {first['msg']}; {hint}")
    return InvalidInput(field, f"is invalid: {first['msg']}")


_HINTS = {
    "workload.accelerators": (
        "it counts whole devices: for a share of one device (e.g. 0.44) send "
        "`workload.accelerator_share` with workload.accelerators 0 (schema_version 2)"
    ),
}
"""What to do instead, for a number of the wrong kind where the contract has a field for it."""


def _production(
    p: ProductionDecisionModel | structs.ProductionDecision | None,
) -> ProductionDecision | None:
    if p is None:
        return None
    # An empty list is "not sent", as on the protobuf wire (which cannot tell the two apart).
    return ProductionDecision(
        option=p.option,
        propensity=p.propensity,
        probabilities=tuple(p.probabilities) if p.probabilities else None,
        defer_probability=p.defer_probability,
    )


def outcome_from_model(m: OutcomeModel | structs.Outcome) -> tuple[Outcome, bytes]:
    """The contract outcome and its protobuf payload, from a parsed body (pydantic or msgspec:
    the same field names)."""
    outcome = Outcome(
        request_id=m.request_id,
        observed_at=m.observed_at,
        queue_delay_s=m.queue_delay_s,
        throughput=m.throughput,
        completion_time_s=m.completion_time_s,
        slo_met=m.slo_met,
        failure=FailureKind(m.failure),
        production=_production(m.production),
    )
    return outcome, bytes(outcome_to_pb(outcome).SerializeToString())


def mirror_from_json(body: bytes) -> tuple[MirrorRequest, bytes]:
    """Parse, convert and encode an HTTP mirror body; payload is the protobuf bytes."""
    try:
        m = MirrorRequestModel.model_validate_json(body)
    except pydantic.ValidationError as exc:
        raise invalid_from_pydantic(exc) from exc
    request = request_from_model(m)
    return request, _encode_mirror(request)


def request_from_model(m: MirrorRequestModel | structs.MirrorRequest) -> MirrorRequest:
    """The contract request from a parsed body (pydantic or msgspec: the same field names)."""
    w = m.workload
    request = MirrorRequest(
        schema_version=m.schema_version,
        request_id=m.request_id,
        request_time=m.request_time,
        state=state_from_columns(m.state),
        workload=workload_from_fields(
            w, w.kind, w.slo_seconds, w.work_units, w.accelerator_share, w.qos_class
        ),
        options=options_from_columns(m.options),
        production=_production(m.production),
        quota_remaining=m.quota_remaining,
    )
    if request.schema_version == V1_SCHEMA:
        check_schema_1(request)  # before encoding: module docstring
    return request


def _encode_mirror(request: MirrorRequest) -> bytes:
    # Encoded before Ingest validates: a refused request wastes this encoding, but
    # refusals are rare and the journal needs the canonical protobuf bytes.
    return bytes(mirror_request_to_pb(request).SerializeToString())


def outcome_from_json(body: bytes) -> tuple[Outcome, bytes]:
    """Parse, convert and encode an HTTP outcome body."""
    try:
        m = OutcomeModel.model_validate_json(body)
    except pydantic.ValidationError as exc:
        raise invalid_from_pydantic(exc) from exc
    return outcome_from_model(m)


def mirror_to_json(request: MirrorRequest) -> bytes:
    """The HTTP JSON body for `request` (used by clients, the demo and tests)."""
    s, w, o = request.state, request.workload, request.options
    offsets: list[int] = []
    labels: list[str] = []
    if any(s.labels):
        offsets.append(0)
        for node_labels in s.labels:
            labels.extend(sorted(node_labels))
            offsets.append(len(labels))
    model = MirrorRequestModel(
        schema_version=request.schema_version,
        request_id=request.request_id,
        request_time=request.request_time,
        state=ClusterStateModel(
            node_ids=list(s.node_ids),
            hardware=[
                HardwareClassModel(
                    name=h.name,
                    accelerator_memory_gb=h.accelerator_memory_gb,
                    peak_dense_tflops=h.peak_dense_tflops,
                    memory_bandwidth_gbps=h.memory_bandwidth_gbps,
                    interconnect_gbps=h.interconnect_gbps,
                )
                for h in s.hardware
            ],
            device_offsets=s.device_offsets.tolist(),
            device_hardware=s.device_hardware.tolist(),
            device_free_share=s.device_free_share.tolist(),
            device_free_memory_gb=s.device_free_memory_gb.tolist(),
            device_ids=list(s.device_ids),
            node_hardware=s.node_hardware.tolist(),
            accelerators_free=s.accelerators_free.tolist(),
            accelerators_total=s.accelerators_total.tolist(),
            cpu_free=s.cpu_free.tolist(),
            cpu_total=s.cpu_total.tolist(),
            memory_free_gb=s.memory_free_gb.tolist(),
            memory_total_gb=s.memory_total_gb.tolist(),
            utilisation=s.utilisation.tolist(),
            queue_length=s.queue_length.tolist(),
            healthy=s.healthy.tolist(),
            draining=s.draining.tolist(),
            zone=list(s.zone),
            locality=list(s.locality),
            label_offsets=offsets,
            labels=labels,
        ),
        workload=WorkloadModel(
            workload_id=w.workload_id,
            kind=str(w.kind),
            model_family=w.model_family,
            model_size_b=w.model_size_b,
            accelerators=w.accelerators,
            accelerator_memory_gb=w.accelerator_memory_gb,
            cpu_per_node=w.cpu_per_node,
            memory_per_node_gb=w.memory_per_node_gb,
            gang_size=w.gang_size,
            priority=w.priority,
            tenant=w.tenant,
            slo_seconds=w.slo_seconds,
            work_units=w.work_units,
            allowed_hardware=sorted(w.allowed_hardware),
            affinity=sorted(w.affinity),
            anti_affinity=sorted(w.anti_affinity),
            qos_class=w.qos_class,
            accelerator_share=w.accelerator_share,
        ),
        options=PlacementOptionsModel(
            node_offsets=o.node_offsets.tolist(),
            node_index=o.node_index.tolist(),
            accelerators=o.accelerators.tolist(),
            option_ids=list(o.option_ids),
            device_offsets=o.device_offsets.tolist(),
            device_index=o.device_index.tolist(),
        ),
        production=None if request.production is None else _production_model(request.production),
        quota_remaining=request.quota_remaining,
    )
    return model.model_dump_json(exclude=_unset_v2_fields(request)).encode()


def _unset_v2_fields(request: MirrorRequest) -> dict[str, Any]:
    """The schema-2 fields `request` leaves at their defaults, to leave out of its body:
    a request that uses none of them is written exactly as before schema 2 (byte for byte)."""
    s, w, o, p = request.state, request.workload, request.options, request.production
    exclude: dict[str, Any] = {}
    if not s.has_devices:
        exclude["state"] = set(_DEVICE_COLUMNS)
    workload = {"qos_class"} if not w.qos_class else set()
    if w.accelerator_share is None:
        workload.add("accelerator_share")
    if workload:
        exclude["workload"] = workload
    if not o.names_devices:
        exclude["options"] = {"device_offsets", "device_index"}
    if p is not None:
        production = {"probabilities"} if p.probabilities is None else set()
        if p.defer_probability is None:
            production.add("defer_probability")
        if production:
            exclude["production"] = production
    return exclude


_DEVICE_COLUMNS = (
    "device_offsets",
    "device_hardware",
    "device_free_share",
    "device_free_memory_gb",
    "device_ids",
)


def _production_model(p: ProductionDecision) -> ProductionDecisionModel:
    return ProductionDecisionModel(
        option=p.option,
        propensity=p.propensity,
        probabilities=list(p.probabilities or ()),
        defer_probability=p.defer_probability,
    )
