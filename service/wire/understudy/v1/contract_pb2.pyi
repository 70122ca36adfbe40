from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkloadKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKLOAD_KIND_UNSPECIFIED: _ClassVar[WorkloadKind]
    WORKLOAD_KIND_TRAIN: _ClassVar[WorkloadKind]
    WORKLOAD_KIND_FINETUNE: _ClassVar[WorkloadKind]
    WORKLOAD_KIND_INFER: _ClassVar[WorkloadKind]
    WORKLOAD_KIND_BATCH: _ClassVar[WorkloadKind]

class FailureKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAILURE_KIND_UNSPECIFIED: _ClassVar[FailureKind]
    FAILURE_KIND_NONE: _ClassVar[FailureKind]
    FAILURE_KIND_OOM: _ClassVar[FailureKind]
    FAILURE_KIND_PREEMPTED: _ClassVar[FailureKind]
    FAILURE_KIND_CRASHED: _ClassVar[FailureKind]
    FAILURE_KIND_OTHER: _ClassVar[FailureKind]
WORKLOAD_KIND_UNSPECIFIED: WorkloadKind
WORKLOAD_KIND_TRAIN: WorkloadKind
WORKLOAD_KIND_FINETUNE: WorkloadKind
WORKLOAD_KIND_INFER: WorkloadKind
WORKLOAD_KIND_BATCH: WorkloadKind
FAILURE_KIND_UNSPECIFIED: FailureKind
FAILURE_KIND_NONE: FailureKind
FAILURE_KIND_OOM: FailureKind
FAILURE_KIND_PREEMPTED: FailureKind
FAILURE_KIND_CRASHED: FailureKind
FAILURE_KIND_OTHER: FailureKind

class HardwareClass(_message.Message):
    __slots__ = ("name", "accelerator_memory_gb", "peak_dense_tflops", "memory_bandwidth_gbps", "interconnect_gbps")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_MEMORY_GB_FIELD_NUMBER: _ClassVar[int]
    PEAK_DENSE_TFLOPS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BANDWIDTH_GBPS_FIELD_NUMBER: _ClassVar[int]
    INTERCONNECT_GBPS_FIELD_NUMBER: _ClassVar[int]
    name: str
    accelerator_memory_gb: float
    peak_dense_tflops: float
    memory_bandwidth_gbps: float
    interconnect_gbps: float
    def __init__(self, name: _Optional[str] = ..., accelerator_memory_gb: _Optional[float] = ..., peak_dense_tflops: _Optional[float] = ..., memory_bandwidth_gbps: _Optional[float] = ..., interconnect_gbps: _Optional[float] = ...) -> None: ...

class ClusterState(_message.Message):
    __slots__ = ("node_ids", "hardware", "node_hardware", "accelerators_free", "accelerators_total", "cpu_free", "cpu_total", "memory_free_gb", "memory_total_gb", "utilisation", "queue_length", "healthy", "draining", "zone", "locality", "label_offsets", "labels", "device_offsets", "device_hardware", "device_free_share", "device_free_memory_gb", "device_ids")
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    NODE_HARDWARE_FIELD_NUMBER: _ClassVar[int]
    ACCELERATORS_FREE_FIELD_NUMBER: _ClassVar[int]
    ACCELERATORS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CPU_FREE_FIELD_NUMBER: _ClassVar[int]
    CPU_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FREE_GB_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_GB_FIELD_NUMBER: _ClassVar[int]
    UTILISATION_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    LOCALITY_FIELD_NUMBER: _ClassVar[int]
    LABEL_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_HARDWARE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FREE_SHARE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FREE_MEMORY_GB_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    hardware: _containers.RepeatedCompositeFieldContainer[HardwareClass]
    node_hardware: _containers.RepeatedScalarFieldContainer[int]
    accelerators_free: _containers.RepeatedScalarFieldContainer[int]
    accelerators_total: _containers.RepeatedScalarFieldContainer[int]
    cpu_free: _containers.RepeatedScalarFieldContainer[float]
    cpu_total: _containers.RepeatedScalarFieldContainer[float]
    memory_free_gb: _containers.RepeatedScalarFieldContainer[float]
    memory_total_gb: _containers.RepeatedScalarFieldContainer[float]
    utilisation: _containers.RepeatedScalarFieldContainer[float]
    queue_length: _containers.RepeatedScalarFieldContainer[int]
    healthy: _containers.RepeatedScalarFieldContainer[bool]
    draining: _containers.RepeatedScalarFieldContainer[bool]
    zone: _containers.RepeatedScalarFieldContainer[str]
    locality: _containers.RepeatedScalarFieldContainer[str]
    label_offsets: _containers.RepeatedScalarFieldContainer[int]
    labels: _containers.RepeatedScalarFieldContainer[str]
    device_offsets: _containers.RepeatedScalarFieldContainer[int]
    device_hardware: _containers.RepeatedScalarFieldContainer[int]
    device_free_share: _containers.RepeatedScalarFieldContainer[float]
    device_free_memory_gb: _containers.RepeatedScalarFieldContainer[float]
    device_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_ids: _Optional[_Iterable[str]] = ..., hardware: _Optional[_Iterable[_Union[HardwareClass, _Mapping]]] = ..., node_hardware: _Optional[_Iterable[int]] = ..., accelerators_free: _Optional[_Iterable[int]] = ..., accelerators_total: _Optional[_Iterable[int]] = ..., cpu_free: _Optional[_Iterable[float]] = ..., cpu_total: _Optional[_Iterable[float]] = ..., memory_free_gb: _Optional[_Iterable[float]] = ..., memory_total_gb: _Optional[_Iterable[float]] = ..., utilisation: _Optional[_Iterable[float]] = ..., queue_length: _Optional[_Iterable[int]] = ..., healthy: _Optional[_Iterable[bool]] = ..., draining: _Optional[_Iterable[bool]] = ..., zone: _Optional[_Iterable[str]] = ..., locality: _Optional[_Iterable[str]] = ..., label_offsets: _Optional[_Iterable[int]] = ..., labels: _Optional[_Iterable[str]] = ..., device_offsets: _Optional[_Iterable[int]] = ..., device_hardware: _Optional[_Iterable[int]] = ..., device_free_share: _Optional[_Iterable[float]] = ..., device_free_memory_gb: _Optional[_Iterable[float]] = ..., device_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Workload(_message.Message):
    __slots__ = ("workload_id", "kind", "model_family", "model_size_b", "accelerators", "accelerator_memory_gb", "cpu_per_node", "memory_per_node_gb", "gang_size", "priority", "tenant", "slo_seconds", "work_units", "allowed_hardware", "affinity", "anti_affinity", "kind_name", "qos_class", "accelerator_share")
    WORKLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FAMILY_FIELD_NUMBER: _ClassVar[int]
    MODEL_SIZE_B_FIELD_NUMBER: _ClassVar[int]
    ACCELERATORS_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_MEMORY_GB_FIELD_NUMBER: _ClassVar[int]
    CPU_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PER_NODE_GB_FIELD_NUMBER: _ClassVar[int]
    GANG_SIZE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SLO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WORK_UNITS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_HARDWARE_FIELD_NUMBER: _ClassVar[int]
    AFFINITY_FIELD_NUMBER: _ClassVar[int]
    ANTI_AFFINITY_FIELD_NUMBER: _ClassVar[int]
    KIND_NAME_FIELD_NUMBER: _ClassVar[int]
    QOS_CLASS_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_SHARE_FIELD_NUMBER: _ClassVar[int]
    workload_id: str
    kind: WorkloadKind
    model_family: str
    model_size_b: float
    accelerators: int
    accelerator_memory_gb: float
    cpu_per_node: float
    memory_per_node_gb: float
    gang_size: int
    priority: int
    tenant: str
    slo_seconds: float
    work_units: float
    allowed_hardware: _containers.RepeatedScalarFieldContainer[str]
    affinity: _containers.RepeatedScalarFieldContainer[str]
    anti_affinity: _containers.RepeatedScalarFieldContainer[str]
    kind_name: str
    qos_class: str
    accelerator_share: float
    def __init__(self, workload_id: _Optional[str] = ..., kind: _Optional[_Union[WorkloadKind, str]] = ..., model_family: _Optional[str] = ..., model_size_b: _Optional[float] = ..., accelerators: _Optional[int] = ..., accelerator_memory_gb: _Optional[float] = ..., cpu_per_node: _Optional[float] = ..., memory_per_node_gb: _Optional[float] = ..., gang_size: _Optional[int] = ..., priority: _Optional[int] = ..., tenant: _Optional[str] = ..., slo_seconds: _Optional[float] = ..., work_units: _Optional[float] = ..., allowed_hardware: _Optional[_Iterable[str]] = ..., affinity: _Optional[_Iterable[str]] = ..., anti_affinity: _Optional[_Iterable[str]] = ..., kind_name: _Optional[str] = ..., qos_class: _Optional[str] = ..., accelerator_share: _Optional[float] = ...) -> None: ...

class PlacementOptions(_message.Message):
    __slots__ = ("node_offsets", "node_index", "accelerators", "option_ids", "device_offsets", "device_index")
    NODE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    NODE_INDEX_FIELD_NUMBER: _ClassVar[int]
    ACCELERATORS_FIELD_NUMBER: _ClassVar[int]
    OPTION_IDS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    node_offsets: _containers.RepeatedScalarFieldContainer[int]
    node_index: _containers.RepeatedScalarFieldContainer[int]
    accelerators: _containers.RepeatedScalarFieldContainer[int]
    option_ids: _containers.RepeatedScalarFieldContainer[str]
    device_offsets: _containers.RepeatedScalarFieldContainer[int]
    device_index: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node_offsets: _Optional[_Iterable[int]] = ..., node_index: _Optional[_Iterable[int]] = ..., accelerators: _Optional[_Iterable[int]] = ..., option_ids: _Optional[_Iterable[str]] = ..., device_offsets: _Optional[_Iterable[int]] = ..., device_index: _Optional[_Iterable[int]] = ...) -> None: ...

class ProductionDecision(_message.Message):
    __slots__ = ("option", "propensity", "probabilities", "defer_probability")
    OPTION_FIELD_NUMBER: _ClassVar[int]
    PROPENSITY_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    DEFER_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    option: int
    propensity: float
    probabilities: _containers.RepeatedScalarFieldContainer[float]
    defer_probability: float
    def __init__(self, option: _Optional[int] = ..., propensity: _Optional[float] = ..., probabilities: _Optional[_Iterable[float]] = ..., defer_probability: _Optional[float] = ...) -> None: ...

class MirrorRequest(_message.Message):
    __slots__ = ("schema_version", "request_id", "request_time", "state", "workload", "options", "production", "quota_remaining")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TIME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    PRODUCTION_FIELD_NUMBER: _ClassVar[int]
    QUOTA_REMAINING_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    request_id: str
    request_time: float
    state: ClusterState
    workload: Workload
    options: PlacementOptions
    production: ProductionDecision
    quota_remaining: float
    def __init__(self, schema_version: _Optional[int] = ..., request_id: _Optional[str] = ..., request_time: _Optional[float] = ..., state: _Optional[_Union[ClusterState, _Mapping]] = ..., workload: _Optional[_Union[Workload, _Mapping]] = ..., options: _Optional[_Union[PlacementOptions, _Mapping]] = ..., production: _Optional[_Union[ProductionDecision, _Mapping]] = ..., quota_remaining: _Optional[float] = ...) -> None: ...

class Outcome(_message.Message):
    __slots__ = ("request_id", "observed_at", "queue_delay_s", "throughput", "completion_time_s", "slo_met", "failure", "production")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_AT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DELAY_S_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TIME_S_FIELD_NUMBER: _ClassVar[int]
    SLO_MET_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    PRODUCTION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    observed_at: float
    queue_delay_s: float
    throughput: float
    completion_time_s: float
    slo_met: bool
    failure: FailureKind
    production: ProductionDecision
    def __init__(self, request_id: _Optional[str] = ..., observed_at: _Optional[float] = ..., queue_delay_s: _Optional[float] = ..., throughput: _Optional[float] = ..., completion_time_s: _Optional[float] = ..., slo_met: _Optional[bool] = ..., failure: _Optional[_Union[FailureKind, str]] = ..., production: _Optional[_Union[ProductionDecision, _Mapping]] = ...) -> None: ...
