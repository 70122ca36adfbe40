"""The largest values ingest accepts still score: features finite, feasibility defined.

The scorer fuzz (`test_scorer_survives_fuzz.py`) once drew a finite but huge
hardware capability that overflowed the float32 feature matrix; validation now
caps quantities at `MAX_QUANTITY`. This pins the boundary: a request with every
number at the largest accepted value passes validation and featurises finitely.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.contract import DEFAULT_FEATURES, InvalidInput, MirrorRequest, check_feasibility
from service.contract.validation import MAX_QUANTITY, RequestLimits, validate_request
from service.wire.convert import mirror_request_from_pb, mirror_request_to_pb

INT32_MAX = 2**31 - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("priority", [INT32_MAX, -(2**31)])
def test_the_largest_accepted_values_featurise_finitely(
    requests_sample: list[MirrorRequest], priority: int
) -> None:
    msg = mirror_request_to_pb(requests_sample[0])
    for hw in msg.state.hardware:
        hw.accelerator_memory_gb = hw.peak_dense_tflops = MAX_QUANTITY
        hw.memory_bandwidth_gbps = hw.interconnect_gbps = MAX_QUANTITY
    w = msg.workload
    w.model_size_b = w.accelerator_memory_gb = w.cpu_per_node = w.memory_per_node_gb = MAX_QUANTITY
    w.slo_seconds = w.work_units = MAX_QUANTITY
    w.accelerators = w.gang_size = INT32_MAX
    w.priority = priority
    s = msg.state
    n = len(s.node_ids)
    for name in ("cpu_free", "cpu_total", "memory_free_gb", "memory_total_gb"):
        getattr(s, name)[:] = [FLOAT32_MAX] * n
    s.queue_length[:] = [INT32_MAX] * n
    # accelerators: the most devices a snapshot may hold (each becomes a device entry)
    per_node = RequestLimits().max_devices // n
    for name in ("accelerators_free", "accelerators_total"):
        getattr(s, name)[:] = [per_node] * n
    msg.options.accelerators[:] = [INT32_MAX] * len(msg.options.accelerators)
    msg.quota_remaining = 1e308
    request = mirror_request_from_pb(msg)
    with np.errstate(all="raise"):
        validate_request(request)
        features = DEFAULT_FEATURES(request.state, request.workload, request.options)
        check_feasibility(request.state, request.workload, request.options, request.quota_remaining)
    assert features.dtype == np.float32 and np.isfinite(features).all()


def test_a_quantity_over_the_cap_is_refused_naming_it(requests_sample: list[MirrorRequest]) -> None:
    msg = mirror_request_to_pb(requests_sample[0])
    msg.state.hardware[0].peak_dense_tflops = MAX_QUANTITY * 10
    with pytest.raises(
        InvalidInput, match=r"`state.hardware\[0\].peak_dense_tflops` must be at most"
    ):
        validate_request(mirror_request_from_pb(msg))


def test_more_devices_than_a_snapshot_may_hold_are_refused_naming_the_field(
    requests_sample: list[MirrorRequest],
) -> None:
    """INT32_MAX accelerators on every node would be derived into 2^31 devices a node
    (contract/devices.py): refused before any feasibility or feature pass allocates them."""
    msg = mirror_request_to_pb(requests_sample[0])
    n = len(msg.state.node_ids)
    msg.state.accelerators_total[:] = [INT32_MAX] * n
    with pytest.raises(InvalidInput, match=r"`state.accelerators_total` must sum to at most"):
        validate_request(mirror_request_from_pb(msg))
