"""Predictor and outcome features on classes with unknown (None) capability numbers.

Contract v2 lets a class leave a number unknown; the Gavel predictor's and the
outcome predictor's rows must stay finite, using the contract's documented
imputation (`service.contract.imputation`), in both the per-request and the
batched forms.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from service.contract import HardwareClass, MirrorRequest
from service.contract.imputation import IMPUTED_CAPABILITIES
from service.policies.outcome_features import OUTCOME_FEATURES
from service.policies.predictor_features import _request_features, batch_features
from service.policies.synthetic import random_requests


def _unknown(request: MirrorRequest, known: bool = False) -> MirrorRequest:
    """`request` with its first class's numbers unknown (or, `known`, set to the imputed ones)."""
    first = request.state.hardware[0]
    numbers = dict(IMPUTED_CAPABILITIES) if known else dict.fromkeys(IMPUTED_CAPABILITIES, None)
    hardware = HardwareClass(first.name, **numbers)
    state = dataclasses.replace(request.state, hardware=(hardware, *request.state.hardware[1:]))
    return dataclasses.replace(request, state=state)


def test_predictor_rows_impute_unknown_numbers_in_both_forms() -> None:
    requests = random_requests(seed=3, n_requests=12)
    unknown = [_unknown(r) for r in requests]
    imputed = [_unknown(r, known=True) for r in requests]
    rows = batch_features(unknown)
    assert np.isfinite(rows).all()
    np.testing.assert_array_equal(rows, batch_features(imputed))
    per_request = np.concatenate([_request_features(r) for r in unknown])
    assert rows.tobytes() == per_request.tobytes()


def test_outcome_rows_stay_finite() -> None:
    unknown = tuple(_unknown(r) for r in random_requests(seed=4, n_requests=8))
    rows = OUTCOME_FEATURES(unknown)
    assert rows.shape[0] == sum(r.options.n_options for r in unknown)
    assert np.isfinite(rows).all()
