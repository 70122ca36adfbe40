"""The one rule for every string of the contract: no C0 control characters.

Refused: U+0000-U+001F (NUL, tab, newline, carriage return, escape, ...), in
every string field of a mirrored request or outcome: ids, names, zones,
localities, labels, option ids, hardware lists.

Why all of C0 and not just NUL: PostgreSQL text cannot hold NUL, so a NUL
would be acked and then fail every attempt to log it; the other controls are
never part of a real identifier, and they break what reads these values
later (a newline or escape in a node id forges lines in logs, CSV exports and
terminal output of the reviewer tools). Everything else, including non-ASCII
letters and DEL, is accepted: the rule is about what cannot be stored or
shown safely, not about what Runtime should name things.

Clean requests are the norm, so a request's strings are joined and asked once
(`str.isprintable` in C, a regex only when that says no); the string-by-string
search that names the first offender runs only for a request already refused.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

from service.contract.errors import InvalidInput
from service.contract.request import MirrorRequest

_CONTROL = re.compile("[\x00-\x1f]")
_CONTROL_BYTES = bytes(range(0x20))
RULE = "must not contain control characters (U+0000-U+001F)"
_SHOWN = 40  # characters of an offending value quoted back (a value may be megabytes)


def has_control(text: str) -> bool:
    """Whether `text` holds a C0 control character."""
    if text.isascii():  # O(1); then deleting the controls in C is the fastest test
        raw = text.encode("ascii")
        return len(raw.translate(None, _CONTROL_BYTES)) != len(raw)
    return _CONTROL.search(text) is not None


def _refusal(field: str, value: str, where: str = "") -> InvalidInput:
    return InvalidInput(field, f"{where}{RULE}, got {value[:_SHOWN]!r}")


def check_text(field: str, value: str) -> None:
    """Raise `InvalidInput` naming `field` if `value` holds a control character."""
    if has_control(value):
        raise _refusal(field, value)


def _check_each(field: str, values: Iterable[str], indexed: bool) -> None:
    for i, value in enumerate(values):
        if has_control(value):
            raise _refusal(f"{field}[{i}]" if indexed else field, value)


def check_request_texts(request: MirrorRequest) -> None:
    """Raise `InvalidInput` naming the first string of `request` that holds a control character.

    Covers the state's, options' and workload's strings; `request_id`,
    `workload.workload_id`, `tenant` and `model_family` are checked where
    their other rules are.
    """
    s, w = request.state, request.workload
    # one string per column (`str.join` of a tuple is one C call), then one test
    joined = "".join(
        (
            "".join(s.node_ids),
            "".join(s.zone),
            "".join(s.locality),
            "".join(request.options.option_ids),
            # decoded label sets are shared objects (`labels_from_csr`): each distinct once
            "".join(itertools.chain.from_iterable(set(s.labels))),
            "".join([h.name for h in s.hardware]),
            "".join(w.allowed_hardware),
            "".join(w.affinity),
            "".join(w.anti_affinity),
        )
    )
    if not has_control(joined):
        return
    _check_each("state.node_ids", s.node_ids, indexed=True)
    for i, hardware in enumerate(s.hardware):
        check_text(f"state.hardware[{i}].name", hardware.name)
    _check_each("state.zone", s.zone, indexed=True)
    _check_each("state.locality", s.locality, indexed=True)
    for node, labels in enumerate(s.labels):
        for label in sorted(labels):
            if has_control(label):
                raise _refusal("state.labels", label, f"of node {node} ")
    _check_each("options.option_ids", request.options.option_ids, indexed=True)
    for field, values in (
        ("workload.allowed_hardware", w.allowed_hardware),
        ("workload.affinity", w.affinity),
        ("workload.anti_affinity", w.anti_affinity),
    ):
        _check_each(field, sorted(values), indexed=False)
