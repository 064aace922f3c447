"""`node-workload-summary`: watch the cluster and serve the metrics until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import uvloop
from aiohttp import web
from pydantic import ValidationError

from exporter.metrics import Renderer
from exporter.server import make_app
from kubeindex.api import ApiClient, load_connection
from kubeindex.index import ClusterIndex
from kubeindex.reflector import WatchSettings
from kubeindex.sources import Sources

from .settings import Settings

log = logging.getLogger("node-workload-summary")


async def serve(settings: Settings) -> None:
    connection = load_connection(settings.kubeconfig, settings.context)
    index = ClusterIndex(settings.workload_pod_labels, max_depth=settings.max_owner_depth)
    watch = WatchSettings(page_size=settings.page_size, timeout_min=settings.watch_timeout_min,
                          timeout_max=max(settings.watch_timeout_min, settings.watch_timeout_max),
                          read_timeout=settings.read_timeout)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with ApiClient(connection) as api:
        sources = Sources(api, index, watch)
        renderer = Renderer(index, sources, settings.max_workload_series)
        runner = web.AppRunner(make_app(renderer, sources), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, settings.listen_address, settings.port)
        await site.start()
        log.info("serving /metrics on %s (API server %s)", site.name, connection.host)
        await sources.start()
        try:
            await stop.wait()
        finally:
            log.info("shutting down")
            await sources.stop()
            await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    try:
        settings = Settings(_cli_parse_args=sys.argv[1:] if argv is None else argv)  # type: ignore[call-arg]
    except ValidationError as err:
        print(f"error: invalid settings:\n{err}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        uvloop.run(serve(settings))
    except Exception as err:  # a clear line, not a traceback, for configuration problems
        log.error("%s: %s", type(err).__name__, err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
