"""Production's distribution at ingest: refused naming the field and counted, on both decoders.

Real `Ingest` over a real journal and metrics registry, fed the bytes each
transport decodes (protobuf for gRPC, the HTTP JSON body through the HTTP
decoder), as the servers feed it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from service.contract import InvalidInput, MirrorRequest, ProductionDecision, RequestLimits
from service.contract.feasibility import check_feasibility
from service.metrics import ServiceMetrics
from service.pipeline.ingest import AckStatus, Ingest
from service.pipeline.journal import IngestJournal, JournalConfig
from service.transport.http.convert import mirror_to_json
from service.transport.http.decode import mirror_from_json
from service.wire.convert import mirror_request_from_pb, mirror_request_to_pb


def _request(requests: list[MirrorRequest]) -> tuple[MirrorRequest, int, int]:
    """A request with a feasible and a masked option, with a valid distribution; and both."""
    for r in requests:
        mask = check_feasibility(r.state, r.workload, r.options, r.quota_remaining).mask
        if mask.sum() >= 1 and (~mask).any():
            chosen = int(np.flatnonzero(mask)[0])
            p = np.where(mask, 0.5 / mask.sum(), 0.0)
            p[chosen] += 0.5  # room to move 0.25 of it elsewhere
            masked = int(np.flatnonzero(~mask)[0])
            production = ProductionDecision(chosen, None, tuple(map(float, p)), None)
            return replace(r, production=production), chosen, masked
    raise AssertionError("no sampled request has a masked option")


def _grpc(ingest: Ingest, request: MirrorRequest) -> AckStatus:
    payload = bytes(mirror_request_to_pb(request).SerializeToString())
    decoded = mirror_request_from_pb(mirror_request_to_pb(request))
    return ingest.mirror("grpc", lambda: (decoded, payload)).status


def _http(ingest: Ingest, request: MirrorRequest) -> AckStatus:
    body = mirror_to_json(request)
    return ingest.mirror("http", lambda: mirror_from_json(body)).status


@pytest.mark.parametrize(("transport", "send"), [("grpc", _grpc), ("http", _http)])
def test_a_distribution_with_mass_on_a_masked_option_is_refused_and_counted(
    tmp_path: Path, requests_sample: list[MirrorRequest], transport: str, send: object
) -> None:
    good, chosen, masked = _request(requests_sample)
    assert good.production is not None and good.production.probabilities is not None
    probs = list(good.production.probabilities)
    probs[chosen] -= 0.25
    probs[masked] = 0.25
    bad = replace(
        good,
        request_id=good.request_id + "-bad",
        production=replace(good.production, probabilities=tuple(probs)),
    )
    metrics = ServiceMetrics(CollectorRegistry())
    with IngestJournal(JournalConfig(tmp_path)) as journal:
        ingest = Ingest(journal, metrics, RequestLimits())
        assert send(ingest, good) == AckStatus.ACCEPTED  # type: ignore[operator]
        with pytest.raises(InvalidInput) as refused:
            send(ingest, bad)  # type: ignore[operator]
        assert journal.head_seq == 1
    assert refused.value.field == f"production.probabilities[{masked}]"
    assert f"option {masked} is infeasible" in str(refused.value)
    labels = {"transport": transport, "kind": "mirror", "field": "production.probabilities[]"}
    counted = metrics.registry.get_sample_value("understudy_ingest_rejections_total", labels)
    assert counted == 1
