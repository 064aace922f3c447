"""Sources (kubeindex/watch/sources.py) against a real kube-apiserver: kinds are needed exactly while
configured or referenced, a configured version is honoured, /readyz tells forbidden, not installed
and out of contact apart from an initial sync, and a label key configured later reads the pods again.

Each test failed against the code before the change (recorded in its docstring)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer

import kubeindex.watch.discovery as discovery
import kubeindex.watch.sources as sources_module
from demo.workloads import create, ok
from exporter.server import make_app
from kubeindex.client.api import load_connection
from kubeindex.model.index import ClusterIndex, label_workload_uid
from kubeindex.model.objects import API_VERSION
from kubeindex.model.resources import PODS, WORKLOAD_SUMMARIZERS
from kubeindex.watch.reflector import WatchSettings
from kubeindex.watch.sources import Sources
from localkube.cluster import LocalCluster
from tests.kube import RecordingApi, create_pod, delete, found, get_object, token_kubeconfig, until

pytestmark = pytest.mark.compat  # one of the core scenarios make compat runs on every Kubernetes minor

NS = "src"
FAST = WatchSettings(page_size=2, timeout_min=3, timeout_max=3, read_timeout=2)


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> LocalCluster:
    """The session's control plane with this module's namespace (its tests make the others they
    use, and delete the summarizers they make); its API server is restarted and frozen here."""
    ok(cluster.request("/api/v1/namespaces", "POST", {"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": NS}}))
    return cluster


def summarizer(kube: LocalCluster, name: str, types: list[dict]) -> None:
    """Create or replace a WorkloadSummarizer with ``types`` ({group, kind, version?})."""
    existing = get_object(kube, WORKLOAD_SUMMARIZERS.path(name=name))
    obj: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "WorkloadSummarizer", "metadata": {"name": name},
                           "spec": {"workloadTypes": types}}
    if existing is not None:
        obj["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        ok(kube.request(WORKLOAD_SUMMARIZERS.path(name=name), "PUT", obj))
    else:
        create(kube, WORKLOAD_SUMMARIZERS.path(), obj)


@asynccontextmanager
async def running(kube: LocalCluster, kubeconfig: Path | None = None, grace: float = 60.0,
                  settings: WatchSettings = FAST) -> AsyncIterator[tuple[Sources, RecordingApi]]:
    async with RecordingApi(load_connection(str(kubeconfig or kube.kubeconfig))) as api:
        sources = Sources(api, ClusterIndex(), settings, sync_grace=grace)
        await sources.start()
        try:
            yield sources, api
        finally:
            await sources.stop()


# -- kinds needed, versions -----------------------------------------------------------------------

def test_missing_kinds_hold_only_kinds_still_needed(kube: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a kind stayed in missing_kinds (nws_kind_not_served) and was looked up every 30 s
    for ever after the summarizer stopped listing it, or the last pod naming it was deleted."""
    monkeypatch.setattr(discovery, "DISCOVERY_RETRY_SECONDS", 0.3)
    summarizer(kube, "needed", [{"group": "apps", "kind": "Deployment"}, {"group": "example.com", "kind": "Gone"}])
    ghost = {"apiVersion": "ghost.example.com/v1", "kind": "Ghost", "metadata": {"name": "g",
                                                                                    "uid": "00000000-0000-4000-8000-1"}}
    create_pod(kube, NS, "ghost-child", "n-1", owner=ghost)

    def lookups(api: RecordingApi, group: str) -> int:
        return sum(1 for path, _ in api.gets if path.startswith(f"/apis/{group}"))

    async def run() -> None:
        async with running(kube) as (sources, api):
            await until(lambda: {("example.com", "Gone"), ("ghost.example.com", "Ghost")} <= sources.missing_kinds)
            await until(lambda: lookups(api, "example.com") >= 2, timeout=5)  # retried while needed
            summarizer(kube, "needed", [{"group": "apps", "kind": "Deployment"}])
            await until(lambda: ("example.com", "Gone") not in sources.missing_kinds, timeout=5)
            await asyncio.to_thread(delete, kube, PODS.path(NS, "ghost-child"))
            await until(lambda: ("ghost.example.com", "Ghost") not in sources.missing_kinds, timeout=5)
            await asyncio.sleep(0.5)  # a lookup in flight at that moment may still end
            before = lookups(api, "example.com"), lookups(api, "ghost.example.com")
            await asyncio.sleep(1.5)  # five retry periods
            assert (lookups(api, "example.com"), lookups(api, "ghost.example.com")) == before
            assert sources.kind_problem("apps", "Deployment", None) is None

    try:
        asyncio.run(run())
    finally:
        delete(kube, WORKLOAD_SUMMARIZERS.path(name="needed"))


def test_an_unserved_version_is_never_replaced(kube: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: batch/v2 Job was reported without its version, then the retry looked it up without
    the version and watched batch/v1 jobs in its place; Node (cluster-scoped) passed silently."""
    monkeypatch.setattr(discovery, "DISCOVERY_RETRY_SECONDS", 0.3)
    summarizer(kube, "v2", [{"group": "batch", "kind": "Job", "version": "v2"}, {"group": "", "kind": "Node"}])

    async def run() -> None:
        async with running(kube) as (sources, _):
            await until(lambda: sources.kind_problem("batch", "Job", "v2") is not None)
            await asyncio.sleep(1)  # several retry periods
            reason, message = found(sources.kind_problem("batch", "Job", "v2"))
            assert reason == "KindNotServed" and "job.batch/v2" in message, message
            assert ("batch", "Job") not in sources.owner_resources and "jobs.batch" not in sources.reflectors
            assert ("batch", "Job") in sources.missing_kinds
            await until(lambda: sources.kind_problem("", "Node", None) is not None)
            reason, message = found(sources.kind_problem("", "Node", None))
            assert reason == "KindNotNamespaced" and "cluster-scoped" in message, message
            # Another summarizer needs Jobs at a served version: watched, and v2 is still reported.
            summarizer(kube, "v1", [{"group": "batch", "kind": "Job"}])
            await until(lambda: ("batch", "Job") in sources.owner_resources)
            assert sources.owner_resources[("batch", "Job")].version == "v1"
            assert sources.kind_problem("batch", "Job", None) is None
            assert sources.kind_problem("batch", "Job", "v1") is None
            assert found(sources.kind_problem("batch", "Job", "v2"))[0] == "KindNotServed"

    try:
        asyncio.run(run())
    finally:
        for name in ("v1", "v2"):
            delete(kube, WORKLOAD_SUMMARIZERS.path(name=name))


# -- RBAC: forbidden --------------------------------------------------------------------------------

def limited_kubeconfig(kube: LocalCluster, name: str, resources: dict[str, list[str]]) -> Path:
    """A kubeconfig with the token of a ServiceAccount allowed to list/watch only ``resources``
    (apiGroup -> resources)."""
    rules = [{"apiGroups": [g], "resources": r, "verbs": ["list", "watch", "get"]} for g, r in resources.items()]
    rules.append({"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*"], "verbs": ["get"]})
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NS}]}]))
    return token_kubeconfig(kube, name, NS)


SUMMARIZERS = {"ux.sean.example.com": ["nodesummarizers", "workloadsummarizers"]}


def test_a_forbidden_owner_kind_is_reported_and_retried_quietly(kube: LocalCluster,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Before: there was no kind_problem/forbidden_kinds, and the 403 was logged three times and
    then never again (retried every few seconds for ever)."""
    config = limited_kubeconfig(kube, "no-jobs", {"": ["nodes", "pods"], **SUMMARIZERS})
    summarizer(kube, "jobs", [{"group": "batch", "kind": "Job"}])
    caplog.set_level(logging.INFO)

    async def run() -> None:
        async with running(kube, config) as (sources, api):
            await until(sources.ready.is_set)  # a forbidden owner kind does not hold readiness
            await until(lambda: ("batch", "Job") in sources.forbidden_kinds)
            reason, message = found(sources.kind_problem("batch", "Job", None))
            assert reason == "KindForbidden" and re.search('cannot (list|watch) resource "jobs"', message), message
            assert sources.sync_problems() == []
            async with TestClient(TestServer(make_app(None, sources))) as client:
                resp = await client.get("/readyz")
                text = await resp.text()
            print(text)
            assert resp.status == 200 and text.startswith("ok\njobs.batch: forbidden (jobs.batch is forbidden"), text
            await asyncio.sleep(3)
            attempts = sum(1 for path, _ in api.gets if path == "/apis/batch/v1/jobs")
            assert attempts >= 3, attempts  # retried with backoff ...

    try:
        asyncio.run(run())
    finally:
        delete(kube, WORKLOAD_SUMMARIZERS.path(name="jobs"))
    warnings = [r for r in caplog.records if r.name == "kubeindex.watch.reflector" and "jobs.batch" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # ... and said once


def test_readyz_names_a_forbidden_core_resource(kube: LocalCluster) -> None:
    """Before: /readyz said "initial sync in progress: pods" for ever."""
    config = limited_kubeconfig(kube, "no-pods", {"": ["nodes"], **SUMMARIZERS})

    async def run() -> tuple[int, str]:
        async with running(kube, config) as (sources, _):
            await until(lambda: sources.reflectors["pods"].contact.last_error_status == 403)
            async with TestClient(TestServer(make_app(None, sources))) as client:
                resp = await client.get("/readyz")
                return resp.status, await resp.text()

    status, text = asyncio.run(run())
    print(text)
    assert status == 503
    assert re.match('pods: forbidden \\(pods is forbidden: User "system:serviceaccount:src:no-pods" '
                    'cannot (list|watch) resource "pods"', text), text


def test_readyz_names_an_uninstalled_resource(kube: LocalCluster) -> None:
    """Before: "initial sync in progress: nodesummarizers, workloadsummarizers" for ever."""
    async def run() -> tuple[int, str]:
        async with RecordingApi(load_connection(str(kube.kubeconfig))) as api:
            sources = Sources(api, ClusterIndex(), FAST)
            ours = sources_module.NODE_SUMMARIZERS, sources_module.WORKLOAD_SUMMARIZERS
            try:  # the summarizers in a group no CRD serves
                sources_module.NODE_SUMMARIZERS, sources_module.WORKLOAD_SUMMARIZERS = (
                    dataclasses.replace(r, group="not-installed.example.com") for r in ours)
                await sources.start()
            finally:
                sources_module.NODE_SUMMARIZERS, sources_module.WORKLOAD_SUMMARIZERS = ours
            try:
                await until(lambda: sources.reflectors["nodesummarizers"].contact.last_error_status == 404)
                async with TestClient(TestServer(make_app(None, sources))) as client:
                    resp = await client.get("/readyz")
                    return resp.status, await resp.text()
            finally:
                await sources.stop()

    status, text = asyncio.run(run())
    print(text)
    assert status == 503 and "nodesummarizers: not installed (" in text and "workloadsummarizers: not installed" in text


# -- contact lost ---------------------------------------------------------------------------------

def test_sync_problems_when_the_api_server_is_hung_or_unreachable(kube: LocalCluster) -> None:
    """Before: after the initial sync /readyz answered 200 however long the API server was away.
    (The API server is stopped and started on this thread: its children die with the thread that
    started them.)"""
    apiserver = kube.processes["kube-apiserver"]
    events: list[tuple[str, float, list[str]]] = []

    async def run() -> None:
        # The server ends each watch after 3 s, so only a silent connection reaches the read timeout.
        settings = WatchSettings(timeout_min=3, timeout_max=3, read_timeout=4)
        async with running(kube, grace=1.0, settings=settings) as (sources, _):
            await until(sources.ready.is_set)
            await asyncio.sleep(5)  # idle watches, no event for seconds: still in sync
            assert sources.sync_problems() == []
            # Hung: the process is stopped; connections open, nothing answers.
            assert apiserver.popen is not None
            apiserver.popen.send_signal(signal.SIGSTOP)
            started = time.monotonic()
            try:
                await until(sources.sync_problems, timeout=15)
                events.append(("hung", time.monotonic() - started, sources.sync_problems()))
            finally:
                apiserver.popen.send_signal(signal.SIGCONT)
            await until(lambda: not sources.sync_problems(), timeout=30)
            # Unreachable: the process is gone; connections are refused.
            apiserver.stop(sig=signal.SIGKILL)
            started = time.monotonic()
            try:
                # The four core resources and the ClusterResourceClaims (an optional kind, served here).
                await until(lambda: len(sources.sync_problems()) == 5, timeout=10)
                events.append(("down", time.monotonic() - started, sources.sync_problems()))
                async with TestClient(TestServer(make_app(None, sources))) as client:
                    resp = await client.get("/readyz")
                    events.append(("readyz", resp.status, (await resp.text()).splitlines()))
            finally:
                apiserver.start()
                kube.wait_apiserver_ready()
            await until(lambda: not sources.sync_problems(), timeout=30)

    asyncio.run(run())
    for event in events:
        print(event)
    (_, took_hung, hung), (_, took_down, down), (_, status, lines) = events
    # Hung: the read timeout (4 s after a watch's last data) notices the silence, then the grace (1 s) runs.
    assert 1 < took_hung < 8 and all("no contact with the API server for" in p for p in hung), hung
    assert took_down < 5 and all("no contact with the API server for" in p for p in down), down
    assert status == 503 and any(line.startswith("pods: no contact with the API server") for line in lines), lines


# -- a pod label key configured later -------------------------------------------------------------

def test_a_label_key_configured_later_reads_the_pods_again(kube: LocalCluster) -> None:
    """The index keeps only the values of label keys configured when it took a pod: a summarizer
    that adds a key must make the pods be handed to it again, unchanged as they are."""
    ns = "label-later"
    kube.kubectl("create", "namespace", ns)
    for i in range(3):
        create_pod(kube, ns, f"g-{i}", "n-1", labels={"volcano.sh/job-name": "sim"})
    obj = {"apiVersion": API_VERSION, "kind": "WorkloadSummarizer", "metadata": {"name": "later"},
           "spec": {"podLabelWorkloads": [{"labelKey": "volcano.sh/job-name"}]}}

    async def run() -> tuple[dict[str, int], int]:
        async with running(kube) as (sources, _):
            await asyncio.wait_for(sources.ready.wait(), 20)
            pods = sources.reflectors["pods"]
            lists = pods.lists
            await asyncio.to_thread(create, kube, WORKLOAD_SUMMARIZERS.path(), obj)
            key = label_workload_uid("volcano.sh/job-name", ns, "sim")
            await until(lambda: key in sources.index.workloads)
            await until(lambda: sum(sources.index.workloads[key].pods.values()) == 3)
            return sources.index.workloads[key].pods, pods.lists - lists

    try:
        pods, lists = asyncio.run(run())
    finally:
        delete(kube, WORKLOAD_SUMMARIZERS.path(name="later"))
    assert pods == {"Running": 3} and lists == 1


def test_every_watch_but_the_nodes_gathers_events(kube: LocalCluster) -> None:
    """A node's event is read as it comes (NotReady is what alerts fire on); pods, owners and the
    custom resources gather theirs between reads (--watch-gather)."""
    async def run() -> dict[str, float]:
        async with running(kube, settings=dataclasses.replace(FAST, gather=0.05)) as (sources, _):
            await asyncio.wait_for(sources.ready.wait(), 20)
            return {name: r.settings.gather for name, r in sources.reflectors.items()}

    gathers = asyncio.run(run())
    assert gathers.pop("nodes") == 0.0
    assert "pods" in gathers and set(gathers.values()) == {0.05}, gathers
