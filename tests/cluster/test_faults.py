"""Faults and bad input on a real control plane: after each, the numbers are right and nothing is
lost (restarts and 410 after a freeze are in test_exporter.py, user edits in test_reconciler.py)."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.workloads import create, deployment_chain, node_summarizer, owner_ref, pod_template
from kubeindex.model.resources import PODS, WORKLOAD_SUMMARIES
from localkube.cluster import LocalCluster
from localkube.proxy import through_proxy
from localkube.service import ScrapeFailed, Service, parse, select, value, wait_for
from reconciler.names import is_dns1123_subdomain
from tests.kube import create_node, create_pod, delete, get_object, set_node_status, summarized_cluster

pytestmark = pytest.mark.compat  # one of the core scenarios make compat runs on every Kubernetes minor

NS = "faults"
FAST_LEASE = ("--lease-duration=6", "--renew-deadline=4", "--retry-period=1")


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    with summarized_cluster(binaries, NS) as c:
        for i in range(3):
            create_node(c, f"n-{i}", {"pool": "a"})
        yield c


def _node_not_ready(svc: Service, group: str = "a") -> float | None:
    return value(svc.scrape(), "nws_nodegroup_nodes_by_condition", summarizer="pool", group=group,
                 condition="NotReady")


def test_silent_watch_is_noticed_by_the_read_timeout(kube: LocalCluster) -> None:
    proxy, proxied = through_proxy(kube, "proxied")
    svc = Service(kube, (f"--kubeconfig={proxied}", "--read-timeout=3", "--no-reconciler")).start()
    try:
        assert _node_not_ready(svc) == 0
        assert proxy.stall_existing() > 0  # every watch now hears nothing, and nothing closes
        stalled_at = time.monotonic()
        set_node_status(kube, "n-0", "False")
        wait_for(lambda: _node_not_ready(svc) == 1, timeout=10)
        took = time.monotonic() - stalled_at
        print(f"silent watch replaced; change visible {took:.1f}s after the stall")
        assert value(svc.scrape(), "nws_watch_restarts_total", resource="nodes", reason="timeout")
    finally:
        svc.stop()
        proxy.close()
        set_node_status(kube, "n-0", "True")


def test_odd_input_never_crashes(kube: LocalCluster) -> None:
    odd = {"x" * 63: "max-63", "a.b.c": "dots", "under_score": "us", "UPPER": "up", "": "empty",
           "-x-": "dashes"}
    for i, value_ in enumerate(odd):
        labels = {"pool": "odd", "example.com/odd-value": value_} if value_ != "-x-" else {"pool": "odd"}
        create_node(kube, f"odd-{i}", labels, allocatable={})  # and no allocatable at all
    create_pod(kube, NS, "unscheduled", "", phase="Pending")
    create_pod(kube, NS, "on-missing-node", "no-such-node")
    # A pod whose owner reference carries a stale UID, and an owner cycle between two ReplicaSets.
    deploy, _ = deployment_chain(kube, NS, "recreated")
    stale = owner_ref(deploy) | {"uid": "00000000-0000-0000-0000-000000000000"}
    kube.request(PODS.path(NS), "POST", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stale-owner", "ownerReferences": [stale]},
        "spec": {"containers": [{"name": "c", "image": "x"}]}})
    # Two ReplicaSets that own each other, and a pod under them.
    rs_a = create(kube, f"/apis/apps/v1/namespaces/{NS}/replicasets", {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "cycle-a"},
        "spec": {"selector": {"matchLabels": {"c": "a"}}, "template": pod_template({"c": "a"})}})
    rs_b = create(kube, f"/apis/apps/v1/namespaces/{NS}/replicasets", {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "cycle-b", "ownerReferences": [owner_ref(rs_a)]},
        "spec": {"selector": {"matchLabels": {"c": "b"}}, "template": pod_template({"c": "b"})}})
    kube.request(f"/apis/apps/v1/namespaces/{NS}/replicasets/cycle-a", "PATCH",
                 {"metadata": {"ownerReferences": [owner_ref(rs_b)]}}, content_type="application/merge-patch+json")
    create_pod(kube, NS, "in-a-cycle", "n-1", owner=rs_a)
    # Hundreds of summarizers, most matching nothing.
    node_summarizer(kube, "odd", "example.com/odd-value")
    for i in range(200):
        node_summarizer(kube, f"many-{i}", f"example.com/k{i}")
    svc = Service(kube).start()
    try:
        names = lambda: set(kube.kubectl("get", "nodesummaries", "-o", "jsonpath={.items[*].metadata.name}")  # noqa: E731
                            .stdout.split())
        wait_for(lambda: len([n for n in names() if n.startswith("odd-")]) == 5, timeout=60)
        odd_names = sorted(n for n in names() if n.startswith("odd-"))
        assert "odd-dots" not in odd_names and "odd-a.b.c" in odd_names  # valid values keep their name
        assert all(is_dns1123_subdomain(n) for n in odd_names), odd_names  # "x" * 63 keeps its 67-char name
        s = svc.scrape()
        assert value(s, "nws_nodegroup_nodes", summarizer="odd", group="") == 1  # the empty value is a group
        assert value(s, "nws_nodegroup_nodes", summarizer="pool", group="odd") == 6
        assert value(s, "nws_pods_without_workload", reason="missing_owner") == 1
        assert value(s, "nws_pods_without_workload", reason="cycle") == 1
        assert value(s, "nws_nodegroups", summarizer="many-7") == 0
        code, text = svc.get("/metrics", accept="application/openmetrics-text; version=1.0.0")
        assert code == 200 and text.endswith("# EOF\n")
        wait_for(lambda: kube.kubectl("get", "nodesummarizer", "many-199", "-o", "jsonpath={.status.conditions[0]"
                                      ".reason}").stdout == "NoMatchingNodes", timeout=60)
        assert svc.proc is not None and svc.proc.poll() is None
    finally:
        svc.stop()


def test_many_concurrent_scrapes_do_not_stall_the_watch(kube: LocalCluster) -> None:
    svc = Service(kube, ("--no-reconciler",)).start()
    stop = threading.Event()
    scrapes = [0]

    def scraper() -> None:
        while not stop.is_set():
            with urllib.request.urlopen(f"http://127.0.0.1:{svc.port}/metrics", timeout=30) as resp:
                resp.read()
            scrapes[0] += 1

    threads = [threading.Thread(target=scraper, daemon=True) for _ in range(100)]
    try:
        for t in threads:
            t.start()
        latencies = []
        for i in range(6):
            status = "False" if i % 2 == 0 else "True"
            started = time.monotonic()
            set_node_status(kube, "n-2", status)
            def shown(status: str = status) -> bool:
                return _node_not_ready(svc) == (1 if status == "False" else 0)

            wait_for(shown, timeout=10, interval=0.01)
            latencies.append(time.monotonic() - started)
        print(f"under 100 concurrent scrapers ({scrapes[0]} scrapes): NotReady -> metric max {max(latencies):.2f}s")
        # A stalled watch (scrapes holding the event loop) shows as many seconds or the wait's timeout;
        # a loaded machine stretches the sub-second figure (bench.latency_floor measures that) past
        # 1 s: the bound is one only a stall breaks.
        assert max(latencies) < 5.0, latencies
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        svc.stop()


def test_leader_failover_under_churn(kube: LocalCluster) -> None:
    _, rs = deployment_chain(kube, NS, "churn")
    leader = Service(kube, ("--identity=a", *FAST_LEASE)).start()
    standby = Service(kube, ("--identity=b", *FAST_LEASE)).start()
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            create_pod(kube, NS, f"churn-{i}", f"n-{i % 3}", owner=rs, labels={"app": "churn"})
            if i >= 5:
                delete(kube, PODS.path(NS, f"churn-{i - 5}"))
            i += 1

    thread = threading.Thread(target=churn, daemon=True)
    try:
        wait_for(lambda: select(leader.scrape(), "nws_reconciler_leader").get(frozenset()) == 1, timeout=15,
                 retry=ScrapeFailed)
        thread.start()
        time.sleep(3)
        leader.kill()
        time.sleep(10)  # churn goes on through the failover
        stop.set()
        thread.join(timeout=30)
        truth = len(kube.kubectl("get", "pods", "-n", NS, "-l", "app=churn", "-o", "name").stdout.split())
        assert truth >= 1

        def summary_pods() -> int | None:
            churn = get_object(kube, WORKLOAD_SUMMARIES.path(NS, "churn"))
            return (churn or {}).get("status", {}).get("podCount")

        wait_for(lambda: summary_pods() == truth, timeout=20)
        assert select(standby.scrape(), "nws_reconciler_leader").get(frozenset()) == 1
        assert value(parse(standby.get("/metrics")[1]), "nws_workload_pods", namespace=NS, workload="churn",
                     kind="Deployment", phase="Running") == truth
    finally:
        stop.set()
        leader.stop()
        standby.stop()
