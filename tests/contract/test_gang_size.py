"""`workload.gang_size` is the most nodes one option of the job may span (schema 2).

Runtime's job spec says how far the gang may spread; an option spanning more
nodes is one Runtime enumerated against its own spec, refused naming the option
and `workload.gang_size`. Schema 1 keeps its old meaning (the field was read by
nothing). The wire-level rows (HTTP 400 / INVALID_ARGUMENT, counted) are in
tests/transport/test_bad_input_v2.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from service.contract import InvalidInput, MirrorRequest, validate_request
from service.contract.state import frozen_array
from service.policies.synthetic import random_requests
from tests.contract import v2_requests as v2


def _with_gang_first(request: MirrorRequest, nodes: int, gang_size: int) -> MirrorRequest:
    """`request` whose option 1 spans `nodes` nodes (0..nodes-1), one accelerator each."""
    o = request.options
    sizes = np.diff(o.node_offsets).tolist()
    index = o.node_index.tolist()
    taken = o.accelerators.tolist()
    start = int(o.node_offsets[1])
    end = int(o.node_offsets[2])
    index[start:end] = list(range(nodes))
    taken[start:end] = [1] * nodes
    sizes[1] = nodes
    options = dataclasses.replace(
        o,
        node_offsets=frozen_array(np.concatenate([[0], np.cumsum(sizes)]), np.int64),
        node_index=frozen_array(index, np.int32),
        accelerators=frozen_array(taken, np.int32),
    )
    w = dataclasses.replace(request.workload, gang_size=gang_size)
    return dataclasses.replace(request, workload=w, options=options)


def test_an_option_spanning_more_than_gang_size_is_refused_naming_it(
    requests_sample: list[MirrorRequest],
) -> None:
    bad = _with_gang_first(requests_sample[0], nodes=4, gang_size=2)
    with pytest.raises(InvalidInput) as err:
        validate_request(bad)
    assert err.value.field == "options[1]"
    assert "spans 4 nodes, more than `workload.gang_size` (2)" in str(err.value)


@pytest.mark.parametrize("gang_size", [4, 5, 2**31 - 1])
def test_an_option_within_gang_size_is_accepted(
    requests_sample: list[MirrorRequest], gang_size: int
) -> None:
    validate_request(_with_gang_first(requests_sample[0], nodes=4, gang_size=gang_size))


def test_single_node_options_pass_any_gang_size(requests_sample: list[MirrorRequest]) -> None:
    """Fewer nodes than gang_size is fine: a gang of up to 4 may run on one node."""
    r = requests_sample[0]
    validate_request(dataclasses.replace(r, workload=dataclasses.replace(r.workload, gang_size=4)))


def test_schema_1_keeps_its_meaning(requests_sample: list[MirrorRequest]) -> None:
    """A v1 sender's gang beyond gang_size (the simulator sent 1 for spread gangs) is
    accepted as before; the same request in schema 2 is refused."""
    r = _with_gang_first(requests_sample[0], nodes=4, gang_size=1)
    validate_request(v2.as_schema_1(r))
    with pytest.raises(InvalidInput):
        validate_request(r)


def test_synthetic_requests_send_a_consistent_gang_size() -> None:
    """service/policies/synthetic.py offers two-node gangs, so it must say gang_size 2."""
    requests = random_requests(seed=5, n_requests=200)
    spread = [r for r in requests if int(r.options.nodes_per_option.max()) > 1]
    assert len(spread) > 50
    for r in requests:
        validate_request(r)
        assert r.workload.gang_size >= int(r.options.nodes_per_option.max())
