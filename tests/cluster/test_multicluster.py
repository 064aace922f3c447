"""Many clusters, one Prometheus: two control planes, one service each, one Prometheus scraping both
with `cluster="a"` and `cluster="b"` on the targets (as an external label or relabel does in a
fleet). A pool goes NotReady in cluster b only: the alerts fire for b alone, and every dashboard
query, with `$cluster` set to each cluster, reads what a Prometheus of that cluster alone reads
(series without a cluster label, `$cluster` empty, as in a single-cluster install)."""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml

import dashboards.__main__ as dashboards_gen
from alerts.rules import Thresholds, rules_file
from demo.workloads import deployment_chain
from localkube.cluster import LocalCluster
from localkube.prometheus import Prometheus
from localkube.service import Service, wait_for
from tests.kube import create_node, create_pod, set_node_status, set_pod_ready, summarized_cluster

CLUSTERS = ("a", "b")
KN, KN_MIN = "pod-group.scheduling.kubenexus.io/name", "pod-group.scheduling.kubenexus.io/min-available"
GPU = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "4"}
# Node groups of the same names in both clusters, of different sizes: a query that ignored the
# cluster would merge or mix them.
NODES = {"a": {"cpu": 2, "gpu": 1}, "b": {"cpu": 3, "gpu": 2}}
VARIABLES = {"$__rate_interval": "1m", "$top": "10", "$summarizer": "pool", "$group": "gpu", "$namespace": ".*",
             "$kind": ".*", "$job": "node-workload-summary"}
CLUSTER_DASHBOARDS = ("node-groups.json", "node-group-detail.json", "workloads.json")
Result = dict[frozenset[tuple[str, str]], float]


def populate(kube: LocalCluster, name: str) -> None:
    """Deployment shop/web: in a 2 Running pods on cpu (1Gi of memory each), Ready, a whole
    KubeNexus-labelled gang; in b
    2 on gpu, 1 on cpu, 1 Pending, and one pod of no workload."""
    for pool, count in NODES[name].items():
        for i in range(count):
            create_node(kube, f"{pool}-{i}", {"pool": pool}, allocatable=GPU if pool == "gpu" else None)
    _, rs = deployment_chain(kube, "shop", "web")
    nodes = ["cpu-0", "cpu-1"] if name == "a" else ["gpu-0", "gpu-1", "cpu-0", ""]
    gang = {KN: "web", KN_MIN: "2"} if name == "a" else {}
    for i, node in enumerate(nodes):
        create_pod(kube, "shop", f"web-{i}", node=node, phase="Running" if node else "Pending", owner=rs,
                   labels=gang, memory="1Gi" if gang else None)
        if gang:
            set_pod_ready(kube, "shop", f"web-{i}")
    if gang:
        kube.kubectl("patch", "workloadsummarizer", "apps", "--type=merge", "-p", json.dumps(
            {"spec": {"gangs": {"podLabels": [{"labelKey": KN, "minAvailableLabelKey": KN_MIN}]}}}))
    if name == "b":
        create_pod(kube, "shop", "lonely", node="cpu-1")


@pytest.fixture(scope="module")
def fleet(binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Per cluster its control plane, its service and a Prometheus of its own (no cluster label);
    and the fleet Prometheus scraping both services with the cluster label and the alert rules."""
    work = tmp_path_factory.mktemp("fleet")
    with ExitStack() as stack:
        kubes = {c: stack.enter_context(summarized_cluster(binaries, "shop")) for c in CLUSTERS}
        services = {}
        for c, kube in kubes.items():
            populate(kube, c)
            services[c] = Service(kube, (f"--identity={c}",)).start()
            stack.callback(services[c].stop)
        rules = work / "rules.yaml"
        rules.write_text(yaml.safe_dump(rules_file(Thresholds(not_ready_for="3s", down_for="3s",
                                                              unhealthy_for="3s"))))
        targets = {f"127.0.0.1:{s.port}": {"cluster": c} for c, s in services.items()}
        fleet_prom = Prometheus(work / "fleet", list(targets), [rules], target_labels=targets,
                                honor_labels=True).start()
        stack.callback(fleet_prom.stop)
        alone = {c: Prometheus(work / c, [f"127.0.0.1:{s.port}"], [], honor_labels=True).start()
                 for c, s in services.items()}
        for prom in alone.values():
            stack.callback(prom.stop)
        for c in CLUSTERS:
            def scraped(c: str = c) -> object:
                return (len(alone[c].query("sum(nws_reconciler_leader) == 1"))
                        and fleet_prom.query(f'sum(nws_reconciler_leader{{cluster="{c}"}}) == 1')
                        and fleet_prom.query(f'nws_workloads{{cluster="{c}"}} == 1'))

            wait_for(scraped, timeout=60)
        yield {"kubes": kubes, "services": services, "fleet": fleet_prom, "alone": alone}


def cluster_values(prom: Prometheus) -> list[str]:
    """What Grafana's `label_values(nws_build_info, cluster)` finds, sorted as the variable sorts."""
    return sorted(prom.api("/api/v1/label/cluster/values?match[]=" + urllib.parse.quote("nws_build_info")))


def variable(prom: Prometheus) -> str:
    """The hidden variable's value: the first cluster, or "" when there is none (Grafana's None)."""
    values = cluster_values(prom)
    return values[0] if values else ""


def queries(dashboard: str, cluster: str) -> dict[str, list[str]]:
    """Panel title -> its queries, with the dashboard variables substituted."""
    def substitute(expr: str) -> str:
        for var, value in {**VARIABLES, "$cluster": cluster}.items():
            expr = expr.replace(var, value)
        return expr

    data = json.loads(dashboards_gen.render()[dashboard])
    return {p["title"]: [substitute(t["expr"]) for t in p.get("targets", [])] for p in data["panels"]}


def result(prom: Prometheus, expr: str) -> Result:
    """The query's answer; the cluster label is dropped, a lone cluster's series have none."""
    return {frozenset((k, v) for k, v in r["metric"].items() if k != "cluster"): float(r["value"][1])
            for r in prom.query(expr)}


def stats(prom: Prometheus, cluster: str, wanted: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
    out = {}
    for dashboard, title in wanted:
        (query,) = queries(dashboard, cluster)[title]
        (out[dashboard, title],) = result(prom, query).values()
    return out


def same_answers(fleet: Prometheus, alone: Prometheus, cluster: str) -> list[str]:
    """The cluster dashboards' queries whose answer in the fleet, on ``cluster``, differs from the
    answer in that cluster's own Prometheus, on its (empty) variable."""
    own = variable(alone)
    pairs = [(q, o) for d in CLUSTER_DASHBOARDS
             for qs, os in zip(queries(d, cluster).values(), queries(d, own).values(), strict=True)
             for q, o in zip(qs, os, strict=True)]
    return [q for q, o in pairs if result(fleet, q) != result(alone, o)]


TRUTH = {  # per cluster: (dashboard, stat panel) -> value
    "a": {("node-groups.json", "Nodes"): 3, ("node-groups.json", "Not ready nodes"): 0,
          ("node-groups.json", "Running pods on groups"): 2, ("node-group-detail.json", "Nodes"): 1,
          ("workloads.json", "Pods in workloads"): 2, ("workloads.json", "Pending pods"): 0,
          ("workloads.json", "Pods without a workload"): 0, ("health.json", "Targets up"): 1,
          ("health.json", "Replicas holding the Lease"): 1},
    "b": {("node-groups.json", "Nodes"): 5, ("node-groups.json", "Not ready nodes"): 0,
          ("node-groups.json", "Running pods on groups"): 4, ("node-group-detail.json", "Nodes"): 2,
          ("workloads.json", "Pods in workloads"): 4, ("workloads.json", "Pending pods"): 1,
          ("workloads.json", "Pods without a workload"): 1, ("health.json", "Targets up"): 1,
          ("health.json", "Replicas holding the Lease"): 1},
}


def test_the_cluster_variable_finds_both_clusters_in_the_fleet_and_none_alone(fleet: dict) -> None:
    assert cluster_values(fleet["fleet"]) == ["a", "b"]
    assert [cluster_values(p) for p in fleet["alone"].values()] == [[], []]


def test_every_dashboard_query_reads_each_cluster_alone(fleet: dict) -> None:
    prom, alone = fleet["fleet"], fleet["alone"]
    answered: set[tuple[str, str]] = set()  # (dashboard, panel) answered for some cluster
    for c in CLUSTERS:
        assert stats(prom, c, list(TRUTH[c])) == TRUTH[c], c
        assert stats(alone[c], variable(alone[c]), list(TRUTH[c])) == TRUTH[c], c
        answered |= {(d, t) for d in CLUSTER_DASHBOARDS for t, qs in queries(d, c).items()
                     if any(result(prom, q) for q in qs)}
        assert same_answers(prom, alone[c], c) == [], c
        for query in (q for qs in queries("health.json", c).values() for q in qs):
            prom.query(query)  # per-replica panels: every query evaluates
    panels = {(d, t) for d in CLUSTER_DASHBOARDS for t in queries(d, "")}
    print(f"\n{len(answered)} of {len(panels)} panels answered: {sorted(panels - answered)}")
    assert len(answered) >= 0.75 * len(panels), "most panels have an answer: the comparison is not vacuous"


def test_a_pool_not_ready_in_b_alerts_for_b_alone(fleet: dict) -> None:
    prom, alone = fleet["fleet"], fleet["alone"]
    assert prom.alerts() == []
    for i in range(NODES["b"]["gpu"]):
        set_node_status(fleet["kubes"]["b"], f"gpu-{i}", "False")

    def firing() -> list[tuple[str, ...]]:
        return sorted((a["labels"]["alertname"], a["labels"]["cluster"], a["labels"]["severity"],
                       a["labels"].get("group") or a["labels"]["workload"]) for a in prom.alerts())

    want = [("NodeGroupDown", "b", "critical", "gpu"), ("NodeGroupNotReady", "b", "warning", "gpu"),
            ("WorkloadOnUnhealthyNodes", "b", "critical", "web"), ("WorkloadOnUnhealthyNodes", "b", "warning", "web")]
    wait_for(lambda: firing() == want, timeout=60)
    time.sleep(3)  # an alert for cluster a, or one without a cluster, would have shown by now
    assert firing() == want
    (alert,) = [a for a in prom.alerts() if a["labels"]["alertname"] == "NodeGroupNotReady"]
    print(f"\nfiring: {json.dumps(alert['labels'], sort_keys=True)}\n  {alert['annotations']['description']}")
    assert alert["labels"] == {"alertname": "NodeGroupNotReady", "cluster": "b", "group": "gpu", "summarizer": "pool",
                               "severity": "warning"}

    # The dashboards: b has 2 not ready nodes, a none, and each still reads as its own Prometheus.
    not_ready = [("node-groups.json", "Not ready nodes"), ("node-group-detail.json", "Not ready")]
    wait_for(lambda: [stats(alone[c], "", not_ready) for c in CLUSTERS] == [
        dict.fromkeys(not_ready, 0), dict.fromkeys(not_ready, 2)], timeout=30)
    web = frozenset({("namespace", "shop"), ("workload", "web"), ("kind", "Deployment")})
    hurt = {c: result(prom, queries("workloads.json", c)["Workloads hurt now: pods on nodes not Ready"][0])
            for c in CLUSTERS}
    assert hurt == {"a": {}, "b": {web: 2}}
    for c in CLUSTERS:
        assert stats(prom, c, not_ready) == dict.fromkeys(not_ready, 2 if c == "b" else 0)

        def agree(c: str = c) -> bool:
            return same_answers(prom, alone[c], c) == []

        wait_for(agree, timeout=10)  # scraped a second apart
