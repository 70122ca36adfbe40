"""Converters from the HTTP models to contract dataclasses (and the journal payload)."""

from __future__ import annotations

import pydantic

from service.contract import (
    FailureKind,
    InvalidInput,
    MirrorRequest,
    Outcome,
    ProductionDecision,
    WorkloadKind,
)
from service.contract.actions import options_from_columns
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
    return InvalidInput(field, f"is invalid: {first['msg']}")


def _production(
    p: ProductionDecisionModel | structs.ProductionDecision | None,
) -> ProductionDecision | None:
    return None if p is None else ProductionDecision(option=p.option, propensity=p.propensity)


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
    return MirrorRequest(
        schema_version=m.schema_version,
        request_id=m.request_id,
        request_time=m.request_time,
        state=state_from_columns(m.state),
        workload=workload_from_fields(w, WorkloadKind(w.kind), w.slo_seconds, w.work_units),
        options=options_from_columns(m.options),
        production=_production(m.production),
        quota_remaining=m.quota_remaining,
    )


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
        ),
        options=PlacementOptionsModel(
            node_offsets=o.node_offsets.tolist(),
            node_index=o.node_index.tolist(),
            accelerators=o.accelerators.tolist(),
            option_ids=list(o.option_ids),
        ),
        production=None
        if request.production is None
        else ProductionDecisionModel(
            option=request.production.option, propensity=request.production.propensity
        ),
        quota_remaining=request.quota_remaining,
    )
    return model.model_dump_json().encode()
