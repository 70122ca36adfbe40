"""Validation of a `RequestBatch` by index (issue 24): helper B's module.

Only `IndexedRefusal` is here so far (helper A's codec needs it for JSON rows
that do not decode); B adds `validate_batch` and `BatchVerdict`.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.contract.rejections import RejectionReason


@dataclass(frozen=True, slots=True)
class IndexedRefusal:
    """One refused request of a batch: its position in what was sent, the field path (as
    the single-request validator names it), the message and the reason code."""

    index: int
    field: str
    message: str
    reason: RejectionReason
