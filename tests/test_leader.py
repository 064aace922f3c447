"""The leader elector (reconciler/leader.py) without a cluster."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading

from kubernetes import client

from kubeindex.api import ApiClient, Connection
from reconciler.leader import LeaderElector, LeaseSettings


def test_elector_survives_dropped_connections() -> None:
    """A load balancer that closes kept-alive connections (aiohttp's ServerDisconnectedError)
    used to escape the elector and end the process."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    stop = threading.Event()

    def accept_and_drop() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):  # the accept timeout, or the socket closed at the end
                conn, _ = server.accept()
                conn.recv(65536)
                conn.close()  # mid-request, no answer

    threading.Thread(target=accept_and_drop, daemon=True).start()

    async def main() -> str:
        api = ApiClient(Connection(f"http://127.0.0.1:{port}", False, client.Configuration()))
        async with api:
            elector = LeaderElector(api, LeaseSettings("default", identity="x", retry_period=0.1))
            for _ in range(3):
                await elector._step()
            assert not elector.is_leader
            return elector.last_error

    try:
        assert "ServerDisconnected" in asyncio.run(main())
    finally:
        stop.set()
        server.close()
