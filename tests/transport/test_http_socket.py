"""The HTTP listening socket: accepted connections must have Nagle's algorithm off.

asyncio (under uvicorn) sets TCP_NODELAY on an accepted connection only when
the listening socket says its protocol is TCP; a socket made with proto 0
kept keep-alive HTTP mirroring at ~21 requests/s per connection (every
response held ~40 ms by Nagle + delayed ACK). Found by the benchmarks.
"""

from __future__ import annotations

import asyncio
import socket

from service.server.runtime import bind_socket


def test_accepted_connections_have_tcp_nodelay() -> None:
    async def run() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn: socket.socket = writer.get_extra_info("socket")
            seen.set_result(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        listener = bind_socket("127.0.0.1", 0)
        server = await asyncio.start_server(handle, sock=listener)
        port = listener.getsockname()[1]
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            nodelay = await asyncio.wait_for(seen, timeout=10)
            writer.close()
        return nodelay

    assert asyncio.run(run()) != 0
