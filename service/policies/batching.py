"""Build a `ScoringBatch` from contract requests, the way online scoring does.

Features come from the versioned contract function and masks from the
versioned feasibility function, so a batch made here (tests, probes, the
build script, offline replay) is the batch the scorer would have made.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from service.contract import (
    DEFAULT_FEATURES,
    N_FEATURES,
    FeatureFunction,
    MirrorRequest,
)
from service.contract.feasibility import check_feasibility_batch
from service.policies.base import ScoringBatch


def make_batch(
    requests: Sequence[MirrorRequest], features: FeatureFunction = DEFAULT_FEATURES
) -> ScoringBatch:
    """Every request's option features and feasibility mask, concatenated in CSR form.

    Features and masks are computed for the whole batch in one vectorised pass
    each (`FeatureFunction.batch`, `check_feasibility_batch`), bit-identical to
    featurising and checking request by request. The per-option signal bits of
    that one pass travel with the batch (`ScoringBatch.feasibility_bits`) for the log.
    """
    counts = [r.options.n_options for r in requests]
    offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
    if not requests:
        return ScoringBatch(
            features=np.zeros((0, N_FEATURES), dtype=np.float32),
            offsets=offsets,
            mask=np.zeros(0, dtype=bool),
            requests=(),
        )
    rows = features.batch([(r.state, r.workload, r.options) for r in requests])
    feasibility = check_feasibility_batch(
        [(r.state, r.workload, r.options, r.quota_remaining) for r in requests]
    )
    return ScoringBatch(
        features=np.ascontiguousarray(rows, dtype=np.float32),
        offsets=offsets,
        mask=feasibility.mask.astype(bool),
        requests=tuple(requests),
        feasibility_bits=feasibility.bits,
        feasibility_version=feasibility.version,
    )
