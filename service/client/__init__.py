"""The Runtime-side mirroring client: grpcio, protobuf and Understudy's contract.

Runtime calls `MirrorClient.mirror(request)` (or `mirror_request` with a
contract object) on its hot path; the call only appends to a bounded in-memory
buffer and returns. A background thread per kind cuts what was offered into
columnar batches (`MirrorBatch`, `OutcomeBatch`) with a linger, keeps a
bidirectional batch stream open, resends unacked batches after a reconnect, and
counts everything it had to drop. Nothing here can block or raise into the
caller. The wire format is documented in docs/client.md for other languages.
"""

from service.client.batcher import BatchStats
from service.client.mirror_client import ClientStats, MirrorClient

__all__ = ["BatchStats", "ClientStats", "MirrorClient"]
