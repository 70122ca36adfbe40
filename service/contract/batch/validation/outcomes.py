"""Validation of a whole `OutcomeColumns` by index: what `validate_outcome` decides.

The failure code, request id, observation time, the optional measurements and
production's decision, each as one mask over the outcomes (`fields`,
`production`), first failing rule per outcome.
"""

from __future__ import annotations

import numpy as np

from service.contract.actions import DEFER
from service.contract.batch import (
    FAILURE_OF_CODE,
    OutcomeColumns,
)
from service.contract.batch.validation.fields import _finite_at_least_0, _ids, _time
from service.contract.batch.validation.layout import check_outcome_layout
from service.contract.batch.validation.production import _production
from service.contract.batch.validation.utf8 import _Text
from service.contract.batch.validation.verdicts import BatchVerdict, _Verdicts
from service.contract.validation import RequestLimits


def validate_outcome_batch(
    cols: OutcomeColumns, limits: RequestLimits | None = None
) -> BatchVerdict:
    """Each outcome's verdict as `validate_outcome` gives it, by index.

    An unknown ``failure`` code is refused first, as the single-outcome decoder
    refuses it (service.wire.convert), since no `Outcome` can carry it.

    Raises:
        InvalidInput: the columns cannot be read into outcomes (`check_outcome_layout`).
    """
    limits = limits or RequestLimits()
    check_outcome_layout(cols)
    n = cols.n_outcomes
    v = _Verdicts(None, n)
    if n == 0:
        return v.verdict()
    failure = cols.failure
    known = np.isin(failure, np.array(sorted(FAILURE_OF_CODE), dtype=np.uint8))
    v.request(
        ~known,
        lambda r: (
            "failure",
            f"must be none, oom, preempted, crashed or other, got {int(failure[r])}",
        ),
    )
    _ids(v, "request_id", _Text(cols.request_id), limits.max_id_length)
    _time(v, "observed_at", np.asarray(cols.observed_at, np.float64))
    for name in ("queue_delay_s", "throughput", "completion_time_s"):
        x = np.asarray(getattr(cols, name), np.float64)
        if not len(x):
            continue
        _finite_at_least_0(v, name, np.where(np.isnan(x), 0.0, x), " when set", x)
    p = cols.production
    if len(p.present) and p.present.any():
        present = np.asarray(p.present, np.bool_)
        v.request(
            present & (p.option < DEFER),
            lambda r: ("production.option", "must be -1 (defer) or an option index"),
        )
        _production(v, p, present, None)
    return v.verdict()
