"""Schema-version-1 rules: what a v1 request may not carry (`schema_versions`).

A v1 request sends no devices, no unknown hardware capability, only the four
v1 workload kinds, no accelerator share or QoS class, no named devices and no
production distribution. Each is one mask over requests or snapshots; the
kind check compares the kind column as fixed-width uint64 codes instead of
decoding each string.
"""

from __future__ import annotations

import numpy as np

from service.contract.batch.validation.arrays import _segment_first
from service.contract.batch.validation.context import _Pass
from service.contract.batch.validation.utf8 import _code_of, _Text
from service.contract.hardware import CAPABILITIES
from service.contract.schema_versions import V1_REFUSAL
from service.contract.workload import WorkloadKind


class _SchemaRules(_Pass):
    """The rules of schema_version 1 (`service.contract.schema_versions`)."""

    def schema_1(self) -> None:
        self.v.snapshot(self.sent.copy(), lambda s: ("state.device_offsets", V1_REFUSAL))
        st = self.st
        unknown = np.array(
            [[getattr(h, c) is None for c in CAPABILITIES] for h in st.hardware], dtype=np.bool_
        ).reshape(-1, len(CAPABILITIES))
        if unknown.any():
            bad, first = _segment_first(
                np.asarray(unknown.any(axis=1), np.bool_), self.hw_off, self.n_states
            )

            def caps(s: int) -> tuple[str, str]:
                i = int(first[s])
                c = int(np.flatnonzero(unknown[self.hw_off[s] + i])[0])
                return (
                    f"state.hardware[{i}].{CAPABILITIES[c]}",
                    "must be set in schema_version 1 (an unknown capability needs schema 2)",
                )

            self.v.snapshot(bad, caps)
        w = self.b.workloads
        kind = _Text(w.kind)
        fits, codes = kind.short_codes()
        known = np.zeros(self.n, np.bool_)
        for k in WorkloadKind:
            known |= fits & (codes == np.uint64(_code_of(k.value))) & (kind.nbytes == len(k.value))
        self.v.request(
            ~known,
            lambda r: (
                "workload.kind",
                "must be train, finetune, infer or batch in schema_version 1, "
                f"got {kind.value(r)[:40]!r}",
            ),
        )
        self.v.request(
            ~np.isnan(w.accelerator_share), lambda r: ("workload.accelerator_share", V1_REFUSAL)
        )
        self.v.request(~_Text(w.qos_class).empty, lambda r: ("workload.qos_class", V1_REFUSAL))
        o = self.b.options
        if len(o.devices_named):
            self.v.request(o.devices_named, lambda r: ("options.device_offsets", V1_REFUSAL))
        self.v.request(self.has_probs, lambda r: ("production.probabilities", V1_REFUSAL))
        self.v.request(
            self.present & ~np.isnan(self.defer),
            lambda r: ("production.defer_probability", V1_REFUSAL),
        )
