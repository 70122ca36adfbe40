"""HTTP JSON batch bodies to batch columns (issue 24): ``{"requests": [...]}``.

Each row is the body ``POST /v1/mirror`` takes, decoded by that route's own
decoder (`service.transport.http.decode`), so a row means here what it means
alone. The envelope is split with msgspec into raw rows without parsing them;
a body that is not such an envelope, holds no rows, or holds more than
``limits.max_batch_requests`` rows, is refused whole (`InvalidInput`).

A row is refused by its index (an `IndexedRefusal`, worded as the single
request's refusal) when it does not decode *or does not validate*: the columns
cannot hold a row whose own columns disagree in length (its nodes would shift
every later snapshot), and they say "not given" with NaN, so a given NaN
(which JSON decoding lets through to the validator) would come out as not
given. Validating each row here keeps every batched row exactly the request
that was sent; its verdict is `validate_request`'s, which the batch validator
is held to, so the later batch validation agrees with it.

This is the slow form (one Python request per row, like the single route);
the columnar form is ``application/x-protobuf`` (`service.wire.batch_codec`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
import numpy as np
from numpy.typing import NDArray

from service.contract import (
    InvalidInput,
    MirrorRequest,
    Outcome,
    validate_outcome,
    validate_request,
)
from service.contract.batch import BATCH_SCHEMA_VERSION, OutcomeColumns, RequestBatch
from service.contract.batch.validation import IndexedRefusal
from service.contract.errors import MalformedMessage, MissingField, UnsupportedSchemaVersion
from service.contract.rejections import RejectionReason, refusal_of
from service.contract.validation import RequestLimits
from service.transport.http.decode import mirror_from_json, outcome_from_json
from service.wire.batch_codec import DecodedBatch, DecodedOutcomes

_Row = TypeVar("_Row")
_ENVELOPE = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ROWS = msgspec.json.Decoder(list[msgspec.Raw])


def _rows(body: bytes, key: str, limits: RequestLimits) -> list[bytes]:
    """The rows of ``{key: [...]}``, each as the bytes of one single-route body; anything
    else refuses the body whole."""
    try:
        envelope: dict[str, Any] = _ENVELOPE.decode(body)
        strict = True
    except msgspec.DecodeError as exc:
        envelope, strict = _lenient(body, key, exc), False
    extra = sorted(set(envelope) - {key})
    if extra:
        raise InvalidInput(extra[0], f"is not a field of a batch body (only `{key}`)")
    if key not in envelope:
        raise MissingField(key, "is required")
    if strict:
        try:
            rows: list[Any] = _ROWS.decode(envelope[key])
        except msgspec.DecodeError as exc:
            raise InvalidInput(key, f"must be a list: {exc}") from exc
    elif isinstance(envelope[key], list):
        rows = envelope[key]
    else:
        raise InvalidInput(key, f"must be a list, got {type(envelope[key]).__name__}")
    if not rows:  # a client bug (a sender with a linger never sends one): not a 200 of zeros
        raise InvalidInput(key, f"must hold at least one {key[:-1]}, got none")
    if len(rows) > limits.max_batch_requests:
        raise InvalidInput(
            key,
            f"must hold at most {limits.max_batch_requests} rows (max_batch_requests), "
            f"got {len(rows)}",
        )
    return [bytes(row) for row in rows] if strict else [json.dumps(row).encode() for row in rows]


def _lenient(body: bytes, key: str, first: msgspec.DecodeError) -> dict[str, Any]:
    """The envelope by the standard library, which also reads NaN and Infinity: they are
    not JSON, but the single route reads them (and its validator refuses them, naming the
    field), so a row holding one must be refused alone, not take its batch with it. Each
    row is written back with ``json.dumps`` (floats by repr: the same numbers)."""
    try:
        envelope = json.loads(body)
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep
        raise MalformedMessage(
            "body", f"must be a JSON object {{{key!r}: [...]}}: {first}"
        ) from exc
    if not isinstance(envelope, dict):
        raise MalformedMessage(
            "body", f"must be a JSON object {{{key!r}: [...]}}, got {type(envelope).__name__}"
        )
    return envelope


def _refusal(index: int, exc: InvalidInput) -> IndexedRefusal:
    refusal = refusal_of(exc)
    reason = refusal.reason if refusal is not None else RejectionReason.INVALID_VALUE
    return IndexedRefusal(index, exc.field, exc.problem, reason)


def _decode_rows(
    rows: list[bytes], decode: Callable[[bytes], _Row]
) -> tuple[list[_Row], list[int], list[IndexedRefusal]]:
    kept: list[_Row] = []
    index: list[int] = []
    refusals: list[IndexedRefusal] = []
    for i, raw in enumerate(rows):
        try:
            kept.append(decode(raw))
        except InvalidInput as exc:
            refusals.append(_refusal(i, exc))
        else:
            index.append(i)
    return kept, index, refusals


def decode_json_batch(body: bytes, limits: RequestLimits) -> DecodedBatch:
    """The batch of an HTTP JSON mirror-batch body; rows that fail are refused by index.

    Raises:
        InvalidInput: the body is not ``{"requests": [...]}`` of one to
            ``limits.max_batch_requests`` rows (`MalformedMessage` when not a JSON object).
    """

    def decode(row: bytes) -> MirrorRequest:
        request, _ = mirror_from_json(row)
        validate_request(request, limits)
        if request.schema_version != BATCH_SCHEMA_VERSION:
            raise UnsupportedSchemaVersion(
                "schema_version",
                f"must be {BATCH_SCHEMA_VERSION} in a batch (a schema-1 sender mirrors one "
                f"by one), got {request.schema_version}",
            )
        return request

    rows = _rows(body, "requests", limits)
    kept, index, refusals = _decode_rows(rows, decode)
    return DecodedBatch(
        batch=RequestBatch.from_requests(kept),
        index=_index(index),
        refusals=tuple(refusals),
        n_sent=len(rows),
    )


def decode_json_outcomes(body: bytes, limits: RequestLimits) -> DecodedOutcomes:
    """The outcomes of an HTTP JSON outcome-batch body ``{"outcomes": [...]}`` (each row
    the body ``POST /v1/outcomes`` takes); rows that fail are refused by index.

    Raises:
        InvalidInput: as `decode_json_batch`.
    """

    def decode(row: bytes) -> Outcome:
        outcome, _ = outcome_from_json(row)
        validate_outcome(outcome, limits)
        return outcome

    rows = _rows(body, "outcomes", limits)
    kept, index, refusals = _decode_rows(rows, decode)
    return DecodedOutcomes(
        outcomes=OutcomeColumns.from_outcomes(kept),
        index=_index(index),
        refusals=tuple(refusals),
        n_sent=len(rows),
    )


def _index(positions: list[int]) -> NDArray[np.int64]:
    out = np.array(positions, dtype=np.int64)
    out.flags.writeable = False
    return out
