"""Gangs on a real control plane (docs/gangs.md): a KubeNexus-labelled gang under a Deployment and a
JobSet's gang (sized by the real JobSet CRD's object: 2 Jobs x parallelism 2), each with two members
on each of two racks of node pool `train`. The pods' Ready condition is written as the kubelet
writes it. Both gangs are Whole (the GANGS column says 1/1); rack r1 going NotReady breaks both
after --gang-grace, each naming the NodeSummary and the rack where its members were lost, in the
summary and the metrics; the rack back, both are Whole again and the lost series go.
(The in-tree PodGroup's gangs, on the minors that serve it: tests/cluster/test_workload_api.py;
WorkloadGangBroken in real Prometheus: tests/cluster/test_alert_scenarios.py.)"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from demo.workloads import create, deployment_chain, node_summarizer, owner_ref
from kubeindex.model.objects import API_VERSION
from kubeindex.model.resources import PODS, WORKLOAD_SUMMARIES, WORKLOAD_SUMMARIZERS
from localkube.build import JOBSET, ensure_binaries
from localkube.cluster import LocalCluster, Options
from localkube.service import Service, parse, select, wait_for
from tests.kube import create_node, get_object, set_node_status, set_pod_phase, set_pod_ready
from tests.paths import CRDS

pytestmark = pytest.mark.needs(JOBSET)

NS = "gangs"
RACK = "example.com/rack"
KN, KN_MIN = "pod-group.scheduling.kubenexus.io/name", "pod-group.scheduling.kubenexus.io/min-available"
GRACE = 2.0  # --gang-grace, seconds
NODES = {"t-0": "r0", "t-1": "r0", "t-2": "r1", "t-3": "r1"}


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    with LocalCluster(Options(), binaries) as c:
        c.install_crds(CRDS)
        for path in ensure_binaries((JOBSET,)).values():
            c.install_crds(path)
        c.kubectl("create", "namespace", NS)
        node_summarizer(c, "pool", "pool")
        create(c, WORKLOAD_SUMMARIZERS.path(), {
            "apiVersion": API_VERSION, "kind": "WorkloadSummarizer", "metadata": {"name": "gangs"},
            "spec": {"workloadTypes": [{"group": "apps", "kind": "Deployment"},
                                       {"group": "jobset.x-k8s.io", "kind": "JobSet"}],
                     "gangs": {"kinds": ["JobSet"], "podLabels": [{"labelKey": KN, "minAvailableLabelKey": KN_MIN}]}}})
        for name, rack in NODES.items():
            create_node(c, name, {"pool": "train", RACK: rack})
        yield c


def running(kube: LocalCluster, name: str, owner: dict, labels: dict[str, str], node: str) -> None:
    """A pod bound to ``node``, Running and Ready as its kubelet would report it."""
    create(kube, PODS.path(NS), {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels, "ownerReferences": [owner_ref(owner)]},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}})
    set_pod_phase(kube, NS, name, "Running")
    set_pod_ready(kube, NS, name)


def jobset(kube: LocalCluster, name: str) -> dict:
    """A JobSet of 2 Jobs of parallelism 2, and its Jobs (suspended: no controller runs here)."""
    job = {"parallelism": 2, "completions": 2, "template": {"spec": {"restartPolicy": "Never",
                                                                     "containers": [{"name": "c", "image": "x"}]}}}
    js = create(kube, f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets", {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name, "namespace": NS},
        "spec": {"suspend": True, "replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": job}}]}})
    for i in range(2):
        create(kube, f"/apis/batch/v1/namespaces/{NS}/jobs", {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"{name}-workers-{i}", "namespace": NS, "ownerReferences": [owner_ref(js)]},
            "spec": {**job, "suspend": True}})
    return js


def gangs_of(kube: LocalCluster, name: str) -> dict:
    return ((get_object(kube, WORKLOAD_SUMMARIES.path(NS, name)) or {}).get("status") or {})


def whole(kube: LocalCluster, summary: str) -> bool:
    return gangs_of(kube, summary).get("gangsWhole") == "1/1"


def broken_gangs(kube: LocalCluster, summary: str, n: int) -> bool:
    return gangs_of(kube, summary).get("gangs", {}).get("broken") == n


@pytest.fixture(scope="module")
def service(kube: LocalCluster) -> Iterator[Service]:
    deploy, rs = deployment_chain(kube, NS, "kn")
    del deploy
    for i, node in enumerate(NODES):
        running(kube, f"kn-{i}", rs, {KN: "kn-gang", KN_MIN: "4"}, node)
    jobset(kube, "js")
    for i, node in enumerate(NODES):
        job = get_object(kube, f"/apis/batch/v1/namespaces/{NS}/jobs/js-workers-{i // 2}")
        assert job is not None
        running(kube, f"js-workers-{i // 2}-{i % 2}", job, {"jobset.sigs.k8s.io/jobset-name": "js"}, node)
    svc = Service(kube, ("--write-debounce=0.2", f"--gang-grace={GRACE}", f"--gang-topology-label={RACK}")).start()
    yield svc
    svc.stop()


def test_gangs_break_with_their_rack_naming_pool_and_rack_and_heal(kube: LocalCluster, service: Service) -> None:
    workloads = {"kn": "kn-gang", "js": "js"}  # summary -> its gang's name
    for summary in workloads:
        wait_for(partial(whole, kube, summary), timeout=30)
    for summary, gang in workloads.items():
        assert gangs_of(kube, summary)["worstGangs"] == [
            {"name": gang, "state": "Whole", "required": 4, "scheduled": 4, "ready": 4}]
    table = kube.kubectl("get", "workloadsummaries", "-n", NS).stdout.splitlines()
    column = table[0].index("GANGS")  # (by position: an empty AT_RISK cell is blank)
    assert {line.split()[0]: line[column:].split()[0] for line in table[1:]} == {"kn": "1/1", "js": "1/1"}, table
    samples = parse(service.get("/metrics")[1])
    watches = {dict(k)["resource"] for k in select(samples, "nws_watch_objects")}
    assert "jobsets.jobset.x-k8s.io.gangs" in watches, watches  # the JobSets' sizes, read in full beside their metadata

    start = time.monotonic()
    for node, rack in NODES.items():
        if rack == "r1":
            set_node_status(kube, node, "False")
    lost = [{"nodeSummary": "pool-train", "domain": "r1", "members": 2}]
    for summary, gang in workloads.items():
        wait_for(partial(broken_gangs, kube, summary, 1), timeout=30)
        assert gangs_of(kube, summary)["worstGangs"] == [
            {"name": gang, "state": "Broken", "required": 4, "scheduled": 4, "ready": 2, "lost": lost}]
        assert gangs_of(kube, summary)["gangsWhole"] == "0/1"
    assert time.monotonic() - start >= GRACE  # not before the grace: a member's restart is no break

    def lost_series() -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for labels, n in select(parse(service.get("/metrics")[1]), "nws_workload_gang_members_lost",
                                namespace=NS).items():
            d = dict(labels)
            out.setdefault(d["workload"], {})[f"{d['summarizer']}/{d['group']}/{d['domain']}"] = n
        return out

    assert lost_series() == {"kn": {"pool/train/r1": 2}, "js": {"pool/train/r1": 2}}
    broken = select(parse(service.get("/metrics")[1]), "nws_workload_gangs", namespace=NS, state="Broken")
    assert {dict(k)["workload"]: v for k, v in broken.items()} == {"kn": 1, "js": 1}

    for node, rack in NODES.items():
        if rack == "r1":
            set_node_status(kube, node, "True")
    for summary in workloads:
        wait_for(partial(whole, kube, summary), timeout=30)
        assert "lost" not in json.dumps(gangs_of(kube, summary)["worstGangs"])
    wait_for(lambda: lost_series() == {}, timeout=10)
