"""The exporter process against a real kube-apiserver: exact values, latency, recovery."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.workloads import create, node_summarizer, ok, workload_summarizer
from kubeindex.model.resources import NODE_SUMMARIZERS, NODES, PODS
from localkube.cluster import LocalCluster, Options
from localkube.service import ScrapeFailed, Service, select, value, wait_for
from tests.kube import create_node, create_pod, delete, set_node_labels, set_node_status
from tests.paths import CRDS

pytestmark = pytest.mark.compat  # one of the core scenarios make compat runs on every Kubernetes minor


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
