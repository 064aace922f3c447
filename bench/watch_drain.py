"""A WatchList of nodes and one of pods, read to their initial-events-end bookmark and thrown
away: what the API server pays to stream the service's two large collections in one encoding,
with no decoding on this side. `bench.apiserver_bill --modes drain-json drain-protobuf` runs it
in a process of its own (its hidden --drain flag); /readyz answers 200 once both initial states
have arrived, and the watches stay open (as the service's do) until the process is stopped.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from kubeindex.api import JSON, ApiClient, load_connection

ENCODINGS = {"json": JSON, "protobuf": "application/vnd.kubernetes.protobuf;stream=watch"}
# The bookmark's annotation, in either encoding's bytes (a string is a string in both).
END = b"k8s.io/initial-events-end"
PATHS = ("/api/v1/nodes", "/api/v1/pods")


async def drain(api: ApiClient, path: str, accept: str, done: asyncio.Event) -> None:
    params = {"watch": "1", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
              "allowWatchBookmarks": "true", "timeoutSeconds": "3600"}
    headers = {"Accept": accept, **api.connection.headers()}
    async with api.session.get(api.connection.host + path, params=params, headers=headers) as resp:
        if resp.status != 200:
            raise SystemExit(f"{path}: {resp.status} {(await resp.read())[:300]!r}")
        tail = b""  # the last bytes seen: the marker may span chunks
        async for chunk in resp.content.iter_any():
            if not done.is_set():
                seen = tail + chunk
                if END in seen:
                    done.set()
                tail = seen[-len(END):]


async def run(kubeconfig: str, encoding: str, port: int) -> None:
    ends = [asyncio.Event() for _ in PATHS]
    app = web.Application()

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(status=200 if all(e.is_set() for e in ends) else 503)

    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    async with ApiClient(load_connection(kubeconfig)) as api:
        accept = ENCODINGS[encoding]
        await asyncio.gather(*(drain(api, path, accept, end) for path, end in zip(PATHS, ends, strict=True)))
