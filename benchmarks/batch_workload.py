"""Batch benchmark traffic: `MirrorBatch` bodies built once, request ids patched per message.

Every request of every message needs its own `request_id` (ingest deduplicates
on it), yet building a batch per message would measure the generator. So each
batch is encoded once (`RequestBatch.from_requests` + `batch_to_pb`) with
fixed-width placeholder ids; the ids are one contiguous UTF-8 column
(`Strings.utf8`), so a message is ``prefix + ids + suffix`` with the id column
rewritten by one numpy assignment: the lengths never change and the protobuf
stays valid.

Shapes (`SHAPES`): ``record`` is the issue's shape of record, a fresh 128-node
cluster snapshot every 8 requests (`random_requests` shares one `ClusterState`
object per 8, so a 64-request batch carries 8 snapshots), up to 50 options per
request; ``worst`` gives every request its own snapshot (same requests, each
state copied, so the batch stores each one).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from benchmarks.workload import N_NODES, N_OPTIONS, varint
from service.contract import MirrorRequest
from service.contract.batch import RequestBatch
from service.policies.synthetic import random_requests
from service.wire.batch_codec import batch_to_pb

ID_WIDTH = 32  # "<tag>-<message, zero-padded>-<row, 4 digits>"
ROW_DIGITS = 4
SHAPES = ("record", "worst")
SHARE = 8  # requests per snapshot in the shape of record


def shaped_requests(
    n: int, shape: str = "record", seed: int = 11, options: int = N_OPTIONS
) -> list[MirrorRequest]:
    """`n` requests of `shape` (see the module docstring), stamped with the current time."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    now = time.time()
    out = random_requests(seed=seed, n_requests=n, n_nodes=N_NODES, max_options=options)
    reqs = []
    for i, r in enumerate(out):
        state = copy.copy(r.state) if shape == "worst" else r.state  # a distinct object
        reqs.append(
            dataclasses.replace(r, request_id="x", request_time=now + i * 1e-4, state=state)
        )
    return reqs


@dataclass(frozen=True)
class BatchTemplate:
    """A serialised `MirrorBatch` split around its request-id column."""

    prefix: bytes
    suffix: bytes
    rows: np.ndarray  # (n, ID_WIDTH) uint8: the placeholder ids, row numbers in place
    n: int
    snapshots: int

    @classmethod
    def of(cls, requests: list[MirrorRequest]) -> BatchTemplate:
        """Encode `requests` as one batch with placeholder ids."""
        ids = [_placeholder(i) for i in range(len(requests))]
        reqs = [
            dataclasses.replace(r, request_id=rid) for r, rid in zip(requests, ids, strict=True)
        ]
        batch = RequestBatch.from_requests(reqs)
        body = batch_to_pb(batch).SerializeToString()
        column = "".join(ids).encode()
        if body.count(column) != 1:
            raise ValueError("the id column must occur exactly once in the encoded batch")
        prefix, suffix = body.split(column)
        rows = np.frombuffer(column, dtype=np.uint8).reshape(len(reqs), ID_WIDTH).copy()
        return cls(prefix, suffix, rows, len(reqs), batch.states.n_states)

    def body(self, tag: str, message: int) -> bytes:
        """The batch with ids ``<tag>-<message>-<row>``, unique per (tag, message, row)."""
        head = f"{tag}-{message:0{ID_WIDTH - ROW_DIGITS - 2 - len(tag)}d}-".encode()
        if len(head) != ID_WIDTH - ROW_DIGITS:
            raise ValueError(f"tag {tag!r} or message {message} does not fit the id width")
        rows = self.rows.copy()
        rows[:, : len(head)] = np.frombuffer(head, dtype=np.uint8)
        return self.prefix + rows.tobytes() + self.suffix

    @property
    def size(self) -> int:
        """Bytes per message."""
        return len(self.prefix) + self.rows.size + len(self.suffix)


def _placeholder(row: int) -> str:
    return "Q" * (ID_WIDTH - ROW_DIGITS) + f"{row:0{ROW_DIGITS}d}"


def templates(
    batch_size: int, shape: str = "record", count: int = 4, options: int = N_OPTIONS
) -> list[BatchTemplate]:
    """`count` distinct batches of `batch_size` requests (from consecutive seeds)."""
    return [
        BatchTemplate.of(shaped_requests(batch_size, shape, seed=11 + k, options=options))
        for k in range(count)
    ]


def batch_envelope(sequence: int, batch: bytes) -> bytes:
    """A serialised `MirrorBatchStreamRequest` (sequence = 1, batch = 2)."""
    return b"\x08" + varint(sequence) + b"\x12" + varint(len(batch)) + batch
