"""The reconciler on a full local control plane (controller-manager, scheduler, KWOK nodes, the JobSet
and LeaderWorkerSet controllers)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from demo.workloads import (
    jobset_chain,
    kwok_node,
    leaderworkerset_chain,
    node_summarizer,
    ok,
    workload_summarizer,
)
from kubeindex.model.resources import NODE_SUMMARIES, NODE_SUMMARIZERS, NODES, WORKLOAD_SUMMARIES
from localkube.build import JOBSET_CONTROLLER, KUBERNETES_CONTROLLERS, KWOK, LWS_CONTROLLER
from localkube.cluster import LocalCluster, Options
from localkube.controllers import JOBSET_PROJECT, LWS_PROJECT, Controller
from localkube.service import Samples, Service, select, value, wait_for
from tests.kube import delete, found, get_object, set_node_labels, settled, writes
from tests.paths import CRDS, EXAMPLES

pytestmark = pytest.mark.needs(KUBERNETES_CONTROLLERS, KWOK, JOBSET_CONTROLLER, LWS_CONTROLLER)

POOL = "cloud.google.com/gke-nodepool"
NS = "ml"
FAST_LEASE = ("--lease-duration=6", "--renew-deadline=4", "--retry-period=1")


def zone_node(cluster: LocalCluster, name: str, pool: str, allocatable: dict[str, str]) -> None:
    kwok_node(cluster, name, pool, allocatable, {"topology.kubernetes.io/zone": f"zone-{name[-1]}"})


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    with LocalCluster(Options(controller_manager=True, scheduler=True, kwok=True), binaries) as c:
        c.install_crds(CRDS)
        for project in (JOBSET_PROJECT, LWS_PROJECT):
            Controller(c, project).start()  # the real CRDs, webhooks and controllers; stopped with c
        cpu = {"cpu": "16", "memory": "64Gi", "pods": "110"}
        for i in range(3):
            zone_node(c, f"cpu-{i}", "cpu", cpu)
        for i in range(2):
            zone_node(c, f"gpu-{i}", "gpu", cpu | {"nvidia.com/gpu": "8"})
        zone_node(c, "tpu-0", "tpu", cpu | {"google.com/tpu": "4"})
        c.kubectl("apply", "-f", str(EXAMPLES))
        workload_summarizer(c, "core", [("apps", "StatefulSet"), ("batch", "Job")])
        c.kubectl("create", "namespace", NS)
        wait_for(lambda: "False" not in c.kubectl("get", "nodes", "-o",
                                                  "jsonpath={.items[*].status.conditions[?(@.type=='Ready')].status}").stdout)
        yield c


@pytest.fixture(scope="module")
def service(kube: LocalCluster) -> Iterator[Service]:
    svc = Service(kube, ("--identity=replica-a", *FAST_LEASE)).start()
    yield svc
    svc.stop()


def get_json(kube: LocalCluster, *args: str) -> dict:
    return json.loads(kube.kubectl("get", *args, "-o", "json").stdout)


def table(kube: LocalCluster, *args: str) -> list[list[str]]:
    return [line.split() for line in kube.kubectl("get", *args).stdout.splitlines()]


def summaries(kube: LocalCluster) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in get_json(kube, "nodesummaries")["items"]}


def workload(kube: LocalCluster, name: str, namespace: str = NS) -> dict[str, Any] | None:
    return get_object(kube, WORKLOAD_SUMMARIES.path(namespace, name))


def test_design_doc_workflow(kube: LocalCluster, service: Service) -> None:
    kube.kubectl("create", "deployment", "nginx", "--image=nginx", "--replicas=3", "-n", NS)
    kube.kubectl("rollout", "status", "deployment/nginx", "-n", NS, "--timeout=60s", timeout=90)
    wait_for(lambda: (workload(kube, "nginx") or {}).get("status", {}).get("podCount") == 3, timeout=10)
    header, row = table(kube, "workloads", "-n", NS)[:2]
    assert header[:4] == ["NAME", "N_PODS", "SHORT_TYPE", "LONG_TYPE"]
    assert row[:4] == ["nginx", "3", "deploy", "deployment.apps/v1"]
    # nodeSummaryRefs count DISTINCT nodes per group, as the scheduler actually placed the pods
    # (the summary may trail the binding by the write debounce).
    wait_for(lambda: {r["name"]: r["nodeCount"]
                      for r in found(workload(kube, "nginx"))["status"].get("nodeSummaryRefs", [])}
             == _expected_refs(kube, "app=nginx"), timeout=10)
    owner = found(workload(kube, "nginx"))["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Deployment", "nginx")

    rows = {r[0]: r for r in table(kube, "nodesummaries")[1:]}
    assert rows["gke-nodepool-cpu"][1:4] == ["3", "3", "0"]  # NODES READY NOT-READY
    assert rows["gke-nodepool-gpu"][1:4] == ["2", "2", "0"] and rows["gke-nodepool-gpu"][6] == "16"  # GPUs
    s = summaries(kube)["gke-nodepool-tpu"]
    assert s["spec"]["selector"] == {"matchLabels": {POOL: "tpu"}}
    assert s["status"]["allocatable"]["google.com/tpu"] == "4" and s["status"]["nodeNamesPrefix"] == "tpu-0*"
    assert s["metadata"]["ownerReferences"][0]["kind"] == "NodeSummarizer"
    status = get_json(kube, "nodesummarizer", "gke-nodepool")["status"]
    assert status["groupCount"] == 3 and status["conditions"][0]["status"] == "True"


def _expected_refs(kube: LocalCluster, selector: str) -> dict[str, int]:
    """Distinct nodes per NodeSummary, from where the controllers' pods actually landed and still
    are: a finished pod (KWOK completes a Job's) holds no node."""
    by_pool: dict[str, set[str]] = {}
    for pod in get_json(kube, "pods", "-n", NS, "-l", selector)["items"]:
        node = pod["spec"].get("nodeName")
        if node and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            by_pool.setdefault(f"gke-nodepool-{node.split('-')[0]}", set()).add(node)
    return {name: len(nodes) for name, nodes in by_pool.items()}


def _refs(kube: LocalCluster, name: str) -> dict[str, int]:
    """A WorkloadSummary's distinct nodes per NodeSummary (none: no refs)."""
    return {r["name"]: r["nodeCount"] for r in found(workload(kube, name))["status"].get("nodeSummaryRefs", [])}


def _placed_as_the_pods_are(kube: LocalCluster, name: str) -> bool:
    return _refs(kube, name) == _expected_refs(kube, f"chain={name}")


def test_jobset_and_leaderworkerset_chains(kube: LocalCluster, service: Service) -> None:
    """Real controllers make the pods: JobSet -> Jobs -> Pods (the JobSet and job controllers), and
    LWS -> leader StatefulSet -> leader Pod -> worker StatefulSet -> worker Pods (the LWS and
    StatefulSet controllers)."""
    jobset_chain(kube, NS, "train", jobs=1, parallelism=4, labels={"chain": "train"})
    leaderworkerset_chain(kube, NS, "llm", workers=2, labels={"chain": "llm"})

    wait_for(lambda: (workload(kube, "llm") or {}).get("status", {}).get("podCount") == 3, timeout=30)
    wait_for(lambda: (workload(kube, "train") or {}).get("status", {}).get("podCount") == 4, timeout=30)
    for name in ("train", "llm"):
        wait_for(partial(_placed_as_the_pods_are, kube, name), timeout=10)
    train = found(workload(kube, "train"))["status"]
    assert (train["shortType"], train["longType"]) == ("js", "jobset.jobset.x-k8s.io/v1alpha2")
    llm = found(workload(kube, "llm"))["status"]
    assert (llm["shortType"], llm["longType"]) == ("lws", "leaderworkerset.leaderworkerset.x-k8s.io/v1")
    # The StatefulSets and the Job are configured too, but not roots: no summaries of their own.
    assert workload(kube, "llm-0") is None and workload(kube, "train-workers-0") is None
    placement = found(workload(kube, "llm"))["status"]["placement"]
    assert placement in kube.kubectl("get", "workloads.ux", "-n", NS, "-o", "wide").stdout


def test_node_moves_summaries_follow_and_go(kube: LocalCluster, service: Service) -> None:
    set_node_labels(kube, "gpu-1", {POOL: "tpu"})
    wait_for(lambda: summaries(kube)["gke-nodepool-tpu"]["status"]["nodeCount"] == 2, timeout=10)
    wait_for(lambda: summaries(kube)["gke-nodepool-gpu"]["status"]["nodeCount"] == 1, timeout=10)  # its own write
    delete(kube, NODES.path(name="gpu-0"))  # the last node of the gpu group
    wait_for(lambda: "gke-nodepool-gpu" not in summaries(kube), timeout=10)
    # A summarizer created and deleted takes its summaries with it.
    node_summarizer(kube, "zone", "topology.kubernetes.io/zone")
    wait_for(lambda: len([n for n in summaries(kube) if n.startswith("zone-")]) == 3, timeout=10)
    delete(kube, NODE_SUMMARIZERS.path(name="zone"))
    wait_for(lambda: not [n for n in summaries(kube) if n.startswith("zone-")], timeout=15)


def test_user_edits_are_restored(kube: LocalCluster, service: Service) -> None:
    ok(kube.request(NODE_SUMMARIES.path(name="gke-nodepool-cpu", subresource="status"), "PATCH",
                    {"status": {"nodeCount": 99}}, content_type="application/merge-patch+json"))
    wait_for(lambda: summaries(kube)["gke-nodepool-cpu"]["status"]["nodeCount"] == 3, timeout=10)
    delete(kube, WORKLOAD_SUMMARIES.path(NS, "nginx"))
    wait_for(lambda: workload(kube, "nginx") is not None, timeout=10)


def test_the_watches_of_our_summaries_are_in_the_watch_metrics(kube: LocalCluster, service: Service) -> None:
    """The reconciler's watches of its own summaries are the sources' like every other, so they show
    in nws_watch_* (they used to run beside them, unseen)."""
    def modified(samples: Samples) -> float:
        return value(samples, "nws_watch_events_total", resource="own-nodesummaries", type="MODIFIED") or 0

    wait_for(lambda: "gke-nodepool-cpu" in summaries(kube), timeout=20)
    before = modified(service.scrape())
    ok(kube.request(NODE_SUMMARIES.path(name="gke-nodepool-cpu", subresource="status"), "PATCH",
                    {"status": {"nodeCount": 99}}, content_type="application/merge-patch+json"))
    wait_for(lambda: modified(service.scrape()) >= before + 2, timeout=10)  # the edit, and our write back
    s = service.scrape()
    for plural in ("nodesummaries", "workloadsummaries"):
        assert value(s, "nws_watch_synced", resource=f"own-{plural}") == 1
        assert value(s, "nws_watch_relists_total", resource=f"own-{plural}") is not None
    wait_for(lambda: value(service.scrape(), "nws_watch_objects", resource="own-nodesummaries")
             == len(summaries(kube)), timeout=10)


def test_our_own_writes_coming_back_queue_nothing(kube: LocalCluster, service: Service) -> None:
    """The echo of a write on our own watch, at the resourceVersion its answer gave, is the object
    as we decided it: it queues no key. Another manager's edit queues one; our write that takes it
    back, none."""
    def counts() -> tuple[float, float]:
        s = service.scrape()
        return (value(s, "nws_workqueue_adds_total", name="summaries") or 0,
                value(s, "nws_watch_events_total", resource="own-nodesummaries", type="MODIFIED") or 0)

    settled(service)
    adds, events = counts()
    ok(kube.request(NODE_SUMMARIES.path(name="gke-nodepool-cpu", subresource="status"), "PATCH",
                    {"status": {"nodeCount": 99}}, content_type="application/merge-patch+json"))
    wait_for(lambda: counts()[1] >= events + 2, timeout=10)  # the edit, and our write back
    settled(service)
    assert summaries(kube)["gke-nodepool-cpu"]["status"]["nodeCount"] == 3
    assert counts() == (adds + 1, events + 2)


def test_no_writes_when_quiet(service: Service) -> None:
    """Once the earlier tests' changes are written, nothing more is: the service settles (no write
    for 1.5 s, within 30 s) and then writes nothing for 5 s, several times its debounce and its
    summarizer interval (a status rewritten on every evaluation shows within one)."""
    before = settled(service)
    time.sleep(5)
    assert writes(service) == before


def test_two_replicas_one_writer_and_failover(kube: LocalCluster, service: Service) -> None:
    standby = Service(kube, ("--identity=replica-b", *FAST_LEASE)).start()
    try:
        def leader(svc: Service) -> float | None:
            return select(svc.scrape(), "nws_reconciler_leader").get(frozenset())

        assert leader(service) == 1 and leader(standby) == 0
        kube.kubectl("scale", "deployment/nginx", "-n", NS, "--replicas=4")
        wait_for(lambda: (workload(kube, "nginx") or {}).get("status", {}).get("podCount") == 4, timeout=20)
        assert writes(standby) == 0  # the standby watched everything and wrote nothing
        service.kill()  # no graceful release
        killed = time.monotonic()
        took = wait_for(lambda: leader(standby) == 1, timeout=20)
        print(f"standby took over {took:.1f}s after the leader was killed")
        # The lease duration and 2 retry periods, with slack for a loaded machine: a standby that waited
        # for a second lease duration (12 s and more) still fails.
        assert time.monotonic() - killed <= 6 + 2 * 1 + 3
        kube.kubectl("scale", "deployment/nginx", "-n", NS, "--replicas=5")
        wait_for(lambda: (workload(kube, "nginx") or {}).get("status", {}).get("podCount") == 5, timeout=20)
        assert writes(standby) > 0
        holder = get_json(kube, "lease", "node-workload-summary", "-n", "default")["spec"]["holderIdentity"]
        assert holder == "replica-b"
        assert summaries(kube)["gke-nodepool-cpu"]["status"]["nodeCount"] == 3
    finally:
        standby.stop()
