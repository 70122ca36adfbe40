"""Per-request feasibility bits as the scorer hands them to the log.

The bits come from the batch's one feasibility pass (`make_batch`), sliced per
request by journal seq; with no policy to score, the same bits are computed
once here. Either way they equal `check_feasibility` of each request alone.
"""

from __future__ import annotations

import numpy as np

from service.contract import MirrorRequest, check_feasibility
from service.pipeline.feasibility_log import logged_feasibility
from service.policies.batching import make_batch


def _alone(r: MirrorRequest) -> bytes:
    f = check_feasibility(r.state, r.workload, r.options, r.quota_remaining)
    return f.bits.astype("<u2").tobytes()


def test_bits_per_request_equal_each_requests_own_check(
    requests_sample: list[MirrorRequest],
) -> None:
    requests = requests_sample[:12]
    seqs = [100 + 3 * i for i in range(len(requests))]  # seqs need not be dense

    from_batch = logged_feasibility(seqs, requests, make_batch(requests))
    without = logged_feasibility(seqs, requests, None)  # no policy scored the batch

    for seq, r in zip(seqs, requests, strict=True):
        assert from_batch.of(seq) == (from_batch.version, _alone(r))
        assert without.of(seq) == from_batch.of(seq)
        assert len(from_batch.of(seq)[1] or b"") == 2 * r.options.n_options
    assert from_batch.of(7) == (None, None)  # a seq not in the batch: not known
    assert any(np.frombuffer(b, "<u2").any() for b in from_batch.bits.values())


def test_an_empty_batch_has_no_bits() -> None:
    empty = logged_feasibility([], [], None)
    assert empty.bits == {} and empty.of(1) == (None, None)
