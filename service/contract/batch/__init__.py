"""The batch form of the contract (issue 24): many requests in columns.

`columns` holds the dataclasses (`RequestBatch`, `OutcomeColumns`, ...) and
is re-exported here; `validation` decides per request, by index, what the
single-request validator decides; `identity` computes every request's
content digest from the columns. A package because the contract's folder
holds one module per job and these three are one job's parts.
"""

from service.contract.batch.columns import (
    BATCH_SCHEMA_VERSION,
    CODE_OF_FAILURE,
    EMPTY_F64,
    EMPTY_STRINGS,
    EMPTY_U8,
    FAILURE_OF_CODE,
    SLO_MET_UNKNOWN,
    OptionColumns,
    OutcomeColumns,
    ProductionColumns,
    RequestBatch,
    StateColumns,
    Strings,
    WorkloadColumns,
)

__all__ = [
    "BATCH_SCHEMA_VERSION",
    "CODE_OF_FAILURE",
    "EMPTY_F64",
    "EMPTY_STRINGS",
    "EMPTY_U8",
    "FAILURE_OF_CODE",
    "SLO_MET_UNKNOWN",
    "OptionColumns",
    "OutcomeColumns",
    "ProductionColumns",
    "RequestBatch",
    "StateColumns",
    "Strings",
    "WorkloadColumns",
]
