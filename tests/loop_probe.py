"""A probe of the service's event loop (node_workload_summary.main.run), run as its own process by
tests/unit/test_event_loop.py: while an aiohttp client's TLS handshakes are reset, as when kube-apiserver
restarts, an aiohttp server in the same loop must answer every scrape, and nothing may be written
into a connection it does not own.

    python -m tests.loop_probe [SECONDS] [--uvloop]

prints one JSON line and exits 1 on any dropped scrape or loop error. ``--uvloop`` runs the same
probe in uvloop (if installed) to show the defect that made the service leave it."""

from __future__ import annotations

import asyncio
import importlib
import json
import socket
import ssl
import struct
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Coroutine
from typing import Any

import aiohttp
from aiohttp import web

from node_workload_summary.main import run

BODY = b"x" * 30_000  # about a scrape's size: the answer takes a few segments


def resetting_server() -> int:
    """A TCP server that accepts and resets each connection (SO_LINGER 0): the client's TLS
    handshake fails with "Connection reset by peer"."""
    srv = socket.create_server(("127.0.0.1", 0), backlog=512)

    def serve() -> None:
        while True:
            conn, _ = srv.accept()
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            time.sleep(0.0005)  # let the ClientHello be sent first
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1]


def scrape_until(url: str, done: threading.Event, answers: Counter[str]) -> None:
    while not done.is_set():
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                answers["ok" if resp.read() == BODY else "wrong body"] += 1
        except OSError as err:
            answers[str(err)[:100]] += 1


async def probe(seconds: float) -> dict[str, Any]:
    loop_errors: list[str] = []
    asyncio.get_running_loop().set_exception_handler(
        lambda _, ctx: loop_errors.append(f"{ctx.get('message')}: {ctx.get('exception')!r}"))
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=BODY)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    answers: Counter[str] = Counter()
    done = threading.Event()
    scrapers = [threading.Thread(target=scrape_until, args=(f"http://127.0.0.1:{port}/metrics", done, answers))
                for _ in range(2)]
    for t in scrapers:
        t.start()
    resets = 0
    target = f"https://127.0.0.1:{resetting_server()}/"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl.create_default_context())) as session:
        async def handshake() -> None:
            nonlocal resets
            try:
                async with session.get(target) as resp:
                    await resp.read()
            except (aiohttp.ClientError, TimeoutError):
                resets += 1

        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await asyncio.gather(*(handshake() for _ in range(20)))
    done.set()
    for t in scrapers:
        await asyncio.to_thread(t.join)
    await runner.cleanup()
    return {"scrapes": dict(answers), "handshakes_reset": resets, "loop_errors": loop_errors[:5]}


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    seconds = float(args[0]) if args else 8.0
    result: dict[str, Any] = {}

    async def go() -> None:
        result.update(await probe(seconds))

    runner: Any = run
    if "--uvloop" in sys.argv:  # not a dependency: `pip install uvloop` to show the defect
        runner = importlib.import_module("uvloop").run
    coro: Coroutine[Any, Any, None] = go()
    runner(coro)
    print(json.dumps(result), flush=True)
    failed = sum(n for what, n in result["scrapes"].items() if what != "ok")
    return 1 if failed or result["loop_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
