from service.wire.understudy.v1 import batch_pb2 as _batch_pb2
from service.wire.understudy.v1 import contract_pb2 as _contract_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AckStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACK_STATUS_UNSPECIFIED: _ClassVar[AckStatus]
    ACK_STATUS_ACCEPTED: _ClassVar[AckStatus]
    ACK_STATUS_SHED: _ClassVar[AckStatus]
    ACK_STATUS_REJECTED: _ClassVar[AckStatus]
    ACK_STATUS_REPEATED_SEQUENCE: _ClassVar[AckStatus]
ACK_STATUS_UNSPECIFIED: AckStatus
ACK_STATUS_ACCEPTED: AckStatus
ACK_STATUS_SHED: AckStatus
ACK_STATUS_REJECTED: AckStatus
ACK_STATUS_REPEATED_SEQUENCE: AckStatus

class MirrorAck(_message.Message):
    __slots__ = ("status", "request_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    status: AckStatus
    request_id: str
    def __init__(self, status: _Optional[_Union[AckStatus, str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class MirrorStreamRequest(_message.Message):
    __slots__ = ("sequence", "request")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    request: _contract_pb2.MirrorRequest
    def __init__(self, sequence: _Optional[int] = ..., request: _Optional[_Union[_contract_pb2.MirrorRequest, _Mapping]] = ...) -> None: ...

class OutcomeStreamRequest(_message.Message):
    __slots__ = ("sequence", "outcome")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    outcome: _contract_pb2.Outcome
    def __init__(self, sequence: _Optional[int] = ..., outcome: _Optional[_Union[_contract_pb2.Outcome, _Mapping]] = ...) -> None: ...

class StreamAck(_message.Message):
    __slots__ = ("status", "sequence", "accepted", "shed", "rejected", "field", "reason")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    SHED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    status: AckStatus
    sequence: int
    accepted: int
    shed: int
    rejected: int
    field: str
    reason: str
    def __init__(self, status: _Optional[_Union[AckStatus, str]] = ..., sequence: _Optional[int] = ..., accepted: _Optional[int] = ..., shed: _Optional[int] = ..., rejected: _Optional[int] = ..., field: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class OutcomeAck(_message.Message):
    __slots__ = ("status", "request_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    status: AckStatus
    request_id: str
    def __init__(self, status: _Optional[_Union[AckStatus, str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class BatchRejection(_message.Message):
    __slots__ = ("index", "field", "reason", "message")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    index: int
    field: str
    reason: str
    message: str
    def __init__(self, index: _Optional[int] = ..., field: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class BatchAck(_message.Message):
    __slots__ = ("status", "sequence", "accepted", "shed", "rejected", "rejections", "stream_accepted", "stream_shed", "stream_rejected", "whole_batch")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    SHED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    STREAM_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    STREAM_SHED_FIELD_NUMBER: _ClassVar[int]
    STREAM_REJECTED_FIELD_NUMBER: _ClassVar[int]
    WHOLE_BATCH_FIELD_NUMBER: _ClassVar[int]
    status: AckStatus
    sequence: int
    accepted: int
    shed: int
    rejected: int
    rejections: _containers.RepeatedCompositeFieldContainer[BatchRejection]
    stream_accepted: int
    stream_shed: int
    stream_rejected: int
    whole_batch: bool
    def __init__(self, status: _Optional[_Union[AckStatus, str]] = ..., sequence: _Optional[int] = ..., accepted: _Optional[int] = ..., shed: _Optional[int] = ..., rejected: _Optional[int] = ..., rejections: _Optional[_Iterable[_Union[BatchRejection, _Mapping]]] = ..., stream_accepted: _Optional[int] = ..., stream_shed: _Optional[int] = ..., stream_rejected: _Optional[int] = ..., whole_batch: _Optional[bool] = ...) -> None: ...

class MirrorBatchStreamRequest(_message.Message):
    __slots__ = ("sequence", "batch")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    batch: _batch_pb2.MirrorBatch
    def __init__(self, sequence: _Optional[int] = ..., batch: _Optional[_Union[_batch_pb2.MirrorBatch, _Mapping]] = ...) -> None: ...

class OutcomeBatchStreamRequest(_message.Message):
    __slots__ = ("sequence", "batch")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    batch: _batch_pb2.OutcomeBatch
    def __init__(self, sequence: _Optional[int] = ..., batch: _Optional[_Union[_batch_pb2.OutcomeBatch, _Mapping]] = ...) -> None: ...

class BatchStreamAck(_message.Message):
    __slots__ = ("ack",)
    ACK_FIELD_NUMBER: _ClassVar[int]
    ack: BatchAck
    def __init__(self, ack: _Optional[_Union[BatchAck, _Mapping]] = ...) -> None: ...
