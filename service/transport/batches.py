"""What both transports share about batches: decoding a parsed batch, wording a rejection.

`decoded_requests` / `decoded_outcomes` turn a parsed `MirrorBatch` /
`OutcomeBatch` into what `Ingest.mirror_batch` takes (every row sent, in
order); a batch that cannot be read is refused whole with `InvalidInput`,
noting how many requests it stated so ingest counts each (`stated_size`).
A rejection's message is the validator's sentence, naming the exact path.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from service.contract import InvalidInput, RequestLimits
from service.contract.rejections import RejectionReason
from service.wire.batch_codec import (
    DecodedBatch,
    DecodedOutcomes,
    batch_from_pb,
    outcomes_from_pb,
)
from service.wire.understudy.v1 import batch_pb2

MAX_MESSAGE_CHARS = 512
"""A rejection's message is cut to this many characters: with up to
`max_batch_requests` rejections an ack stays within gRPC's send limit."""


class Indexed(Protocol):
    """An `IndexedRefusal` (service.contract.batch.validation) as the acks read it."""

    @property
    def index(self) -> int: ...
    @property
    def field(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def reason(self) -> RejectionReason: ...


def validator_text(field: str, message: str) -> str:
    """The validator's whole sentence, naming the exact path (`state.cpu_free[5]`)
    that an ack's bounded `field` drops the indices of."""
    return message if message.startswith("`") else f"`{field}` {message}"


def stated_size(msg: batch_pb2.MirrorBatch | batch_pb2.OutcomeBatch) -> int:
    """How many requests a batch says it holds (its `request_id` offsets), 0 if unreadable.

    Only for counting a batch refused whole: the accounting is per request.
    """
    offsets = len(msg.request_id.offsets)
    return offsets // 8 - 1 if offsets >= 16 and offsets % 8 == 0 else 0


def _noting_size(exc: InvalidInput, msg: batch_pb2.MirrorBatch | batch_pb2.OutcomeBatch) -> None:
    # Ingest counts a batch refused whole as `exc.n_sent` rejections (one when unknown).
    exc.n_sent = stated_size(msg)  # type: ignore[attr-defined]


def decoded_requests(msg: batch_pb2.MirrorBatch, limits: RequestLimits) -> DecodedBatch:
    """A parsed `MirrorBatch` as ingest takes it: every row sent, in order."""
    try:
        batch = batch_from_pb(msg, limits)
    except InvalidInput as exc:
        _noting_size(exc, msg)
        raise
    n = batch.n_requests
    return DecodedBatch(batch, np.arange(n, dtype=np.int64), (), n)


def decoded_outcomes(msg: batch_pb2.OutcomeBatch, limits: RequestLimits) -> DecodedOutcomes:
    """A parsed `OutcomeBatch` as ingest takes it."""
    try:
        cols = outcomes_from_pb(msg, limits)
    except InvalidInput as exc:
        _noting_size(exc, msg)
        raise
    n = cols.n_outcomes
    return DecodedOutcomes(cols, np.arange(n, dtype=np.int64), (), n)
