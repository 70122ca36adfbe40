"""An outcome without `failure` means the same on both transports (issue 20 item 9).

HTTP defaults an absent `failure` to "none"; proto3 cannot tell an absent enum
from its zero value (FAILURE_KIND_UNSPECIFIED), so gRPC read that as "none"
too instead of refusing the outcome. Values outside the enum stay refused,
naming the field.
"""

from __future__ import annotations

import grpc
import httpx
import pytest

from service.contract import FailureKind
from service.pipeline.journal_format import RecordKind
from service.server.app import Service
from service.wire.convert import outcome_from_pb
from service.wire.understudy.v1 import contract_pb2, shadow_pb2, shadow_pb2_grpc

Metadata = tuple[tuple[str, str], ...]


def _journaled_outcomes(service: Service) -> dict[str, FailureKind]:
    """request_id -> failure of every outcome in the journal, decoded as the scorer does."""
    out = {}
    for record in service.journal.read("scorer", 1000):
        if record.kind == RecordKind.OUTCOME:
            outcome = outcome_from_pb(contract_pb2.Outcome.FromString(record.payload))
            out[outcome.request_id] = outcome.failure
    return out


def test_outcome_without_failure_is_accepted_as_none_on_both_transports(
    service: Service,
    stub: shadow_pb2_grpc.ShadowEvaluationStub,
    http: httpx.Client,
    auth: Metadata,
) -> None:
    fields = {"observed_at": 1.7e9, "completion_time_s": 12.5, "slo_met": True}
    response = http.post("/v1/outcomes", json={"request_id": "via-http", **fields})
    assert response.status_code == 202, response.text

    unary = stub.ReportOutcome(
        contract_pb2.Outcome(request_id="via-grpc", **fields),  # type: ignore[arg-type]
        metadata=auth,
        timeout=30,
    )
    assert unary.status == shadow_pb2.ACK_STATUS_ACCEPTED

    envelope = shadow_pb2.OutcomeStreamRequest(
        sequence=1,
        outcome=contract_pb2.Outcome(request_id="via-stream", **fields),  # type: ignore[arg-type]
    )
    acks = list(stub.ReportOutcomeStream(iter([envelope]), metadata=auth, timeout=30))
    assert acks[-1].accepted == 1 and acks[-1].rejected == 0

    assert _journaled_outcomes(service) == {
        "via-http": FailureKind.NONE,
        "via-grpc": FailureKind.NONE,
        "via-stream": FailureKind.NONE,
    }


def test_failure_outside_the_enum_is_still_refused_naming_the_field(
    service: Service, stub: shadow_pb2_grpc.ShadowEvaluationStub, auth: Metadata
) -> None:
    unknown = contract_pb2.Outcome(request_id="r-1", observed_at=1.7e9, failure=42)  # type: ignore[arg-type]
    with pytest.raises(grpc.RpcError) as err:
        stub.ReportOutcome(unknown, metadata=auth, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "`failure`" in (err.value.details() or "")
    rejected = service.metrics.registry.get_sample_value(
        "understudy_ingest_rejections_total",
        {"transport": "grpc", "kind": "outcome", "field": "failure"},
    )
    assert rejected == 1
    assert service.journal.head_seq == 0
