"""Kueue flavors against a real control plane with the real Kueue CRDs: the flavor series follow
node pools growing, shrinking and relabelled, and ClusterQueue and ResourceFlavor edits, within
2 s; Kueue installed after the service started is picked up; absent Kueue is no error and no
readiness problem; forbidden Kueue kinds are reported without failing readiness. (Their alerts, over
two replicas in a real Prometheus: tests/cluster/test_alert_scenarios.py.)"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import prometheus_client
import pytest
import yaml

import kubeindex.watch.discovery as discovery
from demo.kueue import cell, cluster_queue, install_kueue, resource_flavor
from demo.workloads import node_summarizer
from exporter.metrics import Renderer
from kubeindex.client.api import ApiClient, load_connection
from kubeindex.model.index import ClusterIndex
from kubeindex.model.resources import CLUSTER_QUEUES, NODES, PODS, RESOURCE_FLAVORS
from kubeindex.watch.reflector import WatchSettings
from kubeindex.watch.sources import Sources
from localkube.cluster import LocalCluster, Options
from localkube.service import ScrapeFailed, Service, select, value, wait_for
from tests.kube import create_node, create_pod, delete, set_node_labels, set_node_status, token_kubeconfig
from tests.paths import CRDS

pytestmark = pytest.mark.kueue  # and in make test-kueue-matrix, on every Kueue cell

GPU = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "4"}
FOLLOW = 2.0  # seconds within which /metrics follows a change


def flavor_series(samples: dict, name: str, flavor: str) -> dict[str, float]:
    """The series of one flavor in one family, by their other label (resource or state)."""
    return {next(v for k, v in labels if k != "flavor"): val
            for labels, val in select(samples, name, flavor=flavor).items()}


# -- Kueue absent, then installed -------------------------------------------------------------------

def test_absent_kueue_is_fine_and_kueue_installed_later_is_picked_up(
        binaries: dict[str, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The real service starts without Kueue: ready, nothing about it logged above info, no flavor series,
    no kind reported missing. Kueue's CRDs come later: an in-process Sources (retrying every 0.3 s)
    and the real service (every DISCOVERY_RETRY_SECONDS) start watching them."""
    monkeypatch.setattr(discovery, "DISCOVERY_RETRY_SECONDS", 0.3)
    with LocalCluster(Options(), binaries) as kube:
        kube.install_crds(CRDS)
        node_summarizer(kube, "pool", "pool")
        create_node(kube, "gpu-1", {"pool": "gpu"}, allocatable=GPU)
        svc = Service(kube, ("--identity=a",)).start()
        try:
            assert svc.get("/readyz") == (200, "ok\n")
            samples = svc.scrape()
            assert not [k for k in samples if k[0].startswith(("nws_flavor_", "nws_kind_"))]
            noisy = [line for line in svc.log_text().splitlines()
                     if ("kueue" in line or "Kueue" in line) and (" WARNING " in line or " ERROR " in line)]
            assert noisy == [], noisy

            async def in_process() -> None:
                async with ApiClient(load_connection(str(kube.kubeconfig))) as api:
                    index = ClusterIndex()
                    sources = Sources(api, index, WatchSettings(timeout_min=5, timeout_max=5))
                    await sources.start()
                    try:
                        await asyncio.wait_for(sources.ready.wait(), 30)
                        assert sources.sync_problems() == [] and sources.missing_kinds == set()
                        await asyncio.sleep(1)  # a few retry periods: still quiet
                        assert not [r for r in caplog.records
                                    if r.levelno >= logging.WARNING and "kueue" in r.getMessage()], caplog.text
                        await asyncio.to_thread(install_kueue, kube)
                        await asyncio.to_thread(resource_flavor, kube, "gpu", {"pool": "gpu"})
                        await asyncio.to_thread(cluster_queue, kube, "team", {"gpu": {"nvidia.com/gpu": "4"}})
                        started = time.monotonic()
                        while not ("gpu" in index.kueue.flavors and index.kueue.flavors["gpu"].quota):
                            assert time.monotonic() - started < 10, "Kueue not picked up"
                            await asyncio.sleep(0.05)
                        text = Renderer(index, 10, registry=prometheus_client.CollectorRegistry()).render().decode()
                        assert 'nws_flavor_allocatable{flavor="gpu",resource="nvidia.com/gpu"} 4\n' in text
                        assert sources.sync_problems() == [] and sources.optional_problems() == []
                    finally:
                        await sources.stop()

            with caplog.at_level(logging.INFO, logger="kubeindex"):
                asyncio.run(in_process())
            # The real process looks again every DISCOVERY_RETRY_SECONDS (30 s).
            wait_for(lambda: value(svc.scrape(), "nws_flavor_nominal_quota", flavor="gpu",
                                   resource="nvidia.com/gpu") == 4, timeout=45, interval=0.5, retry=ScrapeFailed)
            assert svc.get("/readyz") == (200, "ok\n")
        finally:
            svc.stop()


# -- pools grow, shrink, are relabelled; quotas and flavors edited ------------------------------------

@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    """Kueue installed; pools gpu (gpu-1, gpu-2) and cpu (cpu-1); flavors gpu and cpu by pool;
    ClusterQueue team-a: 16 cpu and 8 GPUs of flavor gpu."""
    with LocalCluster(Options(), binaries) as c:
        c.install_crds(CRDS)
        install_kueue(c)
        node_summarizer(c, "pool", "pool")
        for name in ("gpu-1", "gpu-2"):
            create_node(c, name, {"pool": "gpu"}, allocatable=GPU)
        create_node(c, "cpu-1", {"pool": "cpu"})
        resource_flavor(c, "gpu", {"pool": "gpu"})
        resource_flavor(c, "cpu", {"pool": "cpu"})
        cluster_queue(c, "team-a", {"gpu": {"cpu": "16", "nvidia.com/gpu": "8"}})
        yield c


@pytest.fixture(scope="module")
def service(kube: LocalCluster) -> Iterator[Service]:
    svc = Service(kube, ("--identity=a",)).start()
    yield svc
    svc.stop()


def follows(svc: Service, family: str, flavor: str, want: dict[str, float]) -> None:
    """Within FOLLOW seconds the flavor's series of ``family`` are exactly ``want``."""
    try:
        wait_for(lambda: flavor_series(svc.scrape(), family, flavor) == want, timeout=FOLLOW, retry=ScrapeFailed)
    except AssertionError:
        raise AssertionError(f"{family}{{flavor={flavor}}}: {flavor_series(svc.scrape(), family, flavor)} "
                             f"!= {want}") from None


def states(**counts: int) -> dict[str, float]:
    return {s: counts.get(s, 0) for s in ("Ready", "NotReady", "Unknown", "Disrupting", "Cordoned", "Degraded")}


def test_flavor_series_follow_the_pools(kube: LocalCluster, service: Service) -> None:
    alloc = "nws_flavor_allocatable"
    follows(service, alloc, "gpu", {"cpu": 16, "memory": 64 * 2**30, "pods": 220, "nvidia.com/gpu": 8})
    follows(service, "nws_flavor_nodes_by_state", "gpu", states(Ready=2))
    follows(service, "nws_flavor_nominal_quota", "gpu", {"cpu": 16, "nvidia.com/gpu": 8})
    create_pod(kube, "default", "train-0", node="gpu-1", cpu="3")
    follows(service, "nws_flavor_requested", "gpu", {"cpu": 3, "nvidia.com/gpu": 0})
    # The pool grows: a node joins, NotReady at first.
    create_node(kube, "gpu-3", {"pool": "gpu"}, ready="False", allocatable=GPU)
    follows(service, "nws_flavor_nodes_by_state", "gpu", states(Ready=2, NotReady=1))
    follows(service, alloc, "gpu", {"cpu": 24, "memory": 96 * 2**30, "pods": 330, "nvidia.com/gpu": 12})
    set_node_status(kube, "gpu-3", "True")
    follows(service, "nws_flavor_nodes_by_state", "gpu", states(Ready=3))
    # It shrinks: a node goes, with its pod's requests.
    delete(kube, NODES.path(name="gpu-1"))
    follows(service, alloc, "gpu", {"cpu": 16, "memory": 64 * 2**30, "pods": 220, "nvidia.com/gpu": 8})
    follows(service, "nws_flavor_requested", "gpu", {"cpu": 0, "nvidia.com/gpu": 0})
    # A node is relabelled into the other pool: it leaves one flavor for the other.
    set_node_labels(kube, "gpu-2", {"pool": "cpu"})
    follows(service, "nws_flavor_nodes_by_state", "gpu", states(Ready=1))
    follows(service, "nws_flavor_nodes_by_state", "cpu", states(Ready=2))
    follows(service, alloc, "cpu", {"cpu": 16, "memory": 64 * 2**30, "pods": 220, "nvidia.com/gpu": 4})
    # Node groups are the pools, whatever the flavors: no group per flavor.
    groups = {dict(k)["group"]: v for k, v in select(service.scrape(), "nws_nodegroup_nodes").items()}
    assert groups == {"gpu": 1, "cpu": 2}
    delete(kube, PODS.path("default", "train-0"))


def test_cluster_queue_and_flavor_edits_change_the_series(kube: LocalCluster, service: Service) -> None:
    quota = "nws_flavor_nominal_quota"
    follows(service, quota, "gpu", {"cpu": 16, "nvidia.com/gpu": 8})
    cluster_queue(kube, "team-a", {"gpu": {"cpu": "16", "nvidia.com/gpu": "2"}})  # edited
    follows(service, quota, "gpu", {"cpu": 16, "nvidia.com/gpu": 2})
    cluster_queue(kube, "team-b", {"gpu": {"nvidia.com/gpu": "3"}, "spot": {"nvidia.com/gpu": "5"}})
    follows(service, quota, "gpu", {"cpu": 16, "nvidia.com/gpu": 5})  # summed over both queues
    follows(service, quota, "spot", {"nvidia.com/gpu": 5})  # named in a queue, no ResourceFlavor
    assert flavor_series(service.scrape(), "nws_flavor_allocatable", "spot") == {}
    resource_flavor(kube, "spot", {})  # no nodeLabels: every node, as Kueue
    nodes = len(kube.kubectl("get", "nodes", "-o", "name").stdout.split())
    follows(service, "nws_flavor_nodes_by_state", "spot", states(Ready=nodes))
    resource_flavor(kube, "spot", {"pool": "nowhere"})  # edited: re-matched, no node left
    follows(service, "nws_flavor_nodes_by_state", "spot", states())
    follows(service, "nws_flavor_allocatable", "spot", {"nvidia.com/gpu": 0})
    delete(kube, cell().at(CLUSTER_QUEUES).path(name="team-b"))
    follows(service, quota, "gpu", {"cpu": 16, "nvidia.com/gpu": 2})
    follows(service, quota, "spot", {})
    delete(kube, cell().at(RESOURCE_FLAVORS).path(name="spot"))
    follows(service, "nws_flavor_nodes_by_state", "spot", {})


def test_forbidden_kueue_is_reported_and_never_fails_readiness(kube: LocalCluster) -> None:
    """A ServiceAccount that may read nodes, pods and the summarizers, not Kueue's kinds."""
    name, ns = "no-kueue", "default"
    rules = [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list", "watch"]},
             {"apiGroups": ["ux.sean.example.com"], "resources": ["nodesummarizers", "workloadsummarizers"],
              "verbs": ["list", "watch"]}]
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]}]))
    config = token_kubeconfig(kube, name, ns)
    svc = Service(kube, (f"--kubeconfig={config}", "--no-reconciler")).start()
    try:
        code, text = svc.get("/readyz")
        lines = text.splitlines()
        assert code == 200 and lines[0] == "ok", text
        for plural in ("resourceflavors", "clusterqueues"):
            assert any(line.startswith(f"{plural}.kueue.x-k8s.io: forbidden") and
                       line.endswith("(optional kind: not counted against readiness)") for line in lines), text
        samples = svc.scrape()
        assert {dict(k)["kind"] for k in select(samples, "nws_kind_forbidden", group="kueue.x-k8s.io")} == {
            "ResourceFlavor", "ClusterQueue"}
        assert value(samples, "nws_nodegroup_nodes", summarizer="pool", group="cpu") is not None
    finally:
        svc.stop()
