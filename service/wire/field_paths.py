"""Every field path a refused mirror or outcome can name, read off the wire schema.

Rejections are counted by field (``understudy_ingest_rejections_total``), and a
label value must come from a bounded set: a hostile client that sends a new
unknown JSON key per request would otherwise create a new series per request
(issue 20: 300 requests, 300 series, ``/metrics`` 42 -> 117 KB). The set is
derived from the protobuf descriptors rather than typed out, because both
transports carry exactly these field names (the HTTP models mirror the messages
field for field, docs/contract.md), so a field added to the schema is counted
by name without anyone remembering this list.

Paths are written as the validators write them with indices dropped
(``state.node_ids[3]`` -> ``state.node_ids[]``): a repeated field appears both
bare and with ``[]``, a repeated message's fields under ``name[].``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from service.wire.understudy.v1 import batch_pb2
from service.wire.understudy.v1 import contract_pb2 as pb

ENVELOPE_FIELDS = frozenset(
    {
        "body",
        "message",
        "request",
        "outcome",
        "batch",
        "sequence",
        "options[]",
        "content-type",
        "requests",
        "outcomes",
    }
)
"""Names a refusal may give that are not message fields: the whole HTTP body, a
whole gRPC stream message, a stream envelope part (a batch stream's `batch`),
one placement option (``options[3]``), an HTTP batch body's content type, and
the list of a JSON batch body (``{"requests": [...]}``, ``{"outcomes": [...]}``:
missing, not a list, or too long). Stream acks name the refused field by these
paths too."""


def _paths(message: Any, prefix: str) -> Iterator[str]:
    # `Any`: the stubs type DESCRIPTOR as the Python or the upb `Descriptor`.
    for field in message.fields:
        path = f"{prefix}{field.name}"
        yield path
        repeated = field.is_repeated
        if repeated or field.type == field.TYPE_BYTES:  # a batch's bytes are packed arrays
            yield f"{path}[]"
        if field.message_type is not None:
            yield from _paths(field.message_type, f"{path}[]." if repeated else f"{path}.")


def known_field_paths() -> frozenset[str]:
    """Field paths of `MirrorRequest`, `Outcome` and their batch forms (a batch refused
    whole names a column, e.g. ``states.cpu_free``), indices dropped, plus the envelope's."""
    roots = (
        pb.MirrorRequest.DESCRIPTOR,
        pb.Outcome.DESCRIPTOR,
        batch_pb2.MirrorBatch.DESCRIPTOR,
        batch_pb2.OutcomeBatch.DESCRIPTOR,
    )
    return frozenset(p for root in roots for p in _paths(root, "")) | ENVELOPE_FIELDS


KNOWN_FIELD_PATHS: frozenset[str] = known_field_paths()
