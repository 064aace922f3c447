"""Alert rules and dashboards: generated files current, promtool checks and unit tests, every
expression parses and uses only metrics a real scrape has, alerts fire in a real Prometheus, and
every dashboard query reads the same with one replica scraped as with two."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from alerts.replicas import LABELS
from alerts.rules import Thresholds, rules_file
from demo.kueue import cluster_queue, install_kueue, resource_flavor
from demo.workloads import create, deployment_chain, node_summarizer, ok, owner_ref, workload_summarizer
from kubeindex.model.resources import NODECLAIMS, NODES, PODS
from localkube.cluster import LocalCluster, Options
from localkube.prometheus import Prometheus
from localkube.service import Service, select, wait_for
from tests.alerting import disrupt, replica_labels
from tests.kube import create_node, create_pod, nodeclaim_crd, set_node_status, set_pod_phase, set_pod_ready
from tests.paths import CRDS
from tests.support.alerts_dashboards import (
    PROMETHEUS_OWN,
    all_exprs,
    metric_names,
    panels,
    result,
)

KN, KN_MIN = "pod-group.scheduling.kubenexus.io/name", "pod-group.scheduling.kubenexus.io/min-available"
GANG = {KN: "web", KN_MIN: "3"}


def gpu_pod(cluster: LocalCluster, name: str, node: str, owner: dict) -> None:
    """A Running pod requesting cpu, memory and a GPU, so every requested/allocatable panel has data."""
    requests = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}
    create(cluster, PODS.path("default"), {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "ownerReferences": [owner_ref(owner)], "labels": GANG},
        "spec": {"nodeName": node, "containers": [
            {"name": "c", "image": "x", "resources": {"requests": requests, "limits": requests}}]},
    })
    set_pod_phase(cluster, "default", name, "Running")


def unhealthy_gpu(cluster: LocalCluster, name: str) -> None:
    """The kubelet reports the pod's GPU Unhealthy (allocatedResourcesStatus)."""
    status = {"containerStatuses": [{
        "name": "c", "image": "x", "imageID": "", "ready": True, "restartCount": 0,
        "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}},
        "allocatedResourcesStatus": [{"name": "nvidia.com/gpu",
                                      "resources": [{"resourceID": f"{name}-gpu", "health": "Unhealthy"}]}]}]}
    ok(cluster.request(PODS.path("default", name, "status"), "PATCH", {"status": status},
                       content_type="application/merge-patch+json"))


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    """Groups a (2 nodes with GPUs; a-2 reports one of its 5 unhealthy) and b (3: b-1 being
    disrupted by Karpenter, b-3 cordoned); Deployment web with 2 Running pods (web-1's GPU reported
    Unhealthy, web-2 on b-1, not Ready) and 1 Pending, a KubeNexus-labelled gang of 3 broken by web-2
    (lost on b-1); one pod of no workload. Kueue: flavor a (group a's
    nodes), 24 cpu and 8 GPUs of quota; ClusterResourceClaim a on it, over-allocated (a dry run: the
    quota is not written)."""
    with LocalCluster(Options(), binaries) as c:
        c.install_crds(CRDS)
        install_kueue(c)
        resource_flavor(c, "a", {"pool": "a"})
        cluster_queue(c, "team", {"a": {"cpu": "24", "nvidia.com/gpu": "8"}})
        c.kubectl("apply", "-f", "-", input=json.dumps({  # asks 10 of flavor a's 8 GPUs: a shortfall of 2
            "apiVersion": "ux.sean.example.com/v1alpha1", "kind": "ClusterResourceClaim", "metadata": {"name": "a"},
            "spec": {"flavor": "a", "resourceAssignments": [
                {"clusterQueueName": "team", "resources": {"cpu": "8", "nvidia.com/gpu": "10"}}]}}))
        node_summarizer(c, "pool", "pool")
        workload_summarizer(c, "apps", [("apps", "Deployment")])
        c.kubectl("patch", "workloadsummarizer", "apps", "--type=merge", "-p", json.dumps(
            {"spec": {"gangs": {"podLabels": [{"labelKey": KN, "minAvailableLabelKey": KN_MIN}]}}}))
        gpu = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "4"}
        for name, pool in (("a-1", "a"), ("a-2", "a"), ("b-1", "b"), ("b-2", "b")):
            create_node(c, name, {"pool": pool}, allocatable=gpu if pool == "a" else None)
        create_node(c, "b-3", {"pool": "b"}, unschedulable=True)
        disrupt(c, "b-1")
        ok(c.request(NODES.path(name="a-2", subresource="status"), "PATCH",
                     {"status": {"capacity": {"nvidia.com/gpu": "5"}}},
                     content_type="application/merge-patch+json"))  # the device plugin gave one up
        _, rs = deployment_chain(c, "default", "web")
        gpu_pod(c, "web-1", "a-1", rs)
        unhealthy_gpu(c, "web-1")
        create_pod(c, "default", "web-2", node="b-1", owner=rs, labels=GANG)
        create_pod(c, "default", "web-3", phase="Pending", owner=rs, labels=GANG)
        set_pod_ready(c, "default", "web-1")
        set_pod_ready(c, "default", "web-2", ready=False)
        create_pod(c, "default", "lonely", node="b-2")
        # Karpenter's NodeClaim of a-1, drifted (its kind served without Karpenter): group a's rollout families.
        nodeclaim_crd(c)
        ok(c.request(NODECLAIMS.path(), "POST", {"apiVersion": NODECLAIMS.api_version, "kind": NODECLAIMS.kind,
                                                 "metadata": {"name": "a-1"}, "spec": {}}))
        ok(c.request(NODECLAIMS.path(name="a-1", subresource="status"), "PATCH", {"status": {
            "nodeName": "a-1", "conditions": [{"type": "Drifted", "status": "True", "reason": "NodePoolDrifted",
                                               "lastTransitionTime": "2026-12-01T00:00:00Z"}]}},
                     content_type="application/merge-patch+json"))
        yield c


@pytest.fixture(scope="module")
def service(kube: LocalCluster) -> Iterator[Service]:
    svc = Service(kube, ("--identity=a", "--gang-grace=0")).start()
    wait_for(lambda: select(svc.scrape(), "nws_claim_shortfall"), timeout=20)  # the claim's status, written
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def replicas(kube: LocalCluster, service: Service) -> Iterator[list[Service]]:
    """Two replicas, as the shipped Deployment runs: both serve metrics, one holds the Lease."""
    other = Service(kube, ("--identity=b", "--gang-grace=0")).start()
    yield [service, other]
    other.stop()


def test_each_folded_family_has_exactly_its_listed_labels(service: Service) -> None:
    """Folding by fewer labels than a family has would merge its series: check the list in
    alerts/replicas.py against a real scrape."""
    seen: dict[str, set[frozenset[str]]] = {}
    for name, labels in service.scrape():
        if name in LABELS:
            seen.setdefault(name, set()).add(frozenset(k for k, _ in labels))
    assert set(LABELS) - set(seen) <= {"nws_kind_not_served"}  # present only while a kind is missing
    for name, label_sets in seen.items():
        assert label_sets == {frozenset(LABELS[name])}, name


def test_every_metric_used_is_in_a_real_scrape(service: Service) -> None:
    code, text = service.get("/metrics")
    assert code == 200
    exposed = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    exposed |= {n.removesuffix("_total") + "_total" for n in exposed}  # counters' sample names
    exposed |= {f"{n}_{suffix}" for n in re.findall(r"^# TYPE (\S+) histogram$", text, re.M)
                for suffix in ("bucket", "sum", "count")}  # histograms' sample names
    used = set().union(*(metric_names(e) for e in all_exprs())) - PROMETHEUS_OWN
    assert len(used) > 15
    assert used <= exposed, f"used but never exported: {sorted(used - exposed)}"


def test_node_group_not_ready_fires_in_prometheus_and_resolves(kube: LocalCluster, service: Service,
                                                                  tmp_path: Path) -> None:
    fast = Thresholds(not_ready_for="3s", down_for="3s")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rules_file(fast)))
    prom = Prometheus(tmp_path / "prometheus", [f"127.0.0.1:{service.port}"], [rules]).start()
    try:
        wait_for(lambda: prom.query('nws_nodegroup_nodes{group="a"}'), timeout=30)
        assert prom.alerts() == []
        for node in ("a-1", "a-2"):
            set_node_status(kube, node, "False")

        def firing(name: str) -> list[dict]:
            return [a for a in prom.alerts() if a["labels"]["alertname"] == name]

        wait_for(lambda: firing("NodeGroupNotReady"), timeout=30)
        (alert,) = firing("NodeGroupNotReady")  # for group a, and no other
        assert alert["labels"]["group"] == "a" and alert["labels"]["summarizer"] == "pool"
        assert alert["annotations"]["description"].startswith("100% of the nodes of node group a")
        wait_for(lambda: firing("NodeGroupDown"), timeout=30)
        assert [a["labels"]["group"] for a in firing("NodeGroupDown")] == ["a"]
        for node in ("a-1", "a-2"):
            set_node_status(kube, node, "True")
        wait_for(lambda: not firing("NodeGroupNotReady") and not firing("NodeGroupDown"), timeout=30)
    finally:
        prom.stop()


def test_workload_on_unhealthy_nodes_fires_once_per_affected_workload(binaries: dict[str, Path],
                                                                       tmp_path: Path) -> None:
    """Group sick: sick-1 goes NotReady, sick-2 gets Karpenter's disruption taint. Deployment train
    has both its pods there (critical and warning), serve 1 of 3 (warning), web none (silent); two
    replicas scraped with their target labels: each alert fires once, and resolves on recovery."""
    with LocalCluster(Options(), binaries) as kube:
        kube.install_crds(CRDS)
        node_summarizer(kube, "pool", "pool")
        workload_summarizer(kube, "apps", [("apps", "Deployment")])
        for name, pool in (("sick-1", "sick"), ("sick-2", "sick"), ("well-1", "well"), ("well-2", "well")):
            create_node(kube, name, {"pool": pool})
        placement = {"train": ("sick-1", "sick-2"), "serve": ("sick-1", "well-1", "well-2"),
                     "web": ("well-1", "well-2")}
        for workload, nodes in placement.items():
            _, rs = deployment_chain(kube, "default", workload)
            for i, node in enumerate(nodes):
                create_pod(kube, "default", f"{workload}-{i}", node=node, owner=rs)
        services = [Service(kube, (f"--identity={i}",)).start() for i in ("a", "b")]
        rules = tmp_path / "rules.yaml"
        rules.write_text(yaml.safe_dump(rules_file(Thresholds(unhealthy_for="3s"))))
        targets = {f"127.0.0.1:{s.port}": replica_labels(str(i)) for i, s in enumerate(services)}
        prom = Prometheus(tmp_path / "prometheus", list(targets), [rules], target_labels=targets,
                          honor_labels=True).start()
        try:
            wait_for(lambda: len(prom.query('nws_workload_pods{workload="train", phase="Running"} == 2')) == 2,
                     timeout=60)

            def hurt() -> list[tuple[str, str]]:
                return sorted((a["labels"]["workload"], a["labels"]["severity"]) for a in prom.alerts()
                              if a["labels"]["alertname"] == "WorkloadOnUnhealthyNodes")

            assert hurt() == []
            set_node_status(kube, "sick-1", "False")
            disrupt(kube, "sick-2")
            want = [("serve", "warning"), ("train", "critical"), ("train", "warning")]
            wait_for(lambda: hurt() == want, timeout=60)
            time.sleep(3)  # a duplicate per replica would have shown by now
            assert hurt() == want
            alerts_now = [a for a in prom.alerts() if a["labels"]["alertname"] == "WorkloadOnUnhealthyNodes"]
            assert {a["annotations"]["description"] for a in alerts_now if a["labels"]["workload"] == "train"} == {
                "2 pods of Deployment default/train run on NotReady, Unknown or Disrupting nodes.",
                "2 pods of Deployment default/train run on NotReady, Unknown or Disrupting nodes: at least 50% of "
                "its pods."}
            assert all("pod" not in a["labels"] and "instance" not in a["labels"] for a in alerts_now)
            set_node_status(kube, "sick-1", "True")
            disrupt(kube, "sick-2", [])
            wait_for(lambda: hurt() == [], timeout=60)
        finally:
            prom.stop()
            for svc in services:
                svc.stop()


CLUSTER_DASHBOARDS = ("node-groups.json", "node-group-detail.json", "workloads.json")


def scraping(services: list[Service], workdir: Path) -> Prometheus:
    targets = {f"127.0.0.1:{s.port}": replica_labels(str(i)) for i, s in enumerate(services)}
    prom = Prometheus(workdir, list(targets), [], target_labels=targets, honor_labels=True).start()
    wait_for(lambda: len(prom.query("up == 1")) == len(services)
             and len(prom.query("nws_workloads")) == len(services)
             and prom.query("sum(nws_reconciler_leader) == 1"), timeout=60)
    return prom


def stat(prom: Prometheus, dashboard: str, title: str) -> float:
    (query,) = panels(dashboard)[title]
    (value,) = result(prom, query).values()
    return value


def test_every_dashboard_query_reads_the_same_with_two_replicas(replicas: list[Service], tmp_path: Path) -> None:
    one, two = scraping(replicas[:1], tmp_path / "one"), scraping(replicas, tmp_path / "two")
    try:
        queries = [q for d in CLUSTER_DASHBOARDS for qs in panels(d).values() for q in qs]
        unanswered = []
        for query in queries:
            want = result(one, query)
            assert result(two, query) == want, query
            unanswered += [] if want else [query]
        assert unanswered == [], "every query has an answer here, so equality is not vacuous"
        truth = {
            ("node-groups.json", "Node groups"): 2, ("node-groups.json", "Nodes"): 5,
            ("node-groups.json", "Not ready nodes"): 0, ("node-groups.json", "Cordoned nodes"): 1,
            ("node-groups.json", "Running pods on groups"): 3, ("node-group-detail.json", "Nodes"): 2,
            ("workloads.json", "Workloads"): 1, ("workloads.json", "Pods in workloads"): 3,
            ("workloads.json", "Pending pods"): 1, ("workloads.json", "Pods without a workload"): 1,
            ("health.json", "Targets up"): 2, ("health.json", "Replicas holding the Lease"): 1,
            ("node-groups.json", "Unhealthy accelerators per group (capacity - allocatable)"): 1,
            ("node-group-detail.json", "Disrupting"): 0, ("node-group-detail.json", "Degraded"): 1,
            ("workloads.json", "Workloads on unhealthy nodes"): 1, ("workloads.json", "Pods on unhealthy nodes"): 1,
            ("workloads.json", "Broken gangs"): 1,
        }
        assert {key: stat(two, *key) for key in truth} == truth
        web = frozenset({("namespace", "default"), ("workload", "web"), ("kind", "Deployment")})
        # web-2 on the Disrupting b-1: pods there, in all not-Ready states, nodes not Ready, all pods
        # (and on group a's detail dashboard the nodes of a it uses).
        for dashboard, title, columns in (
                ("workloads.json", "Workloads hurt now: pods on nodes not Ready", [1, 1, 1, 3]),
                ("node-group-detail.json", "Workloads on this group hurt now", [1, 1, 1, 3, 1])):
            assert [result(two, q) for q in panels(dashboard)[title]] == [{web: v} for v in columns], title
        by_state = result(two, panels("node-groups.json")["Nodes by state (all selected groups)"][0])
        assert {dict(k)["state"]: v for k, v in by_state.items()} == {
            "Ready": 2, "NotReady": 0, "Unknown": 0, "Disrupting": 1, "Cordoned": 1, "Degraded": 1}
        kueue = panels("node-groups.json")
        (ratio,) = next(qs for title, qs in kueue.items() if title.startswith("Kueue: nominal quota / Ready"))
        assert {(dict(k)["flavor"], dict(k)["resource"]): v for k, v in result(two, ratio).items()} == {
            ("a", "cpu"): 1.5, ("a", "nvidia.com/gpu"): 1.0}
        absolute = kueue["Kueue: nominal quota, allocatable (all, Ready) and requested per flavor ($resource)"]
        assert [{dict(k)["flavor"]: v for k, v in result(two, q).items()} for q in absolute] == [
            {"a": 16}, {"a": 16}, {"a": 24}, {"a": 1}]  # cpu: allocatable, of Ready nodes, quota, requested
        for query in (q for qs in panels("health.json").values() for q in qs):
            two.query(query)  # per-replica panels: every query evaluates
    finally:
        one.stop()
        two.stop()
