"""What makes two sends the same request: one content digest (docs/ingest.md, "Identity").

``request_id`` is the identity of a request. Two sends with the same id are
the same request when `content_sha256` of their decoded contract objects is
equal; the same id with another digest is a conflicting request, refused at
ingest and, when ingest could not know, kept out of the log by the writer.
Both call this one function, so the two can never disagree.

The digest is over the *contract content*, after decoding and version mapping,
not over the bytes that came: JSON and protobuf forms of one request, a
protobuf with unknown fields or another field order, a version-1 request and
its version-2 equivalent, and a request sent alone or in a batch all have one
digest. ``schema_version`` is left out (it says how the request was written,
not what it says); the received time and the journal position are not in the
request at all.

There is one definition, over batch columns
(`service.contract.batch.identity.request_digests`, where the canonical
encoding is described): a single request's digest is its digest as a batch of
one, so ingest can hash a batch without building request objects and still
agree with every single-request path. A single request is encoded straight
from its object (`single_request_encoding`), to the same bytes as its row of
any batch (held equal by tests/contract/test_batch_identity.py), so it does not
pay a conversion to columns. Outcomes have no digest: the writer compares them
field by field (docs/storage.md, "Outcome join").
"""

from __future__ import annotations

import hashlib

from service.contract.batch.identity import single_request_encoding
from service.contract.request import MirrorRequest


def content_sha256(request: MirrorRequest) -> bytes:
    """sha256 (32 bytes) of the request's canonical encoding: equal iff two sends are the
    same request.

    The one definition the ingest index and the decision-log writer both use; equal to
    ``request_digests(RequestBatch.from_requests([request]))[0]`` and to the request's
    row of `request_digests` of any batch holding it.
    """
    return hashlib.sha256(single_request_encoding(request)).digest()
