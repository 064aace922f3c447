"""`node-workload-summary`: one set of watches feeding the exporter and the reconciler, until
SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import ssl
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from exporter.auth import AuthCollector, Authorizer
from exporter.metrics import Renderer
from exporter.server import make_app
from exporter.tls import CertFiles, CertificateError, self_signed_hosts, self_signed_pem, server_context
from kubeindex.client.api import ApiClient, ConfigError, Connection, RequestMetrics, load_connection, load_pem
from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import MultiKueueCluster
from kubeindex.watch.fleet import MULTIKUEUE_CLUSTER, Fleet
from kubeindex.watch.metrics import FleetCollector, RequestCollector, SourcesCollector
from kubeindex.watch.reflector import Handler, WatchSettings
from kubeindex.watch.sources import Sources
from reconciler.claims import ClaimController, Claims, ClaimSettings, ClusterQueueController
from reconciler.desired import MANAGER
from reconciler.disruptions import DisruptionEventController
from reconciler.events import EventRecorder
from reconciler.leader import LeaderElector, LeaseSettings, identity
from reconciler.manager import Manager, ReconcilerSettings
from reconciler.metrics import ReconcilerCollector
from reconciler.summaries import SummaryController
from reconciler.summarizers import SummarizerController, SummarizerStatuses

from .gcfreeze import Freezer
from .logs import configure as configure_logs
from .settings import InvalidSettings, Settings, UsageError, load
from .tuning import pin_mmap_threshold, size_tls_reads
from .version import build_info

log = logging.getLogger("node-workload-summary")
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
LEASE_CONNECTIONS = 2
# Shutdown is bounded (about 5 s in all) so a hung API server cannot hold the exit; the lease
# release is best effort, an unreleased lease expires on its own.
LEASE_RELEASE_SECONDS = 2.0
STEP_SECONDS = 0.75


class StartupError(Exception):
    """A start that cannot work; the message says what to fix."""


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


@dataclass
class Service:
    """Everything one process runs, built and not yet started."""

    settings: Settings
    connection: Connection
    api: ApiClient
    lease_api: ApiClient
    sources: Sources
    fleet: Fleet | None
    elector: LeaderElector | None
    reconciler: Manager | None
    runner: web.AppRunner
    probe_runner: web.AppRunner | None
    tls: ssl.SSLContext | None
    cert_files: CertFiles | None
    tasks: list[asyncio.Task] = field(default_factory=list)


def build(settings: Settings) -> Service:
    """The components, wired: watches -> index -> exporter and reconciler. Nothing runs yet."""
    connection = load_connection(settings.kubeconfig, settings.context)
    if settings.workload_pod_labels:
        log.warning("--workload-pod-labels is deprecated: list the keys in a WorkloadSummarizer's "
                    "spec.podLabelWorkloads (live, and with WorkloadSummaries); its keys (%s) name workloads "
                    "in the metrics only", ", ".join(settings.workload_pod_labels))
    index = ClusterIndex(settings.workload_pod_labels, max_depth=settings.max_owner_depth,
                         disruption_taints=settings.disruption_taints, problem_conditions=settings.problem_conditions,
                         accelerator_resources=settings.accelerator_resources,
                         expiry_horizon=settings.nodeclaim_expiry_horizon, gang_grace=settings.gang_grace,
                         gang_topology_label=settings.gang_topology_label)
    watch = WatchSettings(page_size=settings.page_size, timeout_min=settings.watch_timeout_min,
                          timeout_max=settings.watch_timeout_max, read_timeout=settings.read_timeout,
                          initial_list=settings.initial_list, encoding=settings.encoding,
                          gather=settings.watch_gather)
    requests = RequestMetrics()  # both clients' requests, in one set of nws_rest_client_* series
    api = ApiClient(connection, metrics=requests)
    # The Lease has connections of its own: a renewal never waits for one behind the writes, the
    # LISTs or the metrics' TokenReviews, and a renewal that waited past its deadline loses the lease.
    lease_api = ApiClient(connection, max_connections=LEASE_CONNECTIONS, metrics=requests)
    sources = Sources(api, index, watch, sync_grace=settings.sync_loss_grace)
    if settings.karpenter_events == "on":
        sources.watch_blockers()
    # A connection gone silent (ApiClient._silent): the other client's, and the watches', may be too.
    lease_api.on_silence += [sources.reconnect, api.abandon]
    api.on_silence.append(lease_api.abandon)
    fleet = fleet_of(settings, api, sources, watch) if settings.fleet else None
    elector = reconciler = collector = None
    if settings.reconciler:
        if settings.leader_election:
            elector = LeaderElector(lease_api, LeaseSettings(
                lease_namespace(settings), settings.lease_name, settings.identity or identity(),
                settings.lease_duration, settings.renew_deadline, settings.retry_period))
        reconciler, collector = reconciler_of(settings, api, index, sources, fleet, elector)
        if elector is not None:
            elector.may_lead = reconciler.not_ready  # an unsynced replica must not hold the lease
    renderer = Renderer(index, settings.max_workload_series, settings.max_nodegroup_series,
                        dataclasses.asdict(build_info()))
    renderer.registry.register(SourcesCollector(sources))
    renderer.registry.register(RequestCollector(requests))
    if fleet is not None:
        renderer.registry.register(FleetCollector(fleet))
    if collector is not None:
        renderer.registry.register(collector)
    tls, cert_files = metrics_tls(settings)
    authorizer = Authorizer(api, "/metrics", settings.metrics_auth_cache_ttl, settings.metrics_auth_cache_size,
                            settings.metrics_auth_reviews_per_second,
                            settings.metrics_auth_review_burst) if settings.metrics_secure else None
    if authorizer is not None:
        renderer.registry.register(AuthCollector(authorizer))
    apart = settings.probe_port is not None
    runner = web.AppRunner(make_app(renderer if settings.exporter else None, sources, authorizer, probes=not apart),
                           access_log=None)
    probe_runner = web.AppRunner(make_app(None, sources), access_log=None) if apart else None
    return Service(settings, connection, api, lease_api, sources, fleet, elector, reconciler, runner, probe_runner,
                   tls, cert_files)


def reconciler_of(settings: Settings, api: ApiClient, index: ClusterIndex, sources: Sources, fleet: Fleet | None,
                  elector: LeaderElector | None) -> tuple[Manager, ReconcilerCollector]:
    """The manager and its controllers, a line each, and their metrics."""
    writes = ReconcilerSettings(debounce=settings.write_debounce, pod_debounce=settings.pod_write_debounce,
                                writes_per_second=settings.writes_per_second)
    manager = Manager(api, sources, elector, writes)
    summaries = manager.add(SummaryController(api, index, sources, manager.writer, writes))
    statuses = SummarizerStatuses(index, sources.summarizers, sources.kind_problem)
    manager.add(SummarizerController(statuses, manager.writer, summaries.usable, writes.debounce,
                                     writes.summarizer_interval))
    # One recorder: its spam filter and correlation span every Event the service writes.
    recorder = EventRecorder(MANAGER, elector.settings.identity if elector else identity())
    claims = Claims(index.kueue, ClaimSettings(settle=settings.quota_settle, actuation=settings.quota_actuation == "on",
                                               max_writes_per_hour=settings.quota_max_writes_per_hour),
                    fleet=fleet, recorder=recorder, kueue_problem=sources.kueue_problem)
    manager.add(ClaimController(claims, manager.writer))
    manager.add(ClusterQueueController(claims, manager.writer))
    if settings.karpenter_events == "on":
        manager.add(DisruptionEventController(index, summaries.summary_of, recorder, manager.writer, writes.debounce))
    return manager, ReconcilerCollector(manager.writer.stats, [c.queue for c in manager.controllers],
                                        summaries.actual, claims.writes, elector)


def fleet_of(settings: Settings, api: ApiClient, sources: Sources, watch: WatchSettings) -> Fleet:
    """The hub's members: one per MultiKueueCluster, watched whenever Kueue serves them."""
    fleet = Fleet(api, sources.add_watch, sources.remove_watch, settings.fleet_namespace, settings.member_grace,
                  watch, listed=lambda: sources.optional_listed(MULTIKUEUE_CLUSTER))
    sources.add_optional_kind((*MULTIKUEUE_CLUSTER, None), MultiKueueCluster,  # at a version known (Sources)
                              Handler(fleet.upsert, fleet.delete))
    return fleet


async def start(service: Service, crashed: Callable[[asyncio.Task], None]) -> None:
    """Listen, then start the loops (``crashed`` is called when one of them fails) and the watches."""
    settings = service.settings
    await service.runner.setup()
    # Bound before anything talks to the API server: a taken port is then the one thing said.
    site = await listen(service.runner, settings.listen_address, settings.port, service.tls)
    probe_site = None
    if service.probe_runner is not None and settings.probe_port is not None:
        await service.probe_runner.setup()
        probe_site = await listen(service.probe_runner, settings.listen_address, settings.probe_port,
                                  flag="--probe-port")
    log.info("%s serving on %s (API server %s; exporter %s, reconciler %s)", build_info(), site.name,
             service.connection.host, "on" if settings.exporter else "off", "on" if settings.reconciler else "off")
    if probe_site is not None:
        log.info("probes (/healthz, /readyz) on %s", probe_site.name)
    if service.tls is not None:
        log.info("/metrics: HTTPS (%s), TokenReview + SubjectAccessReview, decisions cached %g s, "
                 "reviews of new tokens at most %g/s (burst %d)",
                 f"certificate from {settings.metrics_cert_file}" if service.cert_files else "self-signed certificate",
                 settings.metrics_auth_cache_ttl, settings.metrics_auth_reviews_per_second,
                 settings.metrics_auth_review_burst)
    loops: list[tuple[str, Awaitable[None]]] = []
    if service.cert_files is not None:
        loops.append(("certificate reload", service.cert_files.watch()))
    if service.elector is not None:
        loops.append(("leader election", service.elector.run()))
    if service.reconciler is not None:
        loops.append(("reconciler", service.reconciler.run()))
    # Once synced, the index's objects leave the garbage collector's full walks (gcfreeze.py).
    loops.append(("garbage collection", Freezer().run(service.sources.ready)))
    for name, loop in loops:
        task = asyncio.ensure_future(loop)
        task.set_name(name)
        task.add_done_callback(crashed)
        service.tasks.append(task)
    await service.sources.start()


async def stop(service: Service) -> None:
    """Each step bounded, in the order that loses nothing: the lease first (a stopped elector
    holds nothing to release), then the loops, the watches, the servers, the connections."""
    if service.elector is not None and service.tasks:
        await within(LEASE_RELEASE_SECONDS, "releasing the lease", service.elector.release())
    for task in service.tasks:
        task.cancel()
    names = ", ".join(task.get_name() for task in service.tasks)
    await within(STEP_SECONDS, f"stopping {names}", asyncio.gather(*service.tasks, return_exceptions=True))
    await within(STEP_SECONDS, "stopping the watches", service.sources.stop())
    if service.fleet is not None:
        await within(STEP_SECONDS, "closing the member clusters' connections", service.fleet.stop())
    await within(STEP_SECONDS, "stopping the HTTP server", service.runner.cleanup())
    if service.probe_runner is not None:
        await within(STEP_SECONDS, "stopping the probe server", service.probe_runner.cleanup())
    await within(STEP_SECONDS, "closing API connections",
                 asyncio.gather(service.api.close(), service.lease_api.close()))


async def serve(settings: Settings) -> None:
    """Build, start, run until SIGTERM/SIGINT (or a loop fails), stop."""
    service = build(settings)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)

    def crashed(task: asyncio.Task) -> None:  # a loop that dies must not go unnoticed: exit
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed: %r; exiting", task.get_name(), task.exception(), exc_info=task.exception())
            stopping.set()

    try:
        await start(service, crashed)
        await stopping.wait()
        log.info("shutting down")
    finally:
        await stop(service)


def run(main: Coroutine[Any, Any, None]) -> None:
    """The event loop the service runs in: asyncio's own. uvloop (0.23) mixes up file descriptors
    when a TLS handshake to the API server is reset, as in an API server restart: a Prometheus
    scrape then got the ClientHello meant for the API server, or no answer (CHANGELOG.md,
    tests/unit/test_event_loop.py)."""
    asyncio.run(main)


def main(argv: list[str] | None = None) -> int:
    try:
        settings = load(sys.argv[1:] if argv is None else argv)
    except InvalidSettings as err:
        for problem in err.problems:
            print(f"error: {problem}", file=sys.stderr)
        if isinstance(err, UsageError):  # one line pointing to the usage, not the usage itself
            print("See 'node-workload-summary --help' for usage.", file=sys.stderr)
        return 2
    if settings.version:
        print(build_info())
        return 0
    configure_logs(settings.log_level, settings.log_format)
    pin_mmap_threshold()
    size_tls_reads()
    try:
        run(serve(settings))
    except (ConfigError, StartupError, CertificateError) as err:  # one line saying what to fix
        log.error("%s", err)
        return 1
    except Exception as err:  # unexpected: a bug, whose traceback says where
        log.exception("%s: %s", type(err).__name__, err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
