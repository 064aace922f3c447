"""The exporter process against a real kube-apiserver: exact values, latency, recovery."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from prometheus_client import CollectorRegistry

import exporter.metrics as metrics
from demo.workloads import create, node_summarizer, ok, workload_summarizer
from exporter.metrics import Renderer
from kubeindex.model.index import NODE_STATES, PHASES, ClusterIndex
from kubeindex.model.objects import Taint
from kubeindex.model.resources import NODE_SUMMARIZERS, NODES, PODS
from kubeindex.watch.metrics import SourcesCollector
from kubeindex.watch.reflector import SourceStats
from localkube.cluster import LocalCluster, Options
from localkube.service import ScrapeFailed, Service, parse, select, value, wait_for
from reconciler.metrics import ReconcilerCollector
from reconciler.workqueue import WorkQueue
from tests.builders import add_owner, configured, make_node, make_pod, ref
from tests.kube import create_node, create_pod, delete, set_node_labels, set_node_status
from tests.paths import CRDS
from tests.reference import Owner

pytestmark = pytest.mark.compat  # one of the core scenarios make compat runs on every Kubernetes minor

A = TypeVar("A")  # the aggregate of a family table's rows
NS = "exp"
POOL = "example.com/pool"


def TEMPLATE(app: str) -> dict:
    return {"metadata": {"labels": {"app": app}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    """A control plane of this module's own: the exporter sees every object in it."""
    with LocalCluster(Options(), binaries) as c:
        c.install_crds(CRDS)
        yield c


@pytest.fixture(scope="module")
def world(kube: LocalCluster) -> dict:
    """Three node groups; a Deployment (via a ReplicaSet), a StatefulSet and a Job with pods."""
    ok(kube.request("/api/v1/namespaces", "POST", {"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": NS}}))
    node_summarizer(kube, "pool", POOL)
    workload_summarizer(kube, "apps", [("apps", "Deployment"), ("apps", "StatefulSet"), ("batch", "Job")])
    gpu = {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "8"}
    create_node(kube, "cpu-1", {POOL: "cpu"})
    create_node(kube, "cpu-2", {POOL: "cpu"})
    create_node(kube, "gpu-1", {POOL: "gpu"}, allocatable=gpu)
    create_node(kube, "gpu-2", {POOL: "gpu"}, allocatable=gpu, unschedulable=True)
    create_node(kube, "tpu-1", {POOL: "tpu"}, allocatable={"cpu": "8", "google.com/tpu": "4"})
    deploy = create(kube, f"/apis/apps/v1/namespaces/{NS}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}},
                 "template": TEMPLATE("web")}})
    rs = create(kube, f"/apis/apps/v1/namespaces/{NS}/replicasets", {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web-1", "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                                           "name": "web", "uid": deploy["metadata"]["uid"],
                                                           "controller": True}]},
        "spec": {"selector": {"matchLabels": {"app": "web"}},
                 "template": TEMPLATE("web")}})
    sts = create(kube, f"/apis/apps/v1/namespaces/{NS}/statefulsets", {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
        "spec": {"selector": {"matchLabels": {"app": "db"}}, "serviceName": "db",
                 "template": TEMPLATE("db")}})
    job = create(kube, f"/apis/batch/v1/namespaces/{NS}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}})
    for i, node in enumerate(["cpu-1", "cpu-1", "cpu-2"]):
        create_pod(kube, NS, f"web-1-{i}", node, owner=rs)
    for i, node in enumerate(["gpu-1", "gpu-2"]):
        create_pod(kube, NS, f"db-{i}", node, owner=sts, cpu="2")
    create_pod(kube, NS, "train-a", "tpu-1", owner=job, cpu="1")
    create_pod(kube, NS, "train-b", "tpu-1", owner=job, phase="Succeeded", cpu="1")
    create_pod(kube, NS, "pending", "", owner=job, phase="Pending")  # not scheduled: in the workload, in no group
    create_pod(kube, NS, "bare", "cpu-2", cpu="250m")  # no owner: no workload
    return {"deploy": deploy, "rs": rs, "sts": sts, "job": job}


@pytest.fixture(scope="module")
def exporter(kube: LocalCluster, world: dict) -> Iterator[Service]:
    exp = Service(kube).start()
    yield exp
    exp.stop()


def group_value(samples: dict, name: str, group: str, **labels: str) -> float | None:
    return value(samples, name, summarizer="pool", group=group, **labels)


def workload_value(samples: dict, workload: str, kind: str, phase: str) -> float | None:
    return value(samples, "nws_workload_pods", namespace=NS, workload=workload, kind=kind, phase=phase)


def test_exact_values(exporter: Service) -> None:
    s = exporter.scrape()
    assert group_value(s, "nws_nodegroup_nodes", "cpu") == 2
    assert group_value(s, "nws_nodegroup_nodes", "gpu") == 2
    assert group_value(s, "nws_nodegroup_nodes", "tpu") == 1
    assert group_value(s, "nws_nodegroup_nodes_by_condition", "gpu", condition="Ready") == 2
    assert group_value(s, "nws_nodegroup_nodes_unschedulable", "gpu") == 1
    assert group_value(s, "nws_nodegroup_allocatable", "gpu", resource="nvidia.com/gpu") == 16
    assert group_value(s, "nws_nodegroup_allocatable", "gpu", resource="memory") == 128 * 2**30
    assert group_value(s, "nws_nodegroup_allocatable", "tpu", resource="google.com/tpu") == 4
    assert group_value(s, "nws_nodegroup_pods", "cpu", phase="Running") == 4  # 3 web + bare
    assert group_value(s, "nws_nodegroup_pods", "tpu", phase="Succeeded") == 1
    assert group_value(s, "nws_nodegroup_requested", "cpu", resource="cpu") == 1.75  # 3 x 500m + 250m
    assert group_value(s, "nws_nodegroup_requested", "tpu", resource="cpu") == 1  # the Succeeded pod frees its 1
    assert workload_value(s, "web", "Deployment", "Running") == 3
    assert workload_value(s, "db", "StatefulSet", "Running") == 2
    assert workload_value(s, "train", "Job", "Running") == 1
    assert workload_value(s, "train", "Job", "Succeeded") == 1
    assert workload_value(s, "train", "Job", "Pending") == 1
    assert value(s, "nws_workload_nodes", namespace=NS, workload="web", kind="Deployment",
                 summarizer="pool", group="cpu") == 2  # DISTINCT nodes: cpu-1 (twice) and cpu-2
    assert value(s, "nws_workload_nodes", namespace=NS, workload="db", kind="StatefulSet",
                 summarizer="pool", group="gpu") == 2
    assert value(s, "nws_pods_without_workload", reason="no_workload_type") == 1  # the bare pod
    assert not select(s, "nws_workload_pods", workload="web-1")  # the ReplicaSet is no root
    assert value(s, "nws_watch_synced", resource="replicasets.apps") == 1
    assert value(s, "nws_initial_sync_duration_seconds") is not None


def test_not_ready_node_changes_gauges_within_2s(kube: LocalCluster, exporter: Service) -> None:
    set_node_status(kube, "gpu-1", "False")
    took = wait_for(lambda: group_value(exporter.scrape(), "nws_nodegroup_nodes_by_condition", "gpu",
                                        condition="NotReady") == 1, timeout=2, retry=ScrapeFailed)
    s = exporter.scrape()
    assert group_value(s, "nws_nodegroup_nodes_by_condition", "gpu", condition="Ready") == 1
    print(f"NotReady visible on /metrics after {took * 1000:.0f} ms")
    set_node_status(kube, "gpu-1", "Unknown")
    wait_for(lambda: group_value(exporter.scrape(), "nws_nodegroup_nodes_by_condition", "gpu",
                                 condition="Unknown") == 1, timeout=2, retry=ScrapeFailed)
    set_node_status(kube, "gpu-1", "True")
    wait_for(lambda: group_value(exporter.scrape(), "nws_nodegroup_nodes_by_condition", "gpu",
                                 condition="Ready") == 2, timeout=2, retry=ScrapeFailed)


def test_node_label_change_moves_node_and_pods(kube: LocalCluster, exporter: Service) -> None:
    set_node_labels(kube, "cpu-2", {POOL: "tpu"})
    wait_for(lambda: group_value(exporter.scrape(), "nws_nodegroup_nodes", "tpu") == 2, timeout=5, retry=ScrapeFailed)
    s = exporter.scrape()
    assert group_value(s, "nws_nodegroup_nodes", "cpu") == 1
    assert group_value(s, "nws_nodegroup_pods", "cpu", phase="Running") == 2  # web-1-0, web-1-1
    assert value(s, "nws_workload_nodes", namespace=NS, workload="web", kind="Deployment",
                 summarizer="pool", group="tpu") == 1
    set_node_labels(kube, "cpu-2", {POOL: "cpu"})
    wait_for(lambda: group_value(exporter.scrape(), "nws_nodegroup_nodes", "cpu") == 2, timeout=5, retry=ScrapeFailed)


def test_deleted_pods_series_disappear(kube: LocalCluster, exporter: Service, world: dict) -> None:
    for name in ("train-a", "train-b", "pending"):
        delete(kube, PODS.path(NS, name))
    delete(kube, f"/apis/batch/v1/namespaces/{NS}/jobs/train")
    # The pods and the Job come on watches of their own, in either order: the Job's deletion may be
    # seen first (its pods then have no workload for a moment), so wait for both.
    wait_for(lambda: not select(exporter.scrape(), "nws_workload_pods", workload="train")
             and group_value(exporter.scrape(), "nws_nodegroup_pods", "tpu", phase="Running") == 0, timeout=5,
             retry=ScrapeFailed)
    s = exporter.scrape()
    assert group_value(s, "nws_nodegroup_requested", "tpu", resource="cpu") is None
    assert not select(s, "nws_workload_nodes", workload="train")


def test_summarizer_changes_rebuild_groups(kube: LocalCluster, exporter: Service) -> None:
    node_summarizer(kube, "hostnames", "kubernetes.io/hostname")
    set_node_labels(kube, "tpu-1", {"kubernetes.io/hostname": "tpu-1"})
    wait_for(lambda: value(exporter.scrape(), "nws_nodegroup_nodes", summarizer="hostnames", group="tpu-1") == 1,
             retry=ScrapeFailed)
    delete(kube, NODE_SUMMARIZERS.path(name="hostnames"))
    wait_for(lambda: not select(exporter.scrape(), "nws_nodegroup_nodes", summarizer="hostnames"), retry=ScrapeFailed)
    assert group_value(exporter.scrape(), "nws_nodegroup_nodes", "tpu") == 1  # the other summarizer is untouched


def test_openmetrics_and_health(exporter: Service) -> None:
    code, text = exporter.get("/metrics", accept="application/openmetrics-text; version=1.0.0")
    assert code == 200 and text.rstrip().endswith("# EOF")
    assert "# TYPE nws_watch_events counter" in text and "nws_watch_events_total{" in text
    code, text = exporter.get("/metrics")
    assert "# TYPE nws_watch_events_total counter" in text and "# EOF" not in text
    assert exporter.get("/healthz") == (200, "ok\n")
    assert exporter.get("/readyz") == (200, "ok\n")


def _truth(samples: dict) -> dict:
    """The series that describe the cluster (not the exporter's own history)."""
    return {k: v for k, v in samples.items() if k[0].startswith(("nws_nodegroup", "nws_workload_pods",
                                                                 "nws_workload_nodes", "nws_pods_without"))}


def test_recovers_from_410_and_apiserver_restart(kube: LocalCluster, exporter: Service, world: dict) -> None:
    """The exporter's watches break (apiserver restart) while it is frozen, the cluster changes,
    then every resourceVersion it holds expires (etcd compaction + restart): it must get 410,
    relist, emit deletes for what vanished, and match the truth."""
    before = exporter.scrape()
    exporter.pause()
    try:
        kube.restart_apiserver()  # its connections are gone: it will see none of what follows
        delete(kube, PODS.path(NS, "db-1"))
        delete(kube, NODES.path(name="gpu-2"))
        create_node(kube, "cpu-3", {POOL: "cpu"})
        create_pod(kube, NS, "web-1-9", "cpu-3", owner=world["rs"])
        set_node_status(kube, "tpu-1", "False")
        kube.expire_resource_versions()
    finally:
        exporter.resume()
    # Equal to a fresh recomputation (a new exporter's view), series for series, within 10 s.
    fresh = Service(kube).start()
    try:
        took = wait_for(lambda: _truth(exporter.scrape()) == _truth(fresh.scrape()), timeout=10, retry=ScrapeFailed)
        fresh_view = fresh.scrape()
    except AssertionError:
        raise AssertionError(exporter.log_text()) from None
    finally:
        fresh.stop()
    print(f"recovered in {took:.1f}s after the freeze")
    # The summaries too: one per group, no duplicates, equal to the fresh view.
    truth = _truth(fresh_view)

    def summaries_match() -> bool:
        items = json.loads(kube.kubectl("get", "nodesummaries", "-o", "json").stdout)["items"]
        counts = {i["metadata"]["name"]: i.get("status", {}).get("nodeCount") for i in items
                  if i["metadata"]["labels"].get("ux.sean.example.com/summarizer") == "pool"}
        groups = {dict(k[1])["group"]: v for k, v in truth.items()
                  if k[0] == "nws_nodegroup_nodes" and dict(k[1])["summarizer"] == "pool"}
        return counts == {f"pool-{g}": n for g, n in groups.items()}

    wait_for(summaries_match, timeout=10)
    s = exporter.scrape()
    assert group_value(s, "nws_nodegroup_nodes", "cpu") == 3
    assert group_value(s, "nws_nodegroup_nodes", "gpu") == 1
    assert group_value(s, "nws_nodegroup_nodes_unschedulable", "gpu") == 0  # gpu-2 is gone
    assert group_value(s, "nws_nodegroup_nodes_by_condition", "tpu", condition="NotReady") == 1
    assert workload_value(s, "web", "Deployment", "Running") == 4
    assert workload_value(s, "db", "StatefulSet", "Running") == 1
    relists = value(s, "nws_watch_relists_total", resource="pods") or 0
    assert relists > (value(before, "nws_watch_relists_total", resource="pods") or 0), exporter.log_text()
    assert value(s, "nws_watch_restarts_total", resource="pods", reason="gone") is not None
    # A plain apiserver restart (watches break, resourceVersions stay valid) is survived too.
    kube.restart_apiserver()
    set_node_status(kube, "tpu-1", "True")
    wait_for(lambda: group_value(exporter.scrape(), "nws_nodegroup_nodes_by_condition", "tpu",
                                 condition="Ready") == 1, timeout=30, retry=ScrapeFailed)


def test_every_scrape_is_answered_through_apiserver_restarts(kube: LocalCluster, exporter: Service) -> None:
    """The convergence polls above retry a failed scrape, as Prometheus would; this is the claim
    they no longer make: while its watches break and reconnect, the service answers every request."""
    answers: Counter[int] = Counter()
    failures: list[str] = []
    done = threading.Event()

    def scrape_until_done() -> None:
        while not done.is_set():
            code, text = exporter.get("/metrics")
            answers[code] += 1
            if code != 200:
                failures.append(f"{code}: {text[:200]}")

    scrapers = [threading.Thread(target=scrape_until_done) for _ in range(2)]
    for t in scrapers:
        t.start()
    try:
        for _ in range(2):
            kube.restart_apiserver()
            time.sleep(0.5)  # the watches reconnect while the scrapes go on
    finally:
        done.set()
        for t in scrapers:
            t.join()
    assert not failures, (dict(answers), failures[:5])
    assert answers[200] > 100, dict(answers)  # the scrapers really ran through the restarts
    print(f"{answers[200]} scrapes through 2 API server restarts, every one answered")


def test_workload_series_cap(kube: LocalCluster, exporter: Service) -> None:
    capped = Service(kube, ("--max-workload-series=1",)).start()
    try:
        s, full = capped.scrape(), exporter.scrape()
        own = {dict(lbl)["workload"] for lbl in select(s, "nws_workload_pods")}
        assert len(own - {"other"}) == 1 and "other" in own  # web and db: one keeps its series
        assert value(s, "nws_workload_series_overflow") == 1
        assert value(s, "nws_workload_series_dropped_total") == 1
        assert value(s, "nws_workload_series_limit") == 1
        # Nothing is lost: the capped series add up to the uncapped ones.
        assert sum(select(s, "nws_workload_pods", phase="Running").values()) == sum(
            select(full, "nws_workload_pods", phase="Running").values())
    finally:
        capped.stop()


# -- unit level: the renderer over an index fed directly (no cluster) ------------------------------

HOST = "kubernetes.io/hostname"


def _render(renderer: Renderer) -> dict:
    return parse(renderer.render().decode())


def _series_per_family(samples: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, _ in samples:
        counts[name] = counts.get(name, 0) + 1
    return counts


def _hostname_cluster(nodes: int, deployments: int) -> ClusterIndex:
    """A hostname summarizer (one group per node) beside a pool summarizer, a DaemonSet on every
    node, many Deployments, a GPU pool, pods without workload and below a broken chain."""
    index = ClusterIndex()
    index.set_node_summarizer("host", HOST)
    index.set_node_summarizer("pool", "pool")
    index.set_workload_summarizer("w", configured(("apps", "DaemonSet"), ("apps", "Deployment"),
                                                  ("apps", "StatefulSet")))
    add_owner(index, Owner("ds", "apps", "DaemonSet", "ns", "agent", None))
    for i in range(nodes):
        alloc = {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "7" if i % 9 == 0 else "8"} if i % 3 == 0 else None
        capacity = {**alloc, "nvidia.com/gpu": "8"} if alloc else None
        index.upsert_node(make_node(f"n{i}", {HOST: f"n{i}", "pool": f"p{i % 3}"}, allocatable=alloc,
                                    capacity=capacity, ready="False" if i % 7 == 0 else "True",
                                    unschedulable=i % 11 == 0))
        index.upsert_pod(make_pod(f"agent-{i}", f"ds-{i}", node=f"n{i}", owner=ref(("apps", "DaemonSet", "ds"))))
    for d in range(deployments):
        add_owner(index, Owner(f"d{d}", "apps", "Deployment", "ns", f"web{d}", None))
        for r in range(3):
            index.upsert_pod(make_pod(f"web{d}-{r}", f"w{d}-{r}", node=f"n{(d * 7 + r) % nodes}",
                                      owner=ref(("apps", "Deployment", f"d{d}")), phase=PHASES[r % 5]))
    add_owner(index, Owner("sts", "apps", "StatefulSet", "ns", "lab", "notebook-forbidden"))
    index.upsert_pod(make_pod("lab-0", "lab-0", node="n1", owner=ref(("apps", "StatefulSet", "sts"))))
    index.upsert_pod(make_pod("bare", "bare", node="n2"))
    return index


def test_every_family_stays_under_its_bound_with_a_hostname_summarizer() -> None:
    nodes, deployments, g_cap, w_cap = 1500, 60, 400, 25
    index = _hostname_cluster(nodes, deployments)
    renderer = Renderer(index, w_cap, g_cap, registry=CollectorRegistry())
    s = _render(renderer)
    counts = _series_per_family(s)
    # The symbols of docs/metrics.md.
    n_s = {"host": nodes, "pool": 3}
    g_s = {k: min(n, g_cap) + (n > g_cap) for k, n in n_s.items()}
    groups = sum(g_s.values())
    resources = 4  # cpu, memory, pods, nvidia.com/gpu
    w = min(len(index.workloads), w_cap) + (len(index.workloads) > w_cap)
    bounds = {
        "nws_nodegroup_nodes": groups, "nws_nodegroup_nodes_by_condition": 3 * groups,
        "nws_nodegroup_nodes_unschedulable": groups, "nws_nodegroup_allocatable": resources * groups,
        "nws_nodegroup_capacity": resources * groups, "nws_nodegroup_pods": 5 * groups,
        "nws_nodegroup_requested": resources * groups, "nws_workload_pods": 5 * w,
        "nws_workload_nodes": min(len(index.workloads), w_cap) * groups,
        "nws_nodegroup_nodes_by_state": 6 * groups, "nws_nodegroup_accelerators_unhealthy": 1 * groups,
        "nws_workload_pods_by_node_state": 5 * w, "nws_workload_nodes_unhealthy": min(len(index.workloads), w_cap),
        "nws_nodegroups": 2, "nws_nodegroup_series_limit": 1, "nws_nodegroup_series_overflow": 2,
        "nws_nodegroup_series_dropped_total": 2, "nws_workloads": 1, "nws_workload_series_limit": 1,
        "nws_workload_series_overflow": 1, "nws_workload_series_dropped_total": 1, "nws_pods_without_workload": 4,
        "nws_pods_owner_chain_broken": 1, "nws_scrape_render_seconds": 1, "nws_build_info": 1,
    }
    assert set(counts) == set(bounds)  # the renderer's own families: every one has a bound here
    for name, n in counts.items():
        assert n <= bounds[name], (name, n, bounds[name])
    assert counts["nws_nodegroup_nodes"] == g_cap + 1 + 3  # host: 400 + other; pool: 3
    # Nothing is lost: "other" holds the rest, the DaemonSet's nodes add up.
    assert value(s, "nws_nodegroup_nodes", summarizer="host", group="other") == nodes - g_cap
    assert sum(select(s, "nws_nodegroup_nodes", summarizer="host").values()) == nodes
    assert sum(select(s, "nws_nodegroup_allocatable", summarizer="host", resource="cpu").values()) == 8 * 500 + 4 * 1000
    assert value(s, "nws_nodegroup_series_overflow", summarizer="host") == nodes - g_cap
    assert value(s, "nws_nodegroup_series_overflow", summarizer="pool") == 0
    assert value(s, "nws_nodegroup_series_dropped_total", summarizer="host") == nodes - g_cap
    agent = select(s, "nws_workload_nodes", workload="agent", summarizer="host")
    assert len(agent) == g_cap + 1 and sum(agent.values()) == nodes
    assert value(s, "nws_workload_nodes", namespace="ns", workload="agent", kind="DaemonSet",
                 summarizer="host", group="other") == nodes - g_cap
    assert sum(select(s, "nws_workload_nodes", workload="agent", summarizer="pool").values()) == nodes
    assert value(s, "nws_pods_without_workload", reason="no_workload_type") == 1
    assert value(s, "nws_pods_without_workload", reason="cycle") == 0  # present at 0
    assert value(s, "nws_pods_owner_chain_broken", reason="missing_owner") == 1
    assert value(s, "nws_workload_series_overflow") == len(index.workloads) - w_cap
    assert sum(select(s, "nws_workload_pods").values()) == nodes + 3 * deployments + 1  # all but "bare"
    # Node states: every node in one state; the overflowing workloads' pods in "other".
    assert sum(select(s, "nws_nodegroup_nodes_by_state", summarizer="host").values()) == nodes
    not_ready = len(range(0, nodes, 7))
    assert sum(select(s, "nws_nodegroup_nodes_by_state", summarizer="pool", state="NotReady").values()) == not_ready
    assert sum(select(s, "nws_nodegroup_accelerators_unhealthy", summarizer="pool").values()) == len(range(0, nodes, 9))
    assert sum(select(s, "nws_workload_pods_by_node_state").values()) == sum(
        sum(w.pods_by_node_state.values()) for w in index.workloads.values())
    assert value(s, "nws_workload_nodes_unhealthy", namespace="ns", workload="agent", kind="DaemonSet") == sum(
        select(s, "nws_nodegroup_nodes_by_state", summarizer="pool").values()) - sum(
        select(s, "nws_nodegroup_nodes_by_state", summarizer="pool", state="Ready").values())
    assert not select(s, "nws_workload_nodes_unhealthy", workload="other")


def test_node_groups_keep_their_slot_and_free_slots_are_taken() -> None:
    index = ClusterIndex()
    index.set_node_summarizer("host", HOST)
    for i in range(3):
        index.upsert_node(make_node(f"n{i}", {HOST: f"n{i}"}))
    renderer = Renderer(index, 10, 2, registry=CollectorRegistry())
    s = _render(renderer)
    own = {dict(k)["group"] for k in select(s, "nws_nodegroup_nodes")}
    assert own == {"n0", "n1", "other"}
    index.upsert_node(make_node("n3", {HOST: "n3"}))  # a new group: no slot free
    s = _render(renderer)
    assert {dict(k)["group"] for k in select(s, "nws_nodegroup_nodes")} == own
    assert value(s, "nws_nodegroup_nodes", summarizer="host", group="other") == 2
    assert value(s, "nws_nodegroup_series_dropped_total", summarizer="host") == 2
    index.delete_node("n0")  # its slot goes to a waiting group
    s = _render(renderer)
    groups = {dict(k)["group"] for k in select(s, "nws_nodegroup_nodes")}
    assert "n1" in groups and "other" in groups and len(groups) == 3
    assert value(s, "nws_nodegroup_nodes", summarizer="host", group="other") == 1
    index.delete_node("n3")
    index.delete_node("n2")
    s = _render(renderer)
    assert {dict(k)["group"] for k in select(s, "nws_nodegroup_nodes")} == {"n1"}  # no other left


def test_scrape_formats_only_what_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    index = _hostname_cluster(50, 10)
    renderer = Renderer(index, 100, 100, registry=CollectorRegistry())
    renderer.render()
    calls: list[str] = []
    real = metrics.chunks

    def recording(table: tuple[metrics.FamilyGenerator[A], ...], base: str, agg: A) -> tuple[str, ...]:
        calls.append(base)
        return real(table, base, agg)

    monkeypatch.setattr(metrics, "chunks", recording)
    renderer.render()
    assert calls == []
    index.upsert_pod(make_pod("agent-3", "ds-3", node="n3", owner=ref(("apps", "DaemonSet", "ds")), phase="Failed"))
    renderer.render()
    assert sorted(calls) == sorted([
        'summarizer="host",group="n3"', 'summarizer="pool",group="p0"',
        'namespace="ns",workload="agent",kind="DaemonSet"'])


def test_node_states_exact_values_other_series_and_no_stale_series() -> None:
    """A gpu pool of four nodes in four states, a cordoned cpu node; workloads with pods there; a
    cap of one node group and of two workloads. Every value, and back to Ready: nothing left."""
    index = ClusterIndex()
    index.set_node_summarizer("pool", "pool")
    index.set_workload_summarizer("w", configured(("apps", "Deployment")))
    gpu = {"cpu": "8", "nvidia.com/gpu": "8"}
    healthy: dict[str, dict[str, Any]] = {"g0": {}, "g1": {}, "g2": {}, "g3": {}, "c0": {}}
    sick: dict[str, dict[str, Any]] = {
        "g0": {"ready": "False"}, "g1": {"taints": [Taint("karpenter.sh/disrupted", "NoSchedule")]},
        "g2": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "5"}, "capacity": gpu},
        "g3": {"conditions": {"KernelDeadlock": "True"}}, "c0": {"unschedulable": True}}

    def nodes(states: dict[str, dict[str, Any]]) -> None:
        for name, extra in states.items():
            pool = "cpu" if name.startswith("c") else "gpu"
            index.upsert_node(make_node(name, {"pool": pool}, **{"allocatable": gpu, **extra}))

    nodes(healthy)
    for d, placement in {"train": ["g0", "g0", "g1", "g2", "g3"], "web": ["c0", "c0"], "idle": ["g3"]}.items():
        add_owner(index, Owner(d, "apps", "Deployment", "ns", d, None))
        for i, node in enumerate(placement):
            index.upsert_pod(make_pod(f"{d}-{i}", f"{d}-{i}", node=node, owner=ref(("apps", "Deployment", d))))
    renderer = Renderer(index, 10, registry=CollectorRegistry())
    s = _render(renderer)
    assert select(s, "nws_nodegroup_nodes_by_state", group="gpu") == {
        frozenset({("summarizer", "pool"), ("group", "gpu"), ("state", st)}): 4 if st == "Ready" else 0
        for st in NODE_STATES}
    assert not select(s, "nws_nodegroup_accelerators_unhealthy") and not select(s, "nws_workload_pods_by_node_state")
    assert not select(s, "nws_workload_nodes_unhealthy")  # only while non-zero

    nodes(sick)
    s = _render(renderer)
    by_state = {dict(k)["state"]: v for k, v in select(s, "nws_nodegroup_nodes_by_state", group="gpu").items()}
    assert by_state == {"Ready": 0, "NotReady": 1, "Unknown": 0, "Disrupting": 1, "Cordoned": 0, "Degraded": 2}
    assert value(s, "nws_nodegroup_nodes_by_state", summarizer="pool", group="cpu", state="Cordoned") == 1
    assert select(s, "nws_nodegroup_accelerators_unhealthy") == {
        frozenset({("summarizer", "pool"), ("group", "gpu"), ("resource", "nvidia.com/gpu")}): 3}
    train = {"namespace": "ns", "workload": "train", "kind": "Deployment"}
    assert {dict(k)["state"]: v for k, v in select(s, "nws_workload_pods_by_node_state", workload="train").items()} == {
        "NotReady": 2, "Disrupting": 1, "Degraded": 2}
    assert value(s, "nws_workload_nodes_unhealthy", **train) == 4
    assert value(s, "nws_workload_pods_by_node_state", namespace="ns", workload="web", kind="Deployment",
                 state="Cordoned") == 2
    assert value(s, "nws_workload_nodes_unhealthy", namespace="ns", workload="idle", kind="Deployment") == 1

    # Capped: the overflowing node group's states and the overflowing workload's pods are summed.
    capped = _render(Renderer(index, 1, 1, registry=CollectorRegistry()))
    assert sum(select(capped, "nws_nodegroup_nodes_by_state", summarizer="pool", state="Cordoned").values()) == 1
    assert sum(select(capped, "nws_nodegroup_nodes_by_state", summarizer="pool").values()) == 5
    assert sum(select(capped, "nws_workload_pods_by_node_state").values()) == 5 + 2 + 1
    assert select(capped, "nws_workload_pods_by_node_state", workload="other")
    assert not select(capped, "nws_workload_nodes_unhealthy", workload="other")

    nodes(healthy)
    s = _render(renderer)
    assert not select(s, "nws_workload_pods_by_node_state") and not select(s, "nws_nodegroup_accelerators_unhealthy")
    assert not select(s, "nws_workload_nodes_unhealthy")  # no stale series
    assert value(s, "nws_nodegroup_nodes_by_state", summarizer="pool", group="gpu", state="Ready") == 4


def test_every_unresolved_reason_is_present_at_zero() -> None:
    s = _render(Renderer(ClusterIndex(), 10, registry=CollectorRegistry()))
    assert select(s, "nws_pods_without_workload") == {
        frozenset({("reason", r)}): 0 for r in ("no_workload_type", "missing_owner", "cycle", "too_deep")}
    assert value(s, "nws_pods_owner_chain_broken", reason="missing_owner") == 0


def test_sources_and_reconciler_collectors() -> None:
    stats = SourceStats(events={"ADDED": 3}, relists=1, objects=3, synced=True)
    sources = SimpleNamespace(stats={"pods": stats}, sync_seconds=None, missing_kinds={("kubeflow.org", "Notebook")},
                              forbidden_kinds={("serving.knative.dev", "Revision")}, unknown_versions={})
    writes = SimpleNamespace(writes={"apply": 2}, errors={"409": 1})
    summaries = {"nodesummaries": {"a": 1, "b": 2}, "workloadsummaries": {}}
    queues = [WorkQueue[str](name="summaries"), WorkQueue[str](name="clusterqueues")]
    queues[1].add("q")
    elector = SimpleNamespace(is_leader=False)
    registry = CollectorRegistry()
    registry.register(SourcesCollector(sources))
    registry.register(ReconcilerCollector(writes, queues, summaries, SimpleNamespace(counts={}), elector))
    s = _render(Renderer(ClusterIndex(), 10, registry=registry))
    assert value(s, "nws_watch_events_total", resource="pods", type="ADDED") == 3
    assert value(s, "nws_watch_synced", resource="pods") == 1
    assert value(s, "nws_initial_sync_duration_seconds") is None
    assert value(s, "nws_kind_not_served", group="kubeflow.org", kind="Notebook") == 1
    assert value(s, "nws_kind_forbidden", group="serving.knative.dev", kind="Revision") == 1
    assert value(s, "nws_reconciler_writes_total", verb="apply") == 2
    assert value(s, "nws_reconciler_write_errors_total", code="409") == 1
    assert value(s, "nws_reconciler_leader") == 0
    assert value(s, "nws_reconciler_summaries", kind="nodesummaries") == 2
    assert value(s, "nws_workqueue_depth", name="summaries") == 0  # each controller's queue, by its name
    assert value(s, "nws_workqueue_depth", name="clusterqueues") == 1
    assert value(s, "nws_workqueue_adds_total", name="clusterqueues") == 1
    elector.is_leader = True
    sources.missing_kinds.clear()  # a kind no longer configured: its series goes
    s = _render(Renderer(ClusterIndex(), 10, registry=registry))
    assert value(s, "nws_reconciler_leader") == 1 and not select(s, "nws_kind_not_served")
    sources.forbidden_kinds.clear()  # the kind was granted: its series goes
    registry2 = CollectorRegistry()
    registry2.register(SourcesCollector(sources))
    registry2.register(ReconcilerCollector(writes, queues, summaries, SimpleNamespace(counts={})))
    s = _render(Renderer(ClusterIndex(), 10, registry=registry2))
    assert not select(s, "nws_kind_forbidden") and value(s, "nws_reconciler_leader") == 1
