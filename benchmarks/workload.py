"""Benchmark traffic: seeded synthetic requests and cheap per-message templates.

A load generator cannot afford to build a protobuf or JSON body per message
(that would measure the generator), yet every request needs its own
`request_id` (the log deduplicates on it). So each body is serialised once
with a fixed-width placeholder id and sent as ``prefix + id + suffix``: the
lengths never change, so the protobuf and JSON stay valid.

The default shape is the issue's: ~10 KB per request (128 nodes), 50 options.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from service.contract import MirrorRequest
from service.policies.synthetic import random_requests
from service.transport.http.convert import mirror_to_json
from service.wire.convert import mirror_request_to_pb

PLACEHOLDER = "bench-XXXXXXXXXXXXXXXXXXXX"
N_NODES = 128
N_OPTIONS = 50


def requests(
    n: int, options: int = N_OPTIONS, nodes: int = N_NODES, seed: int = 7
) -> list[MirrorRequest]:
    """`n` seeded requests with up to `options` options, stamped with the current time."""
    now = time.time()
    out = random_requests(seed=seed, n_requests=n, n_nodes=nodes, max_options=options)
    return [
        dataclasses.replace(r, request_id=PLACEHOLDER, request_time=now + i * 1e-3)
        for i, r in enumerate(out)
    ]


@dataclass(frozen=True)
class Template:
    """A serialised body split around its request-id placeholder."""

    prefix: bytes
    suffix: bytes

    @classmethod
    def split(cls, body: bytes) -> Template:
        """Split `body` at its only placeholder."""
        marker = PLACEHOLDER.encode()
        if body.count(marker) != 1:
            raise ValueError("the body must hold the request-id placeholder exactly once")
        prefix, suffix = body.split(marker)
        return cls(prefix, suffix)

    def body(self, tag: str, index: int) -> bytes:
        """The body with a unique id ``<tag>-<index>`` padded to the placeholder's width."""
        width = len(PLACEHOLDER) - len(tag) - 1
        rid = f"{tag}-{index:0{width}d}"
        if len(rid) != len(PLACEHOLDER):
            raise ValueError(f"tag {tag!r} or index {index} does not fit the placeholder")
        return self.prefix + rid.encode() + self.suffix


def protobuf_templates(reqs: list[MirrorRequest]) -> list[Template]:
    """`MirrorRequest` protobuf bodies."""
    return [Template.split(mirror_request_to_pb(r).SerializeToString()) for r in reqs]


def json_templates(reqs: list[MirrorRequest]) -> list[Template]:
    """HTTP JSON bodies (the shape `POST /v1/mirror` takes)."""
    return [Template.split(mirror_to_json(r)) for r in reqs]


def stream_envelope(sequence: int, request: bytes) -> bytes:
    """A serialised `MirrorStreamRequest` (sequence = 1, request = 2) without a protobuf call."""
    return b"\x08" + varint(sequence) + b"\x12" + varint(len(request)) + request


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, next position) of the varint at `pos`."""
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
