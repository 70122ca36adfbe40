"""Pydantic models of the HTTP JSON bodies.

They mirror the protobuf messages field for field (same names, same columnar
shape), so one document describes both transports. They stop at the transport:
`service.transport.http.convert` turns them into contract dataclasses.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

# The protobuf field types, so a JSON number that its protobuf twin could not
# hold is refused here, naming the field, instead of failing in the encoder.
Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
UInt32 = Annotated[int, Field(ge=0, le=2**32 - 1)]
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
Float32 = Annotated[float, Field(ge=-3.4028234663852886e38, le=3.4028234663852886e38)]


class _Strict(BaseModel):
    # strict: JSON `true` is not a number and "1" is not an integer here.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class HardwareClassModel(_Strict):
    """Capabilities of one accelerator of a class; a number omitted or null is unknown
    (schema 2; schema 1 requires every number, docs/contract.md "Versioning")."""

    name: str
    accelerator_memory_gb: float | None = None
    peak_dense_tflops: float | None = None
    memory_bandwidth_gbps: float | None = None
    interconnect_gbps: float | None = None


class ClusterStateModel(_Strict):
    """Columnar cluster snapshot: one value per node in every list."""

    node_ids: list[str]
    hardware: list[HardwareClassModel]
    node_hardware: list[UInt32]
    # May be left empty when devices are sent: then derived from them.
    accelerators_free: list[Int32] = Field(default_factory=list)
    accelerators_total: list[Int32] = Field(default_factory=list)
    cpu_free: list[Float32]
    cpu_total: list[Float32]
    memory_free_gb: list[Float32]
    memory_total_gb: list[Float32]
    utilisation: list[Float32]
    queue_length: list[Int32]
    healthy: list[bool]
    draining: list[bool]
    zone: list[str]
    locality: list[str]
    label_offsets: list[UInt32] = Field(default_factory=list)
    labels: list[str] = Field(default_factory=list)
    device_offsets: list[Int64] = Field(default_factory=list)
    device_hardware: list[UInt32] = Field(default_factory=list)
    device_free_share: list[Float32] = Field(default_factory=list)
    device_free_memory_gb: list[Float32] = Field(default_factory=list)
    device_ids: list[str] = Field(default_factory=list)


class WorkloadModel(_Strict):
    """The job to place."""

    workload_id: str
    # Open vocabulary (schema 2): known train, finetune, infer, batch; bounded by the validator.
    kind: str
    model_family: str
    model_size_b: float
    accelerators: Int32
    accelerator_memory_gb: float
    cpu_per_node: float
    memory_per_node_gb: float
    gang_size: Int32
    priority: Int32
    tenant: str
    slo_seconds: float | None = None
    work_units: float | None = None
    allowed_hardware: list[str] = Field(default_factory=list)
    affinity: list[str] = Field(default_factory=list)
    anti_affinity: list[str] = Field(default_factory=list)
    qos_class: str = ""
    accelerator_share: float | None = None


class PlacementOptionsModel(_Strict):
    """Options in CSR form (see docs/contract.md)."""

    node_offsets: list[Int64]
    node_index: list[Int32]
    accelerators: list[Int32]
    option_ids: list[str] = Field(default_factory=list)
    device_offsets: list[Int64] = Field(default_factory=list)
    device_index: list[Int32] = Field(default_factory=list)


class ProductionDecisionModel(_Strict):
    """Production's chosen option (-1 = defer), its propensity, and (schema 2) its whole
    distribution: one probability per option (empty = not sent) and defer's."""

    option: Int32
    propensity: float | None = None
    probabilities: list[float] = Field(default_factory=list)
    defer_probability: float | None = None


class MirrorRequestModel(_Strict):
    """A mirrored placement request."""

    schema_version: UInt32
    request_id: str
    request_time: float
    state: ClusterStateModel
    workload: WorkloadModel
    options: PlacementOptionsModel
    production: ProductionDecisionModel | None = None
    quota_remaining: float | None = None


class OutcomeModel(_Strict):
    """A delayed outcome report."""

    request_id: str
    observed_at: float
    queue_delay_s: float | None = None
    throughput: float | None = None
    completion_time_s: float | None = None
    slo_met: bool | None = None
    failure: Literal["none", "oom", "preempted", "crashed", "other"] = "none"
    production: ProductionDecisionModel | None = None


class AckModel(BaseModel):
    """An ack: status and the echoed id. Never a decision."""

    status: Literal["accepted", "shed"]
    request_id: str


class ErrorModel(BaseModel):
    """An error body: which field was wrong and what was expected."""

    error: str
    field: str | None = None
    message: str
