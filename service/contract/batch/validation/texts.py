"""Text rules: `check_request_texts`, no control characters, field by field.

Node ids, hardware class names, zones, localities, labels, option ids and the
workload's string sets. Each column is checked on its UTF-8 bytes in one pass
(`utf8._Text.control`); Python runs only to name the offending value, and over
hardware classes (objects, a handful per snapshot).
"""

from __future__ import annotations

import numpy as np

from service.contract.batch.validation.arrays import _counts_in, _segment_first
from service.contract.batch.validation.context import _Pass
from service.contract.batch.validation.fields import _set_texts
from service.contract.batch.validation.utf8 import _has_control, _Text, _text_refusal


class _TextRules(_Pass):
    """`check_request_texts`, field by field in its order."""

    def texts(self) -> None:
        """`check_request_texts`, field by field in its order."""
        st, v = self.st, self.v
        ids = self.node_ids
        self.node_rule(
            ids.control(),
            lambda i, g: (f"state.node_ids[{i}]", _text_refusal(ids.value(g))),
        )
        names = [_has_control(h.name) for h in st.hardware]  # a loop over classes
        if any(names):
            has, first = _segment_first(np.array(names, np.bool_), self.hw_off, self.n_states)
            v.snapshot(
                has,
                lambda s: (
                    f"state.hardware[{int(first[s])}].name",
                    _text_refusal(st.hardware[int(self.hw_off[s] + first[s])].name),
                ),
            )
        for name in ("zone", "locality"):
            self.node_texts(name, _Text(getattr(st, name)))
        if len(st.label_offsets):
            labels = _Text(st.labels)
            bad_label = labels.control()
            if bad_label.any():
                node_bad = _counts_in(bad_label, np.asarray(st.label_offsets, np.int64)) > 0
                lo = st.label_offsets

                def label(i: int, g: int) -> tuple[str, str]:
                    values = sorted(labels.s.values(int(lo[g]), int(lo[g + 1])))
                    first = next(x for x in values if _has_control(x))
                    return "state.labels", _text_refusal(first, f"of node {i} ")

                self.node_rule(node_bad, label)
        o = self.b.options
        if len(o.option_ids_sent) and o.option_ids_sent.any():
            text = _Text(o.option_ids)
            per_request = np.where(o.option_ids_sent, self.n_opts, 0)
            id_off = np.zeros(self.n + 1, np.int64)
            np.cumsum(per_request, out=id_off[1:])
            self.request_rule(
                text.control(),
                id_off,
                lambda r, i, g: (f"options.option_ids[{i}]", _text_refusal(text.value(g))),
            )
        w = self.b.workloads
        for name in ("allowed_hardware", "affinity", "anti_affinity"):
            offsets = getattr(w, f"{name}_offsets")
            if not len(offsets):
                continue
            _set_texts(
                v, f"workload.{name}", np.asarray(offsets, np.int64), _Text(getattr(w, name))
            )

    def node_texts(self, name: str, text: _Text) -> None:
        """No control character in ``state.<name>[i]``."""
        self.node_rule(
            text.control(), lambda i, g: (f"state.{name}[{i}]", _text_refusal(text.value(g)))
        )
