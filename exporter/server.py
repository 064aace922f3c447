"""The HTTP servers: /metrics (Prometheus text or OpenMetrics), /healthz, /readyz; with an
Authorizer, /metrics answers only callers whose bearer token may read it."""

from __future__ import annotations

import gzip

from aiohttp import web

from kubeindex.watch.sources import Sources

from .auth import Authorizer
from .metrics import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, Renderer


def make_app(renderer: Renderer | None, sources: Sources | None, authorizer: Authorizer | None = None,
             probes: bool = True) -> web.Application:
    """``renderer`` None: the exporter is switched off; ``probes`` False: /healthz and /readyz are
    served elsewhere (a plain port of their own)."""
    async def metrics(request: web.Request) -> web.Response:
        assert renderer is not None
        if authorizer is not None:
            decision = await authorizer.decide(request.headers.get("Authorization", ""), request.remote or "")
            if not decision.allowed:
                headers = {"WWW-Authenticate": 'Bearer realm="metrics"'} if decision.status == 401 else {}
                if decision.retry_after:  # 429: the bound on reviews; no review was sent
                    headers["Retry-After"] = str(decision.retry_after)
                return web.Response(status=decision.status, text=f"{decision.reason}\n", headers=headers)
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
        """503 with one line per problem (never listed, forbidden, not installed, out of contact
        longer than the grace); owner kinds that cannot be read follow "ok" without failing it."""
        if sources is None:
            return web.Response(text="ok\n")
        problems = sources.sync_problems()
        if problems:
            return web.Response(status=503, text="".join(f"{p}\n" for p in problems))
        notes = "".join(f"{p} (owner kind: not counted against readiness)\n" for p in sources.owner_problems())
        notes += "".join(f"{p} (optional kind: not counted against readiness)\n" for p in sources.optional_problems())
        return web.Response(text=f"ok\n{notes}")

    app = web.Application()
    if renderer is not None:
        app.router.add_get("/metrics", metrics)
    if probes:
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
    return app
