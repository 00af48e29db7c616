"""A stream across a server's pause (a weight update that freezes requests instead of aborting
them), on both transports and both twins: a pause of any length loses nothing and fires no
fastaccum timer the caller did not set, and the connection keeps itself known to whatever sits
between client and server (TCP keepalive)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from client_helpers import CHUNKED_HEAD, EVENTS, RawServer, Transport, chunks, run, wait_until

from fastaccum.transport.http1 import KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES


def socket_of(stream: Any) -> socket.socket:
    """The socket a running stream reads from (fastaccum.Client's, or aiohttp's)."""
    transport = stream._response.connection.transport if hasattr(stream, "_response") else stream._conn.transport
    sock: socket.socket = transport.get_extra_info("socket")
    return sock


def test_a_streams_connection_sends_tcp_keepalive_probes_after_a_minute_of_silence(transport: Transport) -> None:
    """A load balancer drops a connection it saw nothing on for minutes (AWS NLB after 350 s); a
    paused server sends nothing. Keepalive probes after 60 s of silence keep it known."""
    server = RawServer([CHUNKED_HEAD + chunks(EVENTS[:2])], hold=30)

    async def main() -> dict[str, int]:
        async with server as url, transport.open(url, abort_drain_s=None) as make:
            stream = make({"input_ids": [1], "rid": "ka"})
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.tokens >= 2, timeout=10)
            sock = socket_of(stream)
            options = {
                "keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                "idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                "interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                "probes": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            }
            stream.abort()
            await task
            return options

    if not hasattr(socket, "TCP_KEEPIDLE"):
        pytest.skip("this system has no TCP_KEEPIDLE")
    options = run(main())
    assert options["keepalive"] == 1 and (options["idle"], options["interval"], options["probes"]) == (
        KEEPALIVE_IDLE_S,
        KEEPALIVE_INTERVAL_S,
        KEEPALIVE_PROBES,
    )
