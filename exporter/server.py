"""The HTTP server: /metrics (Prometheus text or OpenMetrics), /healthz, /readyz."""

from __future__ import annotations

import gzip

from aiohttp import web

from kubeindex.sources import Sources

from .metrics import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, Renderer


def make_app(renderer: Renderer | None, sources: Sources | None) -> web.Application:
    """``renderer`` None: the exporter is switched off, only the probes are served."""
    async def metrics(request: web.Request) -> web.Response:
        assert renderer is not None
        openmetrics = "application/openmetrics-text" in request.headers.get("Accept", "")
        body = renderer.render(openmetrics)
        headers = {"Content-Type": OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE}
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            # Level 1: a fraction of level 9's CPU for nearly the same size on exposition text.
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if sources is None or sources.ready.is_set():
            return web.Response(text="ok\n")
        pending = [name for name, r in sources.reflectors.items() if not r.synced.is_set()]
        return web.Response(status=503, text=f"initial sync in progress: {', '.join(pending) or 'owner kinds'}\n")

    app = web.Application()
    if renderer is not None:
        app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app
