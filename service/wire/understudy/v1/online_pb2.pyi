from service.wire.understudy.v1 import contract_pb2 as _contract_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ActedPlacement(_message.Message):
    __slots__ = ("request_id", "protocol_id", "protocol_version", "policy_name", "policy_version", "policy_sha256", "option", "pool", "workload_kind", "acted_at", "concurrent_placements")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    POLICY_NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    POLICY_SHA256_FIELD_NUMBER: _ClassVar[int]
    OPTION_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_KIND_FIELD_NUMBER: _ClassVar[int]
    ACTED_AT_FIELD_NUMBER: _ClassVar[int]
    CONCURRENT_PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    protocol_id: str
    protocol_version: int
    policy_name: str
    policy_version: str
    policy_sha256: str
    option: int
    pool: str
    workload_kind: _contract_pb2.WorkloadKind
    acted_at: float
    concurrent_placements: int
    def __init__(self, request_id: _Optional[str] = ..., protocol_id: _Optional[str] = ..., protocol_version: _Optional[int] = ..., policy_name: _Optional[str] = ..., policy_version: _Optional[str] = ..., policy_sha256: _Optional[str] = ..., option: _Optional[int] = ..., pool: _Optional[str] = ..., workload_kind: _Optional[_Union[_contract_pb2.WorkloadKind, str]] = ..., acted_at: _Optional[float] = ..., concurrent_placements: _Optional[int] = ...) -> None: ...

class ActedPlacements(_message.Message):
    __slots__ = ("placements",)
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    placements: _containers.RepeatedCompositeFieldContainer[ActedPlacement]
    def __init__(self, placements: _Optional[_Iterable[_Union[ActedPlacement, _Mapping]]] = ...) -> None: ...

class RuntimeRequestCount(_message.Message):
    __slots__ = ("runtime_instance", "instance_started_at", "reported_at", "requests_total", "mirrored_total", "client_shed_total")
    RUNTIME_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MIRRORED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CLIENT_SHED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    runtime_instance: str
    instance_started_at: float
    reported_at: float
    requests_total: int
    mirrored_total: int
    client_shed_total: int
    def __init__(self, runtime_instance: _Optional[str] = ..., instance_started_at: _Optional[float] = ..., reported_at: _Optional[float] = ..., requests_total: _Optional[int] = ..., mirrored_total: _Optional[int] = ..., client_shed_total: _Optional[int] = ...) -> None: ...
