"""msgspec twins of the HTTP body models, for decoding on the hot path.

`service.transport.http.models` (pydantic) stays the documented contract: it
generates the OpenAPI schema and words every refusal. These Structs accept
exactly what those models accept, or less (msgspec refuses NaN, Infinity and
numbers beyond a double, which pydantic lets through to the contract rules),
and decode a 10-20 KB body several times faster because msgspec builds the
lists in C with the type and range checks on the way. Whatever they refuse is
decoded again by the pydantic models, so a refusal's status and message never
depend on which decoder ran first (`service.transport.http.convert`);
tests/transport/test_http_fast_decode.py holds the two to agreement.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

# The protobuf field types, as in models.py: a number its protobuf twin could not hold.
Int32 = Annotated[int, Meta(ge=-(2**31), le=2**31 - 1)]
UInt32 = Annotated[int, Meta(ge=0, le=2**32 - 1)]
Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
Float32 = Annotated[float, Meta(ge=-3.4028234663852886e38, le=3.4028234663852886e38)]


class _Strict(Struct, forbid_unknown_fields=True):
    """No unknown keys (pydantic's ``extra="forbid"``); msgspec never coerces types."""


class HardwareClass(_Strict):
    name: str
    accelerator_memory_gb: float | None = None
    peak_dense_tflops: float | None = None
    memory_bandwidth_gbps: float | None = None
    interconnect_gbps: float | None = None


class ClusterState(_Strict, kw_only=True):  # the node counts may be left empty
    node_ids: list[str]
    hardware: list[HardwareClass]
    node_hardware: list[UInt32]
    accelerators_free: list[Int32] = []
    accelerators_total: list[Int32] = []
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
    label_offsets: list[UInt32] = []
    labels: list[str] = []
    device_offsets: list[Int64] = []
    device_hardware: list[UInt32] = []
    device_free_share: list[Float32] = []
    device_free_memory_gb: list[Float32] = []
    device_ids: list[str] = []


class Workload(_Strict):
    workload_id: str
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
    allowed_hardware: list[str] = []
    affinity: list[str] = []
    anti_affinity: list[str] = []
    qos_class: str = ""
    accelerator_share: float | None = None


class PlacementOptions(_Strict):
    node_offsets: list[Int64]
    node_index: list[Int32]
    accelerators: list[Int32]
    option_ids: list[str] = []
    device_offsets: list[Int64] = []
    device_index: list[Int32] = []


class ProductionDecision(_Strict):
    option: Int32
    propensity: float | None = None
    probabilities: list[float] = []
    defer_probability: float | None = None


class MirrorRequest(_Strict):
    schema_version: UInt32
    request_id: str
    request_time: float
    state: ClusterState
    workload: Workload
    options: PlacementOptions
    production: ProductionDecision | None = None
    quota_remaining: float | None = None


class Outcome(_Strict):
    request_id: str
    observed_at: float
    queue_delay_s: float | None = None
    throughput: float | None = None
    completion_time_s: float | None = None
    slo_met: bool | None = None
    failure: Literal["none", "oom", "preempted", "crashed", "other"] = "none"
    production: ProductionDecision | None = None


# Decoders are built once: msgspec compiles the type tree on construction.
MIRROR = msgspec.json.Decoder(MirrorRequest)
OUTCOME = msgspec.json.Decoder(Outcome)

# What a decoder raises for a body it will not take (DecodeError is a subclass).
Refused = msgspec.DecodeError
