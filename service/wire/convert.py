"""Converters between protobuf messages and the contract's dataclasses.

One function per message pair, as in MLServer's ``grpc/converters.py``. Packed
repeated fields become numpy arrays in one call each (cheap: no per-element
Python objects). Structural problems that protobuf's defaults would hide —
a missing sub-message, an unspecified enum — are raised here as
`InvalidInput`; content rules live in `service.contract.validation`.

Schema versions (docs/contract.md, "Versioning"): a schema-1 message keeps its
old meaning — an unset capability number is 0 (proto3 without presence could
not send a 0, so unset was how 0 travelled) and the kind is the enum; it may
set no schema-2 field (`kind_name` is refused here, the others by the
validator, which sees them on the dataclass). From schema 2 on, an unset
capability is unknown (None) and the kind is `kind_name`, or the enum when
`kind_name` is empty; both set must agree.
"""

from __future__ import annotations

from service.contract import (
    ClusterState,
    FailureKind,
    InvalidInput,
    MirrorRequest,
    Outcome,
    PlacementOptions,
    ProductionDecision,
    Workload,
    WorkloadKind,
)
from service.contract.actions import options_from_columns
from service.contract.errors import MissingField
from service.contract.hardware import CAPABILITIES, HardwareClass
from service.contract.request import SCHEMA_VERSION
from service.contract.schema_versions import V1_REFUSAL, V1_SCHEMA
from service.contract.state import state_from_columns
from service.contract.workload import workload_from_fields
from service.wire.snapshot_cache import SnapshotCache
from service.wire.understudy.v1 import contract_pb2 as pb

_KIND_FROM_PB = {
    pb.WORKLOAD_KIND_TRAIN: WorkloadKind.TRAIN,
    pb.WORKLOAD_KIND_FINETUNE: WorkloadKind.FINETUNE,
    pb.WORKLOAD_KIND_INFER: WorkloadKind.INFER,
    pb.WORKLOAD_KIND_BATCH: WorkloadKind.BATCH,
}
_KIND_TO_PB: dict[str, pb.WorkloadKind] = {v.value: k for k, v in _KIND_FROM_PB.items()}
_FAILURE_FROM_PB = {
    pb.FAILURE_KIND_NONE: FailureKind.NONE,
    pb.FAILURE_KIND_OOM: FailureKind.OOM,
    pb.FAILURE_KIND_PREEMPTED: FailureKind.PREEMPTED,
    pb.FAILURE_KIND_CRASHED: FailureKind.CRASHED,
    pb.FAILURE_KIND_OTHER: FailureKind.OTHER,
}
_FAILURE_TO_PB = {v: k for k, v in _FAILURE_FROM_PB.items()}
# An outcome that leaves `failure` out means "did not fail", on both transports:
# HTTP defaults the absent field to "none", and proto3 cannot tell an absent enum
# from its zero value, so UNSPECIFIED is read the same way (issue 20 item 9).
# Values outside the enum are still refused.
_FAILURE_FROM_PB[pb.FAILURE_KIND_UNSPECIFIED] = FailureKind.NONE


def _hardware_from_pb(h: pb.HardwareClass, schema_version: int) -> HardwareClass:
    unset = 0.0 if schema_version == V1_SCHEMA else None
    numbers = [getattr(h, name) if h.HasField(name) else unset for name in CAPABILITIES]
    return HardwareClass(h.name, *numbers)


def state_from_pb(msg: pb.ClusterState, schema_version: int = SCHEMA_VERSION) -> ClusterState:
    """Build a `ClusterState` from its protobuf message, capability numbers by `schema_version`."""
    hardware = tuple(_hardware_from_pb(h, schema_version) for h in msg.hardware)
    return state_from_columns(msg, hardware)


def _kind_from_pb(msg: pb.Workload, schema_version: int) -> str:
    enum_kind = _KIND_FROM_PB.get(msg.kind)
    if schema_version == V1_SCHEMA:
        if msg.kind_name:
            raise InvalidInput("workload.kind_name", V1_REFUSAL)
        if enum_kind is None:
            raise InvalidInput(
                "workload.kind", f"must be train, finetune, infer or batch, got {msg.kind}"
            )
        return enum_kind.value
    if not msg.kind_name:
        if enum_kind is None:
            raise InvalidInput(
                "workload.kind_name",
                f"must be set (or workload.kind to a known kind), got kind {msg.kind}",
            )
        return enum_kind.value
    if msg.kind != pb.WORKLOAD_KIND_UNSPECIFIED and (
        enum_kind is None or enum_kind.value != msg.kind_name
    ):
        raise InvalidInput(
            "workload.kind_name",
            f"disagrees with workload.kind ({msg.kind}): set one, or both to the same kind",
        )
    return msg.kind_name


def workload_from_pb(msg: pb.Workload, schema_version: int = SCHEMA_VERSION) -> Workload:
    """Build a `Workload`; the kind is read by `schema_version` (module docstring)."""
    return workload_from_fields(
        msg,
        _kind_from_pb(msg, schema_version),
        msg.slo_seconds if msg.HasField("slo_seconds") else None,
        msg.work_units if msg.HasField("work_units") else None,
        msg.accelerator_share if msg.HasField("accelerator_share") else None,
        msg.qos_class,
    )


def options_from_pb(msg: pb.PlacementOptions) -> PlacementOptions:
    """Build `PlacementOptions` from its protobuf message."""
    return options_from_columns(msg)


def _production_from_pb(msg: pb.ProductionDecision) -> ProductionDecision:
    # An empty repeated field is "not sent": proto3 cannot tell it from an empty list.
    return ProductionDecision(
        option=msg.option,
        propensity=msg.propensity if msg.HasField("propensity") else None,
        probabilities=tuple(msg.probabilities) if len(msg.probabilities) else None,
        defer_probability=msg.defer_probability if msg.HasField("defer_probability") else None,
    )


def mirror_request_from_pb(
    msg: pb.MirrorRequest,
    state: ClusterState | None = None,
    *,
    snapshots: SnapshotCache | None = None,
) -> MirrorRequest:
    """Build a `MirrorRequest` from its protobuf message; `state`, when given, is the
    already converted `msg.state` (the client reuses one scheduling cycle's snapshot).

    With `snapshots`, the state is looked up in that cache by its exact bytes and
    decoded only on a miss (`service.wire.snapshot_cache`): the requests of one
    scheduling cycle then share one `ClusterState`, decoded once. The same request
    either way.
    """
    for part in ("state", "workload", "options"):
        if not msg.HasField(part):
            raise MissingField(part, "is required")
    if state is None:
        state = _state_of(msg, snapshots)
    return MirrorRequest(
        schema_version=msg.schema_version,
        request_id=msg.request_id,
        request_time=msg.request_time,
        state=state,
        workload=workload_from_pb(msg.workload, msg.schema_version),
        options=options_from_pb(msg.options),
        production=_production_from_pb(msg.production) if msg.HasField("production") else None,
        quota_remaining=msg.quota_remaining if msg.HasField("quota_remaining") else None,
    )


def _state_of(msg: pb.MirrorRequest, snapshots: SnapshotCache | None) -> ClusterState:
    """`msg.state` decoded, through `snapshots` (by its exact bytes) when given."""
    version = msg.schema_version
    if snapshots is None:
        return state_from_pb(msg.state, version)
    raw = msg.state.SerializeToString()
    return snapshots.get(version, raw, lambda: state_from_pb(msg.state, version))


def outcome_from_pb(msg: pb.Outcome) -> Outcome:
    """Build an `Outcome` from its protobuf message."""
    failure = _FAILURE_FROM_PB.get(msg.failure)
    if failure is None:
        raise InvalidInput(
            "failure", f"must be none, oom, preempted, crashed or other, got {msg.failure}"
        )

    def opt(name: str) -> float | None:
        return float(getattr(msg, name)) if msg.HasField(name) else None

    return Outcome(
        request_id=msg.request_id,
        observed_at=msg.observed_at,
        queue_delay_s=opt("queue_delay_s"),
        throughput=opt("throughput"),
        completion_time_s=opt("completion_time_s"),
        slo_met=msg.slo_met if msg.HasField("slo_met") else None,
        failure=failure,
        production=_production_from_pb(msg.production) if msg.HasField("production") else None,
    )


def state_to_pb(state: ClusterState) -> pb.ClusterState:
    """Columnar protobuf form of a `ClusterState`."""
    msg = pb.ClusterState(
        node_ids=state.node_ids,
        hardware=[hardware_to_pb(h) for h in state.hardware],
        node_hardware=state.node_hardware.tolist(),
        accelerators_free=state.accelerators_free.tolist(),
        accelerators_total=state.accelerators_total.tolist(),
        cpu_free=state.cpu_free.tolist(),
        cpu_total=state.cpu_total.tolist(),
        memory_free_gb=state.memory_free_gb.tolist(),
        memory_total_gb=state.memory_total_gb.tolist(),
        utilisation=state.utilisation.tolist(),
        queue_length=state.queue_length.tolist(),
        healthy=state.healthy.tolist(),
        draining=state.draining.tolist(),
        zone=state.zone,
        locality=state.locality,
    )
    if any(state.labels):
        offsets = [0]
        for labels in state.labels:
            msg.labels.extend(sorted(labels))
            offsets.append(len(msg.labels))
        msg.label_offsets.extend(offsets)
    if state.has_devices:
        msg.device_offsets.extend(state.device_offsets.tolist())
        msg.device_hardware.extend(state.device_hardware.tolist())
        msg.device_free_share.extend(state.device_free_share.tolist())
        msg.device_free_memory_gb.extend(state.device_free_memory_gb.tolist())
        msg.device_ids.extend(state.device_ids)
    return msg


def hardware_to_pb(h: HardwareClass) -> pb.HardwareClass:
    """Protobuf form of a class: an unknown (None) capability is left unset."""
    known = {name: value for name in CAPABILITIES if (value := getattr(h, name)) is not None}
    return pb.HardwareClass(name=h.name, **known)


def workload_to_pb(w: Workload, schema_version: int = SCHEMA_VERSION) -> pb.Workload:
    """Protobuf form of a `Workload`: the enum for a known kind, and from schema 2 on
    (or for a kind the enum cannot say, which the validator then refuses in schema 1)
    the kind's name too."""
    known = _KIND_TO_PB.get(str(w.kind))
    msg = pb.Workload(
        workload_id=w.workload_id,
        kind=pb.WORKLOAD_KIND_UNSPECIFIED if known is None else known,
        model_family=w.model_family,
        model_size_b=w.model_size_b,
        accelerators=w.accelerators,
        accelerator_memory_gb=w.accelerator_memory_gb,
        cpu_per_node=w.cpu_per_node,
        memory_per_node_gb=w.memory_per_node_gb,
        gang_size=w.gang_size,
        priority=w.priority,
        tenant=w.tenant,
        allowed_hardware=sorted(w.allowed_hardware),
        affinity=sorted(w.affinity),
        anti_affinity=sorted(w.anti_affinity),
    )
    if w.slo_seconds is not None:
        msg.slo_seconds = w.slo_seconds
    if w.work_units is not None:
        msg.work_units = w.work_units
    if schema_version != V1_SCHEMA or known is None:
        msg.kind_name = w.kind
    if w.qos_class:
        msg.qos_class = w.qos_class
    if w.accelerator_share is not None:
        msg.accelerator_share = w.accelerator_share
    return msg


def _production_to_pb(p: ProductionDecision) -> pb.ProductionDecision:
    msg = pb.ProductionDecision(option=p.option)
    if p.propensity is not None:
        msg.propensity = p.propensity
    if p.probabilities is not None:
        msg.probabilities.extend(p.probabilities)
    if p.defer_probability is not None:
        msg.defer_probability = p.defer_probability
    return msg


def mirror_request_to_pb(
    r: MirrorRequest, state: pb.ClusterState | None = None
) -> pb.MirrorRequest:
    """Protobuf form of a `MirrorRequest` (what the journal stores and clients send).

    `state`, when given, is `state_to_pb(r.state)` already built (requests sharing
    one snapshot, as a batch's do, convert it once).
    """
    msg = pb.MirrorRequest(
        schema_version=r.schema_version,
        request_id=r.request_id,
        request_time=r.request_time,
        state=state_to_pb(r.state) if state is None else state,
        workload=workload_to_pb(r.workload, r.schema_version),
        options=pb.PlacementOptions(
            node_offsets=r.options.node_offsets.tolist(),
            node_index=r.options.node_index.tolist(),
            accelerators=r.options.accelerators.tolist(),
            option_ids=r.options.option_ids,
            device_offsets=r.options.device_offsets.tolist(),
            device_index=r.options.device_index.tolist(),
        ),
    )
    if r.production is not None:
        msg.production.CopyFrom(_production_to_pb(r.production))
    if r.quota_remaining is not None:
        msg.quota_remaining = r.quota_remaining
    return msg


def outcome_to_pb(o: Outcome) -> pb.Outcome:
    """Protobuf form of an `Outcome`."""
    msg = pb.Outcome(
        request_id=o.request_id, observed_at=o.observed_at, failure=_FAILURE_TO_PB[o.failure]
    )
    for name in ("queue_delay_s", "throughput", "completion_time_s", "slo_met"):
        value = getattr(o, name)
        if value is not None:
            setattr(msg, name, value)
    if o.production is not None:
        msg.production.CopyFrom(_production_to_pb(o.production))
    return msg
