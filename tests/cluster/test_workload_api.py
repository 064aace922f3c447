"""The in-tree Workload API as a root workload, on the Kubernetes minors that serve it
(scheduling.k8s.io/v1beta1: 1.37 and 1.38.0-beta.0, with the GenericWorkload gate and the group
version on; make test-workload-api): a Workload and PodGroup created directly, and a Job compiled
into a Workload and a PodGroup as the Job controller shapes them (pkg/controller/job's
job_scheduling_manager: the Workload and the PodGroup controlled by the Job, the PodGroup naming
its Workload), with their pods on KWOK nodes. The service runs as its ServiceAccount under the
shipped ClusterRole, so the grants it needs here are proven too (the audit test runs on the pinned
minor, which does not serve the API).

And the PodGroup's gang (docs/gangs.md): a Workload's PodGroup of minCount 4, its members on two
racks of KWOK nodes, is Whole once KWOK runs them; the rack whose KWOK "kubelet" stops (its nodes
no longer KWOK's, then NotReady) breaks it after the grace, naming the pool and the rack."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from demo.workloads import create, kwok_node, node_summarizer, owner_ref, workload_summarizer
from kubeindex.model.resources import POD_GROUPS, PODS, SCHEDULING_WORKLOADS, WORKLOAD_SUMMARIES
from localkube.build import core, ensure_binaries
from localkube.cluster import WORKLOAD_API_MINORS, LocalCluster, Options
from localkube.service import Service, parse, select, wait_for
from tests.kube import get_object, set_node_status, token_kubeconfig
from tests.paths import CRDS, ROOT

pytestmark = pytest.mark.workload_api  # make test-workload-api; make test leaves them out

DEPLOY = ROOT / "deploy"
NS = "gangs"
SA_NS = "node-workload-summary"
RACK = "example.com/rack"
GRACE = 2.0  # --gang-grace


@pytest.fixture(scope="module", params=WORKLOAD_API_MINORS)
def kube(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A control plane of the minor serving the in-tree Workload API, KWOK, our CRDs, the shipped
    RBAC, NodeSummarizer `pool` and WorkloadSummarizer `gangs` (Workload and Job)."""
    binaries = ensure_binaries(core(request.param))
    with LocalCluster(Options(workload_api=True, kwok=True), binaries) as c:
        c.install_crds(CRDS)
        c.kubectl("apply", "-f", str(DEPLOY / "base" / "namespace.yaml"))
        c.kubectl("apply", "-n", SA_NS, "-f", str(DEPLOY / "base" / "rbac.yaml"))
        c.kubectl("create", "namespace", NS)
        node_summarizer(c, "pool", "pool")
        workload_summarizer(c, "gangs", [("scheduling.k8s.io", "Workload"), ("batch", "Job")])
        for i in range(4):
            kwok_node(c, f"gpu-{i}", "gpu", {"cpu": "8", "memory": "32Gi", "pods": "110"})
        for i in range(4):
            kwok_node(c, f"rack-{i}", "train", {"cpu": "8", "memory": "32Gi", "pods": "110"},
                      {"pool": "train", RACK: f"r{i // 2}"})
        yield c


def gang(min_count: int) -> dict:
    return {"gang": {"minCount": min_count}}


def workload(kube: LocalCluster, name: str, min_count: int, owner: dict | None = None) -> dict:
    meta = {"name": name, "namespace": NS, **({"ownerReferences": [owner_ref(owner)]} if owner else {})}
    spec: dict[str, object] = {"podGroupTemplates": [{"name": "workers", "schedulingPolicy": gang(min_count)}]}
    if owner:  # as the Job controller writes it
        spec["controllerRef"] = {"apiGroup": "batch", "kind": "Job", "name": owner["metadata"]["name"]}
    return create(kube, SCHEDULING_WORKLOADS.path(NS), {"apiVersion": SCHEDULING_WORKLOADS.api_version,
                                                        "kind": "Workload", "metadata": meta, "spec": spec})


def pod_group(kube: LocalCluster, name: str, of: dict, min_count: int, owner: dict | None = None) -> dict:
    refs = [owner_ref(owner)] if owner else []
    refs.append({**owner_ref(of), "controller": False})
    return create(kube, POD_GROUPS.path(NS), {
        "apiVersion": POD_GROUPS.api_version, "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NS, "ownerReferences": refs},
        "spec": {"workloadRef": {"workloadName": of["metadata"]["name"], "templateName": "workers"},
                 "schedulingPolicy": gang(min_count)}})


def member(kube: LocalCluster, name: str, group: str, node: str, owner: dict | None = None) -> dict:
    meta = {"name": name, "namespace": NS, **({"ownerReferences": [owner_ref(owner)]} if owner else {})}
    return create(kube, PODS.path(NS), {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": node, "schedulingGroup": {"podGroupName": group},
                 "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}})


def summary(kube: LocalCluster, name: str) -> dict:
    return get_object(kube, WORKLOAD_SUMMARIES.path(NS, name)) or {}


@pytest.fixture(scope="module")
def service(kube: LocalCluster) -> Iterator[Service]:
    sa = token_kubeconfig(kube, "node-workload-summary", SA_NS, "sa")
    svc = Service(kube, (f"--kubeconfig={sa}", f"--lease-namespace={SA_NS}", "--write-debounce=0.2",
                         f"--gang-grace={GRACE}", f"--gang-topology-label={RACK}")).start()
    yield svc
    svc.stop()


def test_pods_in_pod_groups_count_for_their_workload_and_the_topmost_kind_stays_the_rule(
        kube: LocalCluster, service: Service) -> None:
    # Created directly: a Workload, its PodGroup, and three bare pods naming the group.
    direct = workload(kube, "direct", 3)
    pod_group(kube, "direct-workers", direct, 3)
    for i in range(3):
        member(kube, f"direct-{i}", "direct-workers", f"gpu-{i}")
    # Compiled from a Job: the Workload and the PodGroup are the Job's; its pods are too, and name the group.
    job = create(kube, f"/apis/batch/v1/namespaces/{NS}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": NS},
        "spec": {"suspend": True, "parallelism": 2, "completions": 2, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}})
    compiled = workload(kube, "train-wl", 2, owner=job)
    pod_group(kube, "train-workers", compiled, 2, owner=job)
    for i in range(2):
        member(kube, f"train-{i}", "train-workers", f"gpu-{i}", owner=job)

    # One summary each: the directly created Workload, and the Job (topmost above its Workload).
    wait_for(lambda: summary(kube, "direct").get("status", {}).get("podCount") == 3, timeout=30)
    wait_for(lambda: summary(kube, "train").get("status", {}).get("podCount") == 2, timeout=30)
    direct_summary, train_summary = summary(kube, "direct"), summary(kube, "train")
    assert direct_summary["status"]["longType"] == "workload.scheduling.k8s.io/v1beta1", direct_summary["status"]
    assert train_summary["status"]["longType"] == "job.batch/v1", train_summary["status"]
    assert summary(kube, "train-wl") == {}  # below the Job: not a root of its own
    # The summary is the root's: deleting the Workload deletes it (its ownerReference is the Workload's UID).
    assert direct_summary["metadata"]["ownerReferences"][0]["uid"] == direct["metadata"]["uid"]
    def started() -> dict[str, float]:  # KWOK starts the pods on its nodes (and completes a Job's)
        pods = select(parse(service.get("/metrics")[1]), "nws_workload_pods", namespace=NS)
        out: dict[str, float] = {}
        for labels, count in pods.items():
            if dict(labels)["phase"] != "Pending":
                out[dict(labels)["workload"]] = out.get(dict(labels)["workload"], 0) + count
        return out

    want = {"direct": 3, "train": 2}
    try:
        wait_for(lambda: started() == want, timeout=30)
    except AssertionError:
        raise AssertionError(f"pods started: {started()}, not {want}") from None
    samples = parse(service.get("/metrics")[1])
    # Watched as the shipped RBAC allows: PodGroups in full, Workloads' metadata; nothing denied.
    watches = {dict(k)["resource"] for k in select(samples, "nws_watch_objects")}
    assert {POD_GROUPS.name, SCHEDULING_WORKLOADS.name} <= watches, watches
    log = service.log_text()
    assert "forbidden" not in log.lower() and "served only at" not in log, log[-3000:]


def test_a_pod_groups_gang_is_whole_then_broken_by_its_rack_naming_pool_and_rack(
        kube: LocalCluster, service: Service) -> None:
    # The summarizer asks for PodGroup gangs now: the service reads the pods again for them.
    kube.kubectl("patch", "workloadsummarizer", "gangs", "--type=merge", "-p",
                 '{"spec": {"gangs": {"kinds": ["PodGroup"]}}}')
    ring = workload(kube, "ring", 4)
    pod_group(kube, "ring-workers", ring, 4)
    for i in range(4):
        member(kube, f"ring-{i}", "ring-workers", f"rack-{i}")

    def worst() -> list[dict]:
        return summary(kube, "ring").get("status", {}).get("worstGangs", [])

    wait_for(lambda: worst() == [{"name": "ring-workers", "state": "Whole", "required": 4, "scheduled": 4,
                                  "ready": 4}], timeout=60)  # KWOK runs them, Ready
    assert summary(kube, "ring")["status"]["gangsWhole"] == "1/1"
    for i in (2, 3):  # rack r1's kubelets stop: KWOK lets go of the nodes, which go NotReady
        kube.kubectl("annotate", "node", f"rack-{i}", "kwok.x-k8s.io/node-")
        set_node_status(kube, f"rack-{i}", "False")
    broken = [{"name": "ring-workers", "state": "Broken", "required": 4, "scheduled": 4, "ready": 2,
               "lost": [{"nodeSummary": "pool-train", "domain": "r1", "members": 2}]}]
    try:
        wait_for(lambda: worst() == broken, timeout=30)
    except AssertionError:
        nodes = kube.kubectl("get", "nodes", "-l", "pool=train", "-o", "wide").stdout
        raise AssertionError(f"worstGangs: {worst()}\n{nodes}") from None
    lost = select(parse(service.get("/metrics")[1]), "nws_workload_gang_members_lost", namespace=NS,
                  workload="ring")
    assert {(dict(k)["group"], dict(k)["domain"]): v for k, v in lost.items()} == {("train", "r1"): 2}
