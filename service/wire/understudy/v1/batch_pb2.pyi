from service.wire.understudy.v1 import contract_pb2 as _contract_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Strings(_message.Message):
    __slots__ = ("utf8", "offsets")
    UTF8_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    utf8: bytes
    offsets: bytes
    def __init__(self, utf8: _Optional[bytes] = ..., offsets: _Optional[bytes] = ...) -> None: ...

class ClusterStates(_message.Message):
    __slots__ = ("node_offsets", "hardware_offsets", "hardware", "node_ids", "node_hardware", "accelerators_free", "accelerators_total", "cpu_free", "cpu_total", "memory_free_gb", "memory_total_gb", "utilisation", "queue_length", "healthy", "draining", "zone", "locality", "label_offsets", "labels", "devices_sent", "device_offsets", "device_hardware", "device_free_share", "device_free_memory_gb", "device_ids_sent", "device_ids")
    NODE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
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
    DEVICES_SENT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_HARDWARE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FREE_SHARE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FREE_MEMORY_GB_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_SENT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    node_offsets: bytes
    hardware_offsets: bytes
    hardware: _containers.RepeatedCompositeFieldContainer[_contract_pb2.HardwareClass]
    node_ids: Strings
    node_hardware: bytes
    accelerators_free: bytes
    accelerators_total: bytes
    cpu_free: bytes
    cpu_total: bytes
    memory_free_gb: bytes
    memory_total_gb: bytes
    utilisation: bytes
    queue_length: bytes
    healthy: bytes
    draining: bytes
    zone: Strings
    locality: Strings
    label_offsets: bytes
    labels: Strings
    devices_sent: bytes
    device_offsets: bytes
    device_hardware: bytes
    device_free_share: bytes
    device_free_memory_gb: bytes
    device_ids_sent: bytes
    device_ids: Strings
    def __init__(self, node_offsets: _Optional[bytes] = ..., hardware_offsets: _Optional[bytes] = ..., hardware: _Optional[_Iterable[_Union[_contract_pb2.HardwareClass, _Mapping]]] = ..., node_ids: _Optional[_Union[Strings, _Mapping]] = ..., node_hardware: _Optional[bytes] = ..., accelerators_free: _Optional[bytes] = ..., accelerators_total: _Optional[bytes] = ..., cpu_free: _Optional[bytes] = ..., cpu_total: _Optional[bytes] = ..., memory_free_gb: _Optional[bytes] = ..., memory_total_gb: _Optional[bytes] = ..., utilisation: _Optional[bytes] = ..., queue_length: _Optional[bytes] = ..., healthy: _Optional[bytes] = ..., draining: _Optional[bytes] = ..., zone: _Optional[_Union[Strings, _Mapping]] = ..., locality: _Optional[_Union[Strings, _Mapping]] = ..., label_offsets: _Optional[bytes] = ..., labels: _Optional[_Union[Strings, _Mapping]] = ..., devices_sent: _Optional[bytes] = ..., device_offsets: _Optional[bytes] = ..., device_hardware: _Optional[bytes] = ..., device_free_share: _Optional[bytes] = ..., device_free_memory_gb: _Optional[bytes] = ..., device_ids_sent: _Optional[bytes] = ..., device_ids: _Optional[_Union[Strings, _Mapping]] = ...) -> None: ...

class Workloads(_message.Message):
    __slots__ = ("workload_id", "kind", "model_family", "model_size_b", "accelerators", "accelerator_memory_gb", "cpu_per_node", "memory_per_node_gb", "gang_size", "priority", "tenant", "slo_seconds", "work_units", "accelerator_share", "qos_class", "allowed_hardware_offsets", "allowed_hardware", "affinity_offsets", "affinity", "anti_affinity_offsets", "anti_affinity")
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
    ACCELERATOR_SHARE_FIELD_NUMBER: _ClassVar[int]
    QOS_CLASS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_HARDWARE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_HARDWARE_FIELD_NUMBER: _ClassVar[int]
    AFFINITY_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    AFFINITY_FIELD_NUMBER: _ClassVar[int]
    ANTI_AFFINITY_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    ANTI_AFFINITY_FIELD_NUMBER: _ClassVar[int]
    workload_id: Strings
    kind: Strings
    model_family: Strings
    model_size_b: bytes
    accelerators: bytes
    accelerator_memory_gb: bytes
    cpu_per_node: bytes
    memory_per_node_gb: bytes
    gang_size: bytes
    priority: bytes
    tenant: Strings
    slo_seconds: bytes
    work_units: bytes
    accelerator_share: bytes
    qos_class: Strings
    allowed_hardware_offsets: bytes
    allowed_hardware: Strings
    affinity_offsets: bytes
    affinity: Strings
    anti_affinity_offsets: bytes
    anti_affinity: Strings
    def __init__(self, workload_id: _Optional[_Union[Strings, _Mapping]] = ..., kind: _Optional[_Union[Strings, _Mapping]] = ..., model_family: _Optional[_Union[Strings, _Mapping]] = ..., model_size_b: _Optional[bytes] = ..., accelerators: _Optional[bytes] = ..., accelerator_memory_gb: _Optional[bytes] = ..., cpu_per_node: _Optional[bytes] = ..., memory_per_node_gb: _Optional[bytes] = ..., gang_size: _Optional[bytes] = ..., priority: _Optional[bytes] = ..., tenant: _Optional[_Union[Strings, _Mapping]] = ..., slo_seconds: _Optional[bytes] = ..., work_units: _Optional[bytes] = ..., accelerator_share: _Optional[bytes] = ..., qos_class: _Optional[_Union[Strings, _Mapping]] = ..., allowed_hardware_offsets: _Optional[bytes] = ..., allowed_hardware: _Optional[_Union[Strings, _Mapping]] = ..., affinity_offsets: _Optional[bytes] = ..., affinity: _Optional[_Union[Strings, _Mapping]] = ..., anti_affinity_offsets: _Optional[bytes] = ..., anti_affinity: _Optional[_Union[Strings, _Mapping]] = ...) -> None: ...

class Options(_message.Message):
    __slots__ = ("option_offsets", "entry_offsets", "node_index", "accelerators", "option_ids_sent", "option_ids", "devices_named", "device_offsets", "device_index")
    OPTION_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    ENTRY_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    NODE_INDEX_FIELD_NUMBER: _ClassVar[int]
    ACCELERATORS_FIELD_NUMBER: _ClassVar[int]
    OPTION_IDS_SENT_FIELD_NUMBER: _ClassVar[int]
    OPTION_IDS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_NAMED_FIELD_NUMBER: _ClassVar[int]
    DEVICE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    option_offsets: bytes
    entry_offsets: bytes
    node_index: bytes
    accelerators: bytes
    option_ids_sent: bytes
    option_ids: Strings
    devices_named: bytes
    device_offsets: bytes
    device_index: bytes
    def __init__(self, option_offsets: _Optional[bytes] = ..., entry_offsets: _Optional[bytes] = ..., node_index: _Optional[bytes] = ..., accelerators: _Optional[bytes] = ..., option_ids_sent: _Optional[bytes] = ..., option_ids: _Optional[_Union[Strings, _Mapping]] = ..., devices_named: _Optional[bytes] = ..., device_offsets: _Optional[bytes] = ..., device_index: _Optional[bytes] = ...) -> None: ...

class Productions(_message.Message):
    __slots__ = ("present", "option", "propensity", "probability_offsets", "probabilities", "defer_probability")
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    OPTION_FIELD_NUMBER: _ClassVar[int]
    PROPENSITY_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    PROBABILITIES_FIELD_NUMBER: _ClassVar[int]
    DEFER_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    present: bytes
    option: bytes
    propensity: bytes
    probability_offsets: bytes
    probabilities: bytes
    defer_probability: bytes
    def __init__(self, present: _Optional[bytes] = ..., option: _Optional[bytes] = ..., propensity: _Optional[bytes] = ..., probability_offsets: _Optional[bytes] = ..., probabilities: _Optional[bytes] = ..., defer_probability: _Optional[bytes] = ...) -> None: ...

class MirrorBatch(_message.Message):
    __slots__ = ("schema_version", "request_id", "request_time", "state_index", "states", "workloads", "options", "production", "quota_remaining")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TIME_FIELD_NUMBER: _ClassVar[int]
    STATE_INDEX_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    PRODUCTION_FIELD_NUMBER: _ClassVar[int]
    QUOTA_REMAINING_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    request_id: Strings
    request_time: bytes
    state_index: bytes
    states: ClusterStates
    workloads: Workloads
    options: Options
    production: Productions
    quota_remaining: bytes
    def __init__(self, schema_version: _Optional[int] = ..., request_id: _Optional[_Union[Strings, _Mapping]] = ..., request_time: _Optional[bytes] = ..., state_index: _Optional[bytes] = ..., states: _Optional[_Union[ClusterStates, _Mapping]] = ..., workloads: _Optional[_Union[Workloads, _Mapping]] = ..., options: _Optional[_Union[Options, _Mapping]] = ..., production: _Optional[_Union[Productions, _Mapping]] = ..., quota_remaining: _Optional[bytes] = ...) -> None: ...

class OutcomeBatch(_message.Message):
    __slots__ = ("request_id", "observed_at", "queue_delay_s", "throughput", "completion_time_s", "slo_met", "failure", "production")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_AT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DELAY_S_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TIME_S_FIELD_NUMBER: _ClassVar[int]
    SLO_MET_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    PRODUCTION_FIELD_NUMBER: _ClassVar[int]
    request_id: Strings
    observed_at: bytes
    queue_delay_s: bytes
    throughput: bytes
    completion_time_s: bytes
    slo_met: bytes
    failure: bytes
    production: Productions
    def __init__(self, request_id: _Optional[_Union[Strings, _Mapping]] = ..., observed_at: _Optional[bytes] = ..., queue_delay_s: _Optional[bytes] = ..., throughput: _Optional[bytes] = ..., completion_time_s: _Optional[bytes] = ..., slo_met: _Optional[bytes] = ..., failure: _Optional[bytes] = ..., production: _Optional[_Union[Productions, _Mapping]] = ...) -> None: ...
