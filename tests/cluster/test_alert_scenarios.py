"""The alerts judged as a person would: real Prometheus evaluates the generated rules (with short
``for``s) over two real replicas of the service, scraped with their target labels, in a real
cluster; each scenario asserts the WHOLE set of alerts pending or firing, not only the one it
expects, and, where a node group explains a capacity alert, what docs/runbooks.md's inhibition
lets through to the pager (a real Alertmanager).

The cluster: node groups (label ``pool``) apps (Deployment web on both nodes), batch (Job report,
its pods all Succeeded), gpu (4 nodes of 8 GPUs; no pods), cpu (2 nodes, no pods) and train (4
nodes on two racks; Deployment ring, a KubeNexus-labelled gang of 4, one member per node). Kueue's CRDs,
flavors gpu and cpu over those pools, ClusterQueues research and prod, and two ClusterResourceClaims:
gpu (as the demo's: research absolute amounts that fit the whole pool, prod 50%) and cpu (75% of the
cpu on purpose, a deliberate partial assignment). The claims' quota is written (actuation on)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from alerts.rules import Thresholds, rules_file
from demo.kueue import cell, cluster_queue, install_kueue, resource_flavor
from demo.workloads import create, deployment_chain, node_summarizer, ok, workload_summarizer
from kubeindex.model.objects import API_VERSION
from kubeindex.model.resources import CLAIMS, CLUSTER_QUEUES, RESOURCE_FLAVORS
from localkube.alertmanager import Alertmanager
from localkube.cluster import LocalCluster, Options
from localkube.prometheus import Prometheus
from localkube.service import Service, wait_for
from tests.alerting import Stub, disrupt, replica_labels, runbooks_inhibit_rules
from tests.kube import create_node, create_pod, set_node_status, set_pod_ready
from tests.paths import CRDS

GPU = "nvidia.com/gpu"
GPU_NODES = ("gpu-0", "gpu-1", "gpu-2", "gpu-3")
SETTLE = 2  # --quota-settle, seconds
# Every `for` short; the size of the pool an hour ago (NodeGroupShrunk) is not in play: no node goes.
FAST = Thresholds(not_ready_for="2s", down_for="2s", pending_for="2s", failed_for="2s", unhealthy_for="2s",
                  accelerators_unhealthy_for="2s", disrupting_for="2s", quota_exceeds_for="2s",
                  unassigned_for="2s", claim_over_allocated_for="2s", exporter_down_for="2s", stale_for="2s",
                  series_cap_for="2s", write_errors_for="2s", no_leader_for="2s", gang_broken_for="2s")
RACK = "example.com/rack"
KN, KN_MIN = "pod-group.scheduling.kubenexus.io/name", "pod-group.scheduling.kubenexus.io/min-available"
TRAIN_NODES = ("train-0", "train-1", "train-2", "train-3")
STABLE = 3.0  # seconds a set must hold: three evaluations, longer than every `for`

Alert = tuple[str, str, str, str]  # (alertname, severity, what it is about, state)


def about(labels: dict[str, str]) -> str:
    """What an alert names: its node group, workload, claim or flavor."""
    return next((labels[k] for k in ("group", "workload", "claim", "flavor") if k in labels), "")


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    with LocalCluster(Options(), binaries) as c:
        c.install_crds(CRDS)
        install_kueue(c)
        node_summarizer(c, "pool", "pool")
        workload_summarizer(c, "apps", [("apps", "Deployment"), ("batch", "Job")])
        c.kubectl("patch", "workloadsummarizer", "apps", "--type=merge", "-p", json.dumps(
            {"spec": {"gangs": {"podLabels": [{"labelKey": KN, "minAvailableLabelKey": KN_MIN}]}}}))
        for name in ("apps-0", "apps-1", "batch-0", "batch-1", "cpu-0", "cpu-1"):
            create_node(c, name, {"pool": name.split("-")[0]})
        for i, name in enumerate(TRAIN_NODES):
            create_node(c, name, {"pool": "train", RACK: f"r{i // 2}"})
        _, ring = deployment_chain(c, "default", "ring")
        for i, node in enumerate(TRAIN_NODES):
            create_pod(c, "default", f"ring-{i}", node=node, owner=ring, labels={KN: "ring", KN_MIN: "4"})
            set_pod_ready(c, "default", f"ring-{i}")
        for name in GPU_NODES:
            create_node(c, name, {"pool": "gpu"}, allocatable={"cpu": "32", "memory": "128Gi", "pods": "110",
                                                                GPU: "8"})
        _, rs = deployment_chain(c, "default", "web")
        for i, node in enumerate(("apps-0", "apps-1")):
            create_pod(c, "default", f"web-{i}", node=node, owner=rs)
        job = create(c, "/apis/batch/v1/namespaces/default/jobs", {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "report"},
            "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never",
                                                            "containers": [{"name": "c", "image": "x"}]}}}})
        for i, node in enumerate(("batch-0", "batch-1", "batch-0", "batch-1")):
            create_pod(c, "default", f"report-{i}", node=node, owner=job, phase="Succeeded")
        resource_flavor(c, "gpu", {"pool": "gpu"})
        resource_flavor(c, "cpu", {"pool": "cpu"})
        for queue in ("research", "prod"):
            cluster_queue(c, queue, {"gpu": {"cpu": "0", GPU: "0"}, "cpu": {"cpu": "0", GPU: "0"}})
        claim(c, "gpu", [{"clusterQueueName": "research", "resources": {"cpu": "32", GPU: "12"}},
                         {"clusterQueueName": "prod", "shares": {"cpu": "50%", GPU: "50%"}}])
        claim(c, "cpu", [{"clusterQueueName": "research", "shares": {"cpu": "25%"}},
                         {"clusterQueueName": "prod", "shares": {"cpu": "50%"}}])
        yield c


def claim(cluster: LocalCluster, flavor: str, assignments: list[dict]) -> None:
    create(cluster, CLAIMS.path(), {
        "apiVersion": API_VERSION, "kind": "ClusterResourceClaim", "metadata": {"name": flavor},
        "spec": {"flavor": flavor, "overAllocation": "Scale", "resourceAssignments": assignments}})


class Watch:
    """Prometheus over two replicas with the fast rules, sending to an Alertmanager with
    docs/runbooks.md's inhibit_rules, whose notifications a stub pager records."""

    def __init__(self, kube: LocalCluster, workdir: Path) -> None:
        self.services = [Service(kube, (f"--identity={i}", "--quota-actuation=on", f"--quota-settle={SETTLE}",
                                        "--gang-grace=2", f"--gang-topology-label={RACK}"))
                         for i in ("a", "b")]
        self.pager = Stub("")
        receiver = {"name": "pager", "webhook_configs": [{"url": f"http://{self.pager.address}/"}]}
        self.manager = Alertmanager(workdir / "alertmanager", {
            "route": {"receiver": "pager", "group_by": ["..."], "group_wait": "1s", "group_interval": "1s",
                      "repeat_interval": "1h"},
            "receivers": [receiver], "inhibit_rules": runbooks_inhibit_rules()})
        self.rules = workdir / "rules.yaml"
        self.rules.write_text(yaml.safe_dump(rules_file(FAST)))
        self.workdir = workdir
        self.prom: Prometheus | None = None

    def start(self) -> Watch:
        for svc in self.services:
            svc.start()
        self.manager.start()
        targets = {f"127.0.0.1:{s.port}": replica_labels(str(i)) for i, s in enumerate(self.services)}
        self.prom = Prometheus(self.workdir / "prometheus", list(targets), [self.rules], target_labels=targets,
                               honor_labels=True, alertmanagers=[f"127.0.0.1:{self.manager.port}"]).start()
        return self

    def stop(self) -> None:
        for part in (self.prom, self.manager, *self.services):
            if part is not None:
                part.stop()
        self.pager.stop()

    def alerts(self) -> set[Alert]:
        """Every alert pending or firing in Prometheus. None may carry a replica's ``pod`` or
        ``instance`` label: each fires once over both replicas (the set would hide a twin)."""
        assert self.prom is not None
        found = self.prom.alerts(state=None)
        assert [a["labels"] for a in found if {"pod", "instance"} & a["labels"].keys()] == []
        return {(a["labels"]["alertname"], a["labels"]["severity"], about(a["labels"]), a["state"]) for a in found}

    def paged(self) -> set[tuple[str, str, str]]:
        """What Alertmanager holds active (not muted by an inhibition): what reaches a person."""
        return {(a["labels"]["alertname"], a["labels"]["severity"], about(a["labels"]))
                for a in self.manager.alerts() if a["status"]["state"] == "active"}

    def settle(self, want: set[tuple[str, str, str]], timeout: float = 60) -> None:
        """Wait until exactly ``want`` fires (nothing else pending or firing), and holds for STABLE."""
        expected = {(*a, "firing") for a in want}
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(AssertionError):
                wait_for(lambda: self.alerts() == expected, timeout=max(0.1, deadline - time.monotonic()))
            held = time.monotonic() + STABLE
            while time.monotonic() < held and self.alerts() == expected:
                time.sleep(0.25)
            if self.alerts() == expected:
                return
            if time.monotonic() > deadline:
                assert self.alerts() == expected  # the diff, as pytest shows it
                return


@pytest.fixture(scope="module")
def watch(kube: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watch]:
    w = Watch(kube, tmp_path_factory.mktemp("alert-scenarios")).start()
    try:
        assert w.prom is not None
        prom = w.prom
        wait_for(lambda: len(prom.query("up == 1")) == 2 and prom.query("sum(nws_reconciler_leader) == 1")
                 and prom.query('max(nws_claim_nominal{claim="gpu", resource="nvidia.com/gpu"}) == 32')
                 and prom.query('max(nws_queue_nominal_quota{cluster_queue="prod", flavor="gpu", '
                                'resource="nvidia.com/gpu"}) == 16'), timeout=90)
        yield w
    finally:
        w.stop()


def not_ready(kube: LocalCluster, nodes: tuple[str, ...], ready: str = "False") -> None:
    for node in nodes:
        set_node_status(kube, node, ready)


def test_a_healthy_cluster_after_start_alerts_nothing(watch: Watch) -> None:
    """Finished Jobs, claims governing their flavors, a claim assigning 75% of the cpu on purpose,
    queues whose quota the claims wrote: nothing pending, nothing firing."""
    watch.settle(set())
    assert watch.paged() == set()


def test_a_pool_not_ready_with_a_deployment_on_it(kube: LocalCluster, watch: Watch) -> None:
    """apps goes NotReady under Deployment web: the group is down (its NotReady twin muted for the
    pager) and web's pods are all on unhealthy nodes (its warning twin muted)."""
    not_ready(kube, ("apps-0", "apps-1"))
    try:
        watch.settle({("NodeGroupNotReady", "warning", "apps"), ("NodeGroupDown", "critical", "apps"),
                      ("WorkloadOnUnhealthyNodes", "warning", "web"),
                      ("WorkloadOnUnhealthyNodes", "critical", "web")})
        wait_for(lambda: watch.paged() == {("NodeGroupDown", "critical", "apps"),
                                           ("WorkloadOnUnhealthyNodes", "critical", "web")}, timeout=30)
    finally:
        not_ready(kube, ("apps-0", "apps-1"), "True")
    watch.settle(set())


def test_a_rack_lost_under_a_gang(kube: LocalCluster, watch: Watch) -> None:
    """Rack r1 of train goes NotReady under gang ring (4 members, one per node): the group has
    NotReady nodes, ring's pods are on unhealthy nodes, and its gang is broken. The pager hears of
    the group and the broken gang: that says more than "pods on unhealthy nodes" (muted)."""
    not_ready(kube, TRAIN_NODES[2:])
    try:
        watch.settle({("NodeGroupNotReady", "warning", "train"), ("WorkloadGangBroken", "critical", "ring"),
                      ("WorkloadOnUnhealthyNodes", "warning", "ring"),
                      ("WorkloadOnUnhealthyNodes", "critical", "ring")})
        wait_for(lambda: watch.paged() == {("NodeGroupNotReady", "warning", "train"),
                                           ("WorkloadGangBroken", "critical", "ring")}, timeout=30)
        assert watch.prom is not None
        lost = watch.prom.query('max by (workload, group, domain) (nws_workload_gang_members_lost)')
        assert [(r["metric"]["workload"], r["metric"]["group"], r["metric"]["domain"], r["value"][1])
                for r in lost] == [("ring", "train", "r1", "2")]
    finally:
        not_ready(kube, TRAIN_NODES[2:], "True")
    watch.settle(set())


def test_a_pool_not_ready_under_a_finished_job(kube: LocalCluster, watch: Watch) -> None:
    """batch goes NotReady under Job report, whose pods have all Succeeded: the node group alerts,
    and no workload: a finished pod holds no node."""
    not_ready(kube, ("batch-0", "batch-1"))
    try:
        watch.settle({("NodeGroupNotReady", "warning", "batch"), ("NodeGroupDown", "critical", "batch")})
    finally:
        not_ready(kube, ("batch-0", "batch-1"), "True")
    watch.settle(set())


def test_a_disruption_taint_on_a_node_whose_pods_have_completed(kube: LocalCluster, watch: Watch) -> None:
    """Karpenter taints batch-0, where report's finished pods are: the group is disrupting (info),
    and report is not "on unhealthy nodes"."""
    disrupt(kube, "batch-0")
    try:
        watch.settle({("NodeGroupDisrupting", "info", "batch")})
    finally:
        disrupt(kube, "batch-0", [])
    watch.settle(set())


def test_a_claims_flavor_loses_half_its_nodes_then_all(kube: LocalCluster, watch: Watch) -> None:
    """Half the gpu pool NotReady: the group alerts, and the claim (research's absolute 12 GPUs and
    prod's 50% no longer fit 16) says its assignments exceed the Ready capacity; no quota-drift
    alert says the flavor has capacity in no quota (it shrank), nor that its quota exceeds it (the
    claim governs it). The pager hears of the node group alone. The whole pool: the same, down."""
    try:
        not_ready(kube, GPU_NODES[2:])
        watch.settle({("NodeGroupNotReady", "warning", "gpu"),
                      ("ClusterResourceClaimOverAllocated", "warning", "gpu")}, timeout=60 + SETTLE)
        wait_for(lambda: watch.paged() == {("NodeGroupNotReady", "warning", "gpu")}, timeout=30)
        assert watch.prom is not None
        quota = watch.prom.query('max by (cluster_queue) (nws_queue_nominal_quota{flavor="gpu", '
                                 'resource="nvidia.com/gpu"})')
        assert {r["metric"]["cluster_queue"]: r["value"][1] for r in quota} == {"research": "12", "prod": "4"}
        not_ready(kube, GPU_NODES[:2])
        watch.settle({("NodeGroupNotReady", "warning", "gpu"), ("NodeGroupDown", "critical", "gpu"),
                      ("ClusterResourceClaimOverAllocated", "warning", "gpu")}, timeout=60 + SETTLE)
        wait_for(lambda: watch.paged() == {("NodeGroupDown", "critical", "gpu")}, timeout=30)
    finally:
        not_ready(kube, GPU_NODES, "True")
    watch.settle(set(), timeout=60 + SETTLE)


def test_an_unclaimed_flavor_still_has_its_drift_alerts(kube: LocalCluster, watch: Watch) -> None:
    """The claims take their flavors out of the drift alerts, not the drift alerts away: flavor
    spare (the cpu pool too, no claim) with a queue's quota above its capacity fires
    KueueQuotaExceedsCapacity; lowered to a tenth of it, KueueCapacityUnassigned."""
    resource_flavor(kube, "spare", {"pool": "cpu"})
    try:
        cluster_queue(kube, "spare", {"spare": {"cpu": "20"}})  # the cpu pool has 16
        watch.settle({("KueueQuotaExceedsCapacity", "warning", "spare")})
        cluster_queue(kube, "spare", {"spare": {"cpu": "1600m"}})
        watch.settle({("KueueCapacityUnassigned", "info", "spare")})
    finally:
        ok(kube.request(cell().at(CLUSTER_QUEUES).path(name="spare"), "DELETE"))
        ok(kube.request(cell().at(RESOURCE_FLAVORS).path(name="spare"), "DELETE"))
    watch.settle(set())

