"""The Runtime-side mirroring client: imports only grpcio and protobuf.

Runtime calls `MirrorClient.mirror(request)` on its hot path; the call only
appends to a bounded in-memory buffer and returns. A background thread keeps a
bidirectional stream open, resends what was not acked after a reconnect, and
counts everything it had to drop. Nothing here can block or raise into the
caller. The wire format is documented in docs/client.md for other languages.
"""

from service.client.mirror_client import ClientStats, MirrorClient

__all__ = ["ClientStats", "MirrorClient"]
