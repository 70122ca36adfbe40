"""Request-level field rules: request id and time, the workload, the quota.

`_check_id` / `_check_time` of the request, `_check_workload` and the quota
bound. Every field here is one value per request, so each rule is one mask
over a packed column (`fields`); no per-request object is built.
"""

from __future__ import annotations

import numpy as np

from service.contract.batch.validation.context import _Pass
from service.contract.batch.validation.fields import (
    _control,
    _finite_at_least_0,
    _ids,
    _positive_when_set,
    _quantity,
    _time,
    _vocabulary,
)
from service.contract.batch.validation.utf8 import _Text
from service.contract.validation import _DEFAULT_LIMITS


class _RequestFieldRules(_Pass):
    """Request id, request time, the workload and the quota: one value per request."""

    def ids_and_time(self) -> None:
        _ids(self.v, "request_id", _Text(self.b.request_id), self.limits.max_id_length)
        _time(self.v, "request_time", np.asarray(self.b.request_time, np.float64))

    def workload(self) -> None:
        w, v = self.b.workloads, self.v
        _ids(v, "workload.workload_id", _Text(w.workload_id), _DEFAULT_LIMITS.max_id_length)
        for name in ("tenant", "model_family"):
            _control(v, f"workload.{name}", _Text(getattr(w, name)))
        for name in ("model_size_b", "accelerator_memory_gb", "cpu_per_node", "memory_per_node_gb"):
            x = np.asarray(getattr(w, name), np.float64)
            _finite_at_least_0(v, f"workload.{name}", x, "")
            _quantity(v, f"workload.{name}", x)
        acc = w.accelerators
        v.request(acc < 0, lambda r: ("workload.accelerators", f"must be >= 0, got {int(acc[r])}"))
        _vocabulary(v, "workload.kind", _Text(w.kind), required=True)
        _vocabulary(v, "workload.qos_class", _Text(w.qos_class), required=False)
        share = np.asarray(w.accelerator_share, np.float64)
        given = ~np.isnan(share)
        v.request(
            given & ~(np.isfinite(share) & (share > 0.0) & (share <= 1.0)),
            lambda r: ("workload.accelerator_share", f"must be in (0, 1], got {float(share[r])}"),
        )
        v.request(
            given & (acc != 0),
            lambda r: (
                "workload.accelerators",
                "must be 0 with workload.accelerator_share (a share of one device), "
                f"got {int(acc[r])}",
            ),
        )
        gang = w.gang_size
        v.request(gang < 1, lambda r: ("workload.gang_size", f"must be >= 1, got {int(gang[r])}"))
        for name in ("slo_seconds", "work_units"):
            x = np.asarray(getattr(w, name), np.float64)
            set_ = ~np.isnan(x)
            _positive_when_set(v, f"workload.{name}", x)
            _quantity(v, f"workload.{name}", np.where(set_, x, 0.0))

    def quota(self) -> None:
        q = self.b.quota_remaining
        if not len(q):
            return
        self.v.request(
            ~np.isnan(q) & ~(np.isfinite(q) & (q >= 0)),
            lambda r: ("quota_remaining", f"must be finite and >= 0, got {float(q[r])}"),
        )
