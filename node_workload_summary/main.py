"""`node-workload-summary`: one set of watches feeding the exporter and the reconciler, until
SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import os
import signal
import socket
import ssl
import sys
from collections.abc import Awaitable
from pathlib import Path

import uvloop
from aiohttp import web

from exporter.auth import Authorizer
from exporter.metrics import Renderer
from exporter.server import make_app
from exporter.tls import CertFiles, CertificateError, load_pem, self_signed_hosts, self_signed_pem, server_context
from kubeindex.api import ApiClient, ConfigError, load_connection
from kubeindex.index import ClusterIndex
from kubeindex.metrics import SourcesCollector
from kubeindex.reflector import WatchSettings
from kubeindex.sources import Sources
from reconciler.controller import Reconciler, ReconcilerSettings
from reconciler.leader import LeaderElector, LeaseSettings, identity
from reconciler.metrics import ReconcilerCollector

from .gcfreeze import Freezer
from .settings import InvalidSettings, Settings, load
from .version import build_info

log = logging.getLogger("node-workload-summary")
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
LEASE_CONNECTIONS = 2
# Shutdown is bounded (about 5 s in all) so a hung API server cannot hold the exit; the lease
# release is best effort, an unreleased lease expires on its own.
LEASE_RELEASE_SECONDS = 2.0
STEP_SECONDS = 0.75
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 128 * 1024  # glibc's initial value


class StartupError(Exception):
    """A start that cannot work; the message says what to fix."""


def pin_mmap_threshold() -> bool:
    """Keep glibc's mmap threshold at its initial 128 KiB. glibc raises it to the size of any
    larger block freed (a LIST page of a few MB), and from then on transient buffers up to that
    size come from the brk heap: under pod churn the heap fragments and RSS creeps (about 100
    bytes per replaced pod) while the Python objects stay flat. Setting it also stops the raising.
    False without glibc, or where MALLOC_MMAP_THRESHOLD_ already decides."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1


def lease_namespace(settings: Settings) -> str:
    if settings.lease_namespace:
        return settings.lease_namespace
    with contextlib.suppress(OSError):
        return SA_NAMESPACE.read_text().strip()
    return os.environ.get("POD_NAMESPACE", "default")


async def listen(runner: web.AppRunner, address: str, port: int, ssl_context: ssl.SSLContext | None = None,
                 flag: str = "--port") -> web.TCPSite:
    site = web.TCPSite(runner, address, port, ssl_context=ssl_context)
    try:
        await site.start()
    except OSError as err:
        host = f"[{address}]" if ":" in address else address
        unknown = isinstance(err, socket.gaierror)
        reason = "not an IP address or a known host name" if unknown else os.strerror(err.errno or 0)
        raise StartupError(f"cannot listen on {host}:{port}: {reason} (--listen-address, {flag})") from None
    return site


def metrics_tls(settings: Settings) -> tuple[ssl.SSLContext | None, CertFiles | None]:
    """The metrics server's TLS context (None: plain HTTP), and the files to watch if any."""
    if not settings.metrics_secure:
        return None, None
    context = server_context()
    if settings.metrics_cert_file and settings.metrics_key_file:
        return context, CertFiles(context, settings.metrics_cert_file, settings.metrics_key_file)
    load_pem(context, self_signed_pem(self_signed_hosts()))  # a new one on every start
    return context, None


async def within(seconds: float, what: str, step: Awaitable[object]) -> None:
    """One shutdown step, given at most ``seconds``; a failure is logged and shutdown goes on."""
    try:
        await asyncio.wait_for(step, seconds)
    except TimeoutError:
        log.warning("shutdown: gave up %s after %g s", what, seconds)
    except Exception as err:
        log.warning("shutdown: %s failed: %r", what, err)


async def serve(settings: Settings) -> None:
    connection = load_connection(settings.kubeconfig, settings.context)
    if settings.workload_pod_labels:
        log.warning("--workload-pod-labels is deprecated: list the keys in a WorkloadSummarizer's "
                    "spec.podLabelWorkloads (live, and with WorkloadSummaries); its keys (%s) name workloads "
                    "in the metrics only", ", ".join(settings.workload_pod_labels))
    index = ClusterIndex(settings.workload_pod_labels, max_depth=settings.max_owner_depth,
                         disruption_taints=settings.disruption_taints, problem_conditions=settings.problem_conditions,
                         accelerator_resources=settings.accelerator_resources)
    watch = WatchSettings(page_size=settings.page_size, timeout_min=settings.watch_timeout_min,
                          timeout_max=settings.watch_timeout_max, read_timeout=settings.read_timeout,
                          initial_list=settings.initial_list)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    api = ApiClient(connection)
    # The Lease has a pool of its own: past about 50 owner kinds the watches hold every connection
    # of the main pool, and renewals waiting for one would lose the lease.
    lease_api = ApiClient(connection, max_connections=LEASE_CONNECTIONS)
    sources = Sources(api, index, watch, sync_grace=settings.sync_loss_grace)
    elector = reconciler = None
    if settings.reconciler:
        if settings.leader_election:
            elector = LeaderElector(lease_api, LeaseSettings(
                lease_namespace(settings), settings.lease_name, settings.identity or identity(),
                settings.lease_duration, settings.renew_deadline, settings.retry_period))
        reconciler = Reconciler(api, index, sources, elector, ReconcilerSettings(
            debounce=settings.write_debounce, writes_per_second=settings.writes_per_second), watch)
        if elector is not None:
            elector.may_lead = reconciler.not_ready  # an unsynced replica must not hold the lease
    renderer = Renderer(index, settings.max_workload_series, settings.max_nodegroup_series,
                        dataclasses.asdict(build_info()))
    renderer.registry.register(SourcesCollector(sources))
    if reconciler is not None:
        renderer.registry.register(ReconcilerCollector(reconciler, elector))
    tls, cert_files = metrics_tls(settings)
    authorizer = Authorizer(api, "/metrics", settings.metrics_auth_cache_ttl,
                            settings.metrics_auth_cache_size) if settings.metrics_secure else None
    apart = settings.probe_port is not None
    runner = web.AppRunner(make_app(renderer if settings.exporter else None, sources, authorizer, probes=not apart),
                           access_log=None)
    probe_runner = web.AppRunner(make_app(None, sources), access_log=None) if apart else None
    tasks: list[asyncio.Task] = []

    def crashed(task: asyncio.Task) -> None:  # a loop that dies must not go unnoticed: exit
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed: %r; exiting", task.get_name(), task.exception())
            stop.set()

    try:
        await runner.setup()
        # Bound before anything talks to the API server: a taken port is then the one thing said.
        site = await listen(runner, settings.listen_address, settings.port, tls)
        probe_site = None
        if probe_runner is not None and settings.probe_port is not None:
            await probe_runner.setup()
            probe_site = await listen(probe_runner, settings.listen_address, settings.probe_port, flag="--probe-port")
        log.info("%s serving on %s (API server %s; exporter %s, reconciler %s)", build_info(), site.name,
                 connection.host, "on" if settings.exporter else "off", "on" if settings.reconciler else "off")
        if probe_site is not None:
            log.info("probes (/healthz, /readyz) on %s", probe_site.name)
        if tls is not None:
            log.info("/metrics: HTTPS (%s), TokenReview + SubjectAccessReview, decisions cached %g s",
                     f"certificate from {settings.metrics_cert_file}" if cert_files else "self-signed certificate",
                     settings.metrics_auth_cache_ttl)
        if cert_files is not None:
            tasks.append(asyncio.create_task(cert_files.watch(), name="certificate reload"))
        if elector is not None:
            tasks.append(asyncio.create_task(elector.run(), name="leader election"))
        if reconciler is not None:
            tasks.append(asyncio.create_task(reconciler.run(), name="reconciler"))
        # Once synced, the index's objects leave the garbage collector's full walks (gcfreeze.py).
        tasks.append(asyncio.create_task(Freezer().run(sources.ready), name="garbage collection"))
        for task in tasks:
            task.add_done_callback(crashed)
        await sources.start()
        await stop.wait()
        log.info("shutting down")
    finally:
        if elector is not None and tasks:  # before the elector stops: a stopped elector holds nothing to release
            await within(LEASE_RELEASE_SECONDS, "releasing the lease", elector.release())
        for task in tasks:
            task.cancel()
        await within(STEP_SECONDS, "stopping the reconciler", asyncio.gather(*tasks, return_exceptions=True))
        await within(STEP_SECONDS, "stopping the watches", sources.stop())
        await within(STEP_SECONDS, "stopping the HTTP server", runner.cleanup())
        if probe_runner is not None:
            await within(STEP_SECONDS, "stopping the probe server", probe_runner.cleanup())
        await within(STEP_SECONDS, "closing API connections", asyncio.gather(api.close(), lease_api.close()))


def main(argv: list[str] | None = None) -> int:
    try:
        settings = load(sys.argv[1:] if argv is None else argv)
    except InvalidSettings as err:
        for problem in err.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    if settings.version:
        print(build_info())
        return 0
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    pin_mmap_threshold()
    try:
        uvloop.run(serve(settings))
    except (ConfigError, StartupError, CertificateError) as err:  # one line saying what to fix
        log.error("%s", err)
        return 1
    except Exception as err:  # a clear line, not a traceback
        log.error("%s: %s", type(err).__name__, err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
