"""The outcome predictor's feature function: Gavel columns unchanged, placement columns right."""

from __future__ import annotations

import dataclasses

import numpy as np

from service.environment import World, log_episode
from service.policies.outcome_features import (
    N_OUTCOME_FEATURES,
    OUTCOME_FEATURE_NAMES,
    OUTCOME_FEATURES,
)
from service.policies.predictor_features import N_PREDICTOR_FEATURES, PREDICTOR_FEATURES

SHARE = OUTCOME_FEATURE_NAMES.index("share_fraction")
WORK = OUTCOME_FEATURE_NAMES.index("log10_work_units")


def test_rows_extend_the_gavel_rows_and_read_sharing_off_the_state(small_world: World) -> None:
    log = log_episode(small_world, seed=3, episode=0)
    requests = [d.request for d in log.decisions]
    x = OUTCOME_FEATURES(requests)
    assert x.shape == (sum(r.options.n_options for r in requests), N_OUTCOME_FEATURES)
    assert x.dtype == np.float32 and np.isfinite(x).all()
    np.testing.assert_array_equal(x[:, :N_PREDICTOR_FEATURES], PREDICTOR_FEATURES(requests))
    assert ((x[:, SHARE] >= 0) & (x[:, SHARE] <= 1)).all()
    row = 0
    for r in requests:
        s = r.state
        idle = np.rint(s.accelerators_total * (1.0 - s.utilisation.astype(np.float64)))
        for o in range(r.options.n_options):
            nodes = r.options.nodes_of(o)
            take = r.options.accelerators[r.options.node_offsets[o] : r.options.node_offsets[o + 1]]
            shares = bool((take > idle[nodes]).any())
            assert (x[row, SHARE] > 0) == shares
            assert x[row, WORK] == np.float32(np.log10(1.0 + (r.workload.work_units or 0.0)))
            row += 1


def test_empty_batch_and_definition_hash() -> None:
    assert OUTCOME_FEATURES([]).shape == (0, N_OUTCOME_FEATURES)
    assert OUTCOME_FEATURES.definition_hash == OUTCOME_FEATURES.definition_hash
    other = dataclasses.replace(OUTCOME_FEATURES, version="placement-outcome-features-other")
    assert other.definition_hash != OUTCOME_FEATURES.definition_hash
