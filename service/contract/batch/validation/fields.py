"""Rules on one value per request (or outcome): ids, vocabularies, times, quantities.

`validate_request`'s `_check_id`, text, vocabulary, time and quantity checks as
one mask over a column each; shared by the request rules and the outcome rules,
which check the same fields the same way. Vectorised because a column is one
numpy array (or one UTF-8 buffer, `utf8._Text`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from service.contract.batch.validation.arrays import I64, _counts_in
from service.contract.batch.validation.utf8 import _has_control, _Text, _text_refusal
from service.contract.batch.validation.verdicts import _Verdicts
from service.contract.validation import (
    MAX_QUANTITY,
    MAX_UNIX_SECONDS,
    MAX_VOCABULARY_LENGTH,
)


def _finite_at_least_0(
    v: _Verdicts,
    field: str,
    x: NDArray[np.float64],
    when: str,
    shown: NDArray[np.float64] | None = None,
) -> None:
    shown = x if shown is None else shown
    v.request(
        ~np.isfinite(x) | (x < 0),
        lambda r: (field, f"must be finite and >= 0{when}, got {float(shown[r])}"),
    )


def _positive_when_set(v: _Verdicts, field: str, x: NDArray[np.float64]) -> None:
    v.request(
        ~np.isnan(x) & ~(np.isfinite(x) & (x > 0)),
        lambda r: (field, f"must be finite and > 0 when set, got {float(x[r])}"),
    )


def _set_texts(v: _Verdicts, field: str, offsets: I64, text: _Text) -> None:
    """No control character in a workload's string set (named unindexed, the first
    offending value in sorted order, as check_request_texts names it)."""
    bad = _counts_in(text.control(), offsets) > 0

    def first_sorted(r: int) -> str:
        values = sorted(text.s.values(int(offsets[r]), int(offsets[r + 1])))
        return next(x for x in values if _has_control(x))

    v.request(bad, lambda r: (field, _text_refusal(first_sorted(r))))


def _ids(v: _Verdicts, field: str, text: _Text, max_length: int) -> None:
    """`_check_id`: non-empty, at most `max_length` characters, no control characters."""
    v.request(text.empty, lambda r: (field, "must be a non-empty string"))
    v.request(
        text.chars() > max_length, lambda r: (field, f"must be at most {max_length} characters")
    )
    _control(v, field, text)


def _control(v: _Verdicts, field: str, text: _Text) -> None:
    v.request(text.control(), lambda r: (field, _text_refusal(text.value(r))))


def _vocabulary(v: _Verdicts, field: str, text: _Text, required: bool) -> None:
    if required:
        v.request(text.empty, lambda r: (field, "must be a non-empty string"))
    chars = text.chars()
    v.request(
        chars > MAX_VOCABULARY_LENGTH,
        lambda r: (
            field,
            f"must be at most {MAX_VOCABULARY_LENGTH} characters, got {int(chars[r])}",
        ),
    )
    _control(v, field, text)


def _time(v: _Verdicts, field: str, t: NDArray[np.float64]) -> None:
    v.request(
        ~(np.isfinite(t) & (t > 0) & (t <= MAX_UNIX_SECONDS)),
        lambda r: (
            field,
            f"must be positive Unix seconds no later than {MAX_UNIX_SECONDS:.0f} "
            f"(year 9999), got {float(t[r])}",
        ),
    )


def _quantity(v: _Verdicts, field: str, x: NDArray[np.float64]) -> None:
    v.request(
        x > MAX_QUANTITY,
        lambda r: (field, f"must be at most {MAX_QUANTITY:g}, got {float(x[r])}"),
    )
