"""`node-workload-summary`: one set of watches feeding the exporter and the reconciler, until
SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

import uvloop
from aiohttp import web

from exporter.metrics import Renderer
from exporter.server import make_app
from kubeindex.api import ApiClient, load_connection
from kubeindex.index import ClusterIndex
from kubeindex.metrics import SourcesCollector
from kubeindex.reflector import WatchSettings
from kubeindex.sources import Sources
from reconciler.controller import Reconciler, ReconcilerSettings
from reconciler.desired import identity
from reconciler.leader import LeaderElector, LeaseSettings
from reconciler.metrics import ReconcilerCollector

from .settings import InvalidSettings, Settings, load

log = logging.getLogger("node-workload-summary")
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def lease_namespace(settings: Settings) -> str:
    if settings.lease_namespace:
        return settings.lease_namespace
    with contextlib.suppress(OSError):
        return SA_NAMESPACE.read_text().strip()
    return os.environ.get("POD_NAMESPACE", "default")


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
        elector = reconciler = None
        tasks: list[asyncio.Task] = []
        if settings.reconciler:
            if settings.leader_election:
                elector = LeaderElector(api, LeaseSettings(
                    lease_namespace(settings), settings.lease_name, settings.identity or identity(),
                    settings.lease_duration, settings.renew_deadline, settings.retry_period))
                tasks.append(asyncio.create_task(elector.run(), name="leader election"))
            reconciler = Reconciler(api, index, sources, elector, ReconcilerSettings(
                debounce=settings.write_debounce, writes_per_second=settings.writes_per_second), watch)
            tasks.append(asyncio.create_task(reconciler.run(), name="reconciler"))
        renderer = Renderer(index, settings.max_workload_series, settings.max_nodegroup_series)
        renderer.registry.register(SourcesCollector(sources))
        if reconciler is not None:
            renderer.registry.register(ReconcilerCollector(reconciler, elector))
        runner = web.AppRunner(make_app(renderer if settings.exporter else None, sources), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, settings.listen_address, settings.port)
        await site.start()
        log.info("serving on %s (API server %s; exporter %s, reconciler %s)", site.name, connection.host,
                 "on" if settings.exporter else "off", "on" if settings.reconciler else "off")
        await sources.start()

        def crashed(task: asyncio.Task) -> None:  # a loop that dies must not go unnoticed: exit
            if not task.cancelled() and task.exception() is not None:
                log.error("%s failed: %r; exiting", task.get_name(), task.exception())
                stop.set()

        for task in tasks:
            task.add_done_callback(crashed)
        try:
            await stop.wait()
        finally:
            log.info("shutting down")
            for task in tasks:
                task.cancel()
            if elector is not None:
                with contextlib.suppress(Exception):
                    await elector.release()
            await sources.stop()
            await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    try:
        settings = load(sys.argv[1:] if argv is None else argv)
    except InvalidSettings as err:
        for problem in err.problems:
            print(f"error: {problem}", file=sys.stderr)
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
