"""The real JobSet and LeaderWorkerSet controllers make the owner chains, and the service sees them:
every pod of a JobSet rolls up to the JobSet (Pod -> Job -> JobSet), every leader and worker pod of
a LeaderWorkerSet to the LeaderWorkerSet (Pod -> StatefulSet -> leader Pod -> StatefulSet -> LWS),
while the controllers scale and delete them under two replicas of the service."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from demo.workloads import jobset_chain, kwok_node, leaderworkerset_chain, ok, workload_summarizer
from kubeindex.model.resources import WORKLOAD_SUMMARIES
from localkube.build import JOBSET_CONTROLLER, KUBERNETES_CONTROLLERS, KWOK, LWS_CONTROLLER
from localkube.cluster import LocalCluster, Options
from localkube.controllers import JOBSET_PROJECT, LWS_PROJECT, Controller
from localkube.service import Service, select, wait_for
from tests.kube import found, get_object
from tests.paths import CRDS, EXAMPLES

pytestmark = pytest.mark.needs(KUBERNETES_CONTROLLERS, KWOK, JOBSET_CONTROLLER, LWS_CONTROLLER)

NS = "ml"
FAST_LEASE = ("--lease-duration=6", "--renew-deadline=4", "--retry-period=1")
JS = "jobset.sigs.k8s.io"
LWS = "leaderworkerset.sigs.k8s.io"


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    with LocalCluster(Options(controller_manager=True, scheduler=True, kwok=True), binaries) as c:
        c.install_crds(CRDS)
        for project in (JOBSET_PROJECT, LWS_PROJECT):
            Controller(c, project).start()  # stopped with the cluster
        for i in range(4):
            kwok_node(c, f"gpu-{i}", "gpu", {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"})
        c.kubectl("apply", "-f", str(EXAMPLES))  # JobSet, LeaderWorkerSet and Deployment as workloads
        # Job and StatefulSet are workload kinds too, so a pod whose chain were cut at its Job or
        # StatefulSet would roll up to that instead of the JobSet or LeaderWorkerSet.
        workload_summarizer(c, "core", [("apps", "StatefulSet"), ("batch", "Job")])
        c.kubectl("create", "namespace", NS)
        yield c


@pytest.fixture(scope="module")
def service(kube: LocalCluster) -> Iterator[Service]:
    svc = Service(kube, ("--identity=replica-a", *FAST_LEASE)).start()
    yield svc
    svc.stop()


def get(kube: LocalCluster, *args: str) -> dict:
    return json.loads(kube.kubectl("get", *args, "-n", NS, "-o", "json").stdout)


def summary(kube: LocalCluster, name: str) -> dict[str, Any] | None:
    return get_object(kube, WORKLOAD_SUMMARIES.path(NS, name))


def pod_count(kube: LocalCluster, name: str) -> int | None:
    return ((summary(kube, name) or {}).get("status") or {}).get("podCount")


def summaries(kube: LocalCluster) -> dict[str, str]:
    """Summary name -> longType, for every WorkloadSummary in the namespace."""
    items = get(kube, "workloadsummaries.ux")["items"]
    return {s["metadata"]["name"]: (s.get("status") or {}).get("longType", "") for s in items}


def exported_pods(svc: Service, kind: str) -> dict[str, float]:
    """Pods per workload of ``kind`` on ``svc``'s /metrics, all phases summed."""
    out: dict[str, float] = {}
    for labels, v in select(svc.scrape(), "nws_workload_pods", namespace=NS, kind=kind).items():
        name = dict(labels)["workload"]
        out[name] = out.get(name, 0) + v
    return out


def controller_of(obj: dict) -> dict:
    [ref] = [r for r in obj["metadata"].get("ownerReferences", []) if r.get("controller")]
    return ref


def test_jobset_pods_roll_up_to_the_jobset(kube: LocalCluster, service: Service) -> None:
    js = jobset_chain(kube, NS, "train", jobs=2, parallelism=3)
    wait_for(lambda: len(get(kube, "pods", "-l", f"{JS}/jobset-name=train")["items"]) == 6, timeout=60)

    # The chain as the JobSet controller made it (constructJob in pkg/controllers/jobset_controller.go).
    jobs = {j["metadata"]["name"]: j for j in get(kube, "jobs", "-l", f"{JS}/jobset-name=train")["items"]}
    assert sorted(jobs) == ["train-workers-0", "train-workers-1"]
    for i, job in enumerate(jobs[f"train-workers-{n}"] for n in range(2)):
        ref = controller_of(job)
        assert (ref["apiVersion"], ref["kind"], ref["name"], ref["uid"]) == (
            "jobset.x-k8s.io/v1alpha2", "JobSet", "train", js["metadata"]["uid"])
        assert ref["blockOwnerDeletion"] is True
        labels = job["metadata"]["labels"]
        assert (labels[f"{JS}/replicatedjob-name"], labels[f"{JS}/job-index"]) == ("workers", str(i))
    for pod in get(kube, "pods", "-l", f"{JS}/jobset-name=train")["items"]:
        ref = controller_of(pod)
        assert ref["kind"] == "Job" and ref["name"] in jobs

    # Six pods, one WorkloadSummary, for the JobSet (not for its Jobs, though Job is configured).
    wait_for(lambda: pod_count(kube, "train") == 6, timeout=30)
    status = found(summary(kube, "train"))["status"]
    assert (status["shortType"], status["longType"]) == ("js", "jobset.jobset.x-k8s.io/v1alpha2")
    owner = found(summary(kube, "train"))["metadata"]["ownerReferences"][0]
    assert (owner["apiVersion"], owner["kind"], owner["uid"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet",
                                                                 js["metadata"]["uid"])
    assert not {"train-workers-0", "train-workers-1"} & set(summaries(kube))
    assert exported_pods(service, "JobSet") == {"train": 6}
    assert exported_pods(service, "Job") == {}


def test_leaderworkerset_pods_roll_up_through_the_leader_pod(kube: LocalCluster, service: Service) -> None:
    lws = leaderworkerset_chain(kube, NS, "llm", workers=2, replicas=2)  # 2 groups of 1 leader + 2 workers
    wait_for(lambda: len(get(kube, "pods", "-l", f"{LWS}/name=llm")["items"]) == 6, timeout=60)

    # The chain as the LWS controller made it: the leader StatefulSet named after the LWS
    # (LeaderWorkerSetReconciler), each leader pod owning its group's worker StatefulSet
    # (PodReconciler, constructWorkerStatefulSetApplyConfiguration), workers numbered from 1.
    pods = {p["metadata"]["name"]: p for p in get(kube, "pods", "-l", f"{LWS}/name=llm")["items"]}
    assert sorted(pods) == ["llm-0", "llm-0-1", "llm-0-2", "llm-1", "llm-1-1", "llm-1-2"]
    sets = {s["metadata"]["name"]: s for s in get(kube, "statefulsets", "-l", f"{LWS}/name=llm")["items"]}
    assert sorted(sets) == ["llm", "llm-0", "llm-1"]
    leader_set = controller_of(sets["llm"])
    assert (leader_set["kind"], leader_set["name"], leader_set["uid"]) == ("LeaderWorkerSet", "llm",
                                                                          lws["metadata"]["uid"])
    for group in ("0", "1"):
        leader = pods[f"llm-{group}"]
        assert controller_of(leader)["uid"] == sets["llm"]["metadata"]["uid"]
        assert leader["metadata"]["labels"][f"{LWS}/worker-index"] == "0"
        assert leader["metadata"]["labels"][f"{LWS}/group-index"] == group
        workers_set = controller_of(sets[f"llm-{group}"])
        assert (workers_set["kind"], workers_set["name"], workers_set["uid"]) == (
            "Pod", f"llm-{group}", leader["metadata"]["uid"])
        for n in ("1", "2"):
            worker = pods[f"llm-{group}-{n}"]
            assert controller_of(worker)["uid"] == sets[f"llm-{group}"]["metadata"]["uid"]
            labels = worker["metadata"]["labels"]
            assert (labels[f"{LWS}/group-index"], labels[f"{LWS}/worker-index"]) == (group, n)
            assert labels[f"{LWS}/group-key"] == leader["metadata"]["labels"][f"{LWS}/group-key"]

    # All six pods count for the LWS: the index follows worker Pod -> worker StatefulSet -> leader
    # Pod -> leader StatefulSet -> LeaderWorkerSet. Were it to stop at a StatefulSet (a configured
    # kind here), the workers would make summaries llm-0 and llm-1 and the LWS would count 2.
    wait_for(lambda: pod_count(kube, "llm") == 6, timeout=30)
    assert found(summary(kube, "llm"))["status"]["longType"] == "leaderworkerset.leaderworkerset.x-k8s.io/v1"
    assert not {"llm-0", "llm-1"} & set(summaries(kube))
    wait_for(lambda: exported_pods(service, "LeaderWorkerSet") == {"llm": 6}, timeout=10)
    assert exported_pods(service, "StatefulSet") == {}


def test_controllers_scale_and_delete_under_two_replicas(kube: LocalCluster, service: Service) -> None:
    """The controllers act while two replicas of the service run and the leading one dies: both
    replicas' metrics and the summaries follow the LWS controller adding a group and the garbage
    collector taking a deleted JobSet's Jobs and Pods."""
    standby = Service(kube, ("--identity=replica-b", *FAST_LEASE)).start()
    try:
        wait_for(lambda: pod_count(kube, "llm") == 6 and pod_count(kube, "train") == 6, timeout=30)
        ok(kube.request(f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NS}/leaderworkersets/llm", "PATCH",
                        {"spec": {"replicas": 3}}, content_type="application/merge-patch+json"))
        wait_for(lambda: pod_count(kube, "llm") == 9, timeout=60)
        for svc in (service, standby):
            wait_for(lambda: exported_pods(svc, "LeaderWorkerSet") == {"llm": 9}, timeout=10)  # noqa: B023

        service.kill()  # the leader dies
        ok(kube.request(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets/train", "DELETE"))
        wait_for(lambda: not get(kube, "pods", "-l", f"{JS}/jobset-name=train")["items"], timeout=60)
        wait_for(lambda: exported_pods(standby, "JobSet") == {}, timeout=10)
        wait_for(lambda: summary(kube, "train") is None, timeout=30)
        assert pod_count(kube, "llm") == 9
        assert exported_pods(standby, "LeaderWorkerSet") == {"llm": 9}
        assert set(summaries(kube)) == {"llm"}
    finally:
        standby.stop()


def test_controller_webhooks_on_loopback_installed_and_removed(cluster: LocalCluster) -> None:
    """The API server calls the JobSet manager's own webhooks at 127.0.0.1 (defaulting, validation,
    the pod webhooks scoped by the kustomize patch); stop() takes the configurations and the
    process away."""
    ctl = Controller(cluster, JOBSET_PROJECT).start()
    names = ("MutatingWebhookConfiguration/jobset-mutating-webhook-configuration",
             "ValidatingWebhookConfiguration/jobset-validating-webhook-configuration")
    try:
        for name in names:
            config = json.loads(cluster.kubectl("get", name, "-o", "json").stdout)
            urls = {w["name"]: w["clientConfig"]["url"] for w in config["webhooks"]}
            assert all(u.startswith(f"https://127.0.0.1:{ctl.webhook_port}/") for u in urls.values()), urls
            [pod_hook] = [w for w in config["webhooks"] if w["name"] in ("mpod.kb.io", "vpod.kb.io")]
            assert pod_hook["objectSelector"] == {"matchExpressions": [{"key": f"{JS}/jobset-name",
                                                                        "operator": "Exists"}]}
        cluster.kubectl("create", "namespace", "webhooks")
        job = {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}
        js: dict[str, Any] = {
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "d"},
            "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": job}}]}}
        path = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/webhooks/jobsets"
        created = ok(cluster.request(path, "POST", js))
        assert created["spec"]["successPolicy"] == {"operator": "All"}  # the defaulting webhook
        assert created["spec"]["replicatedJobs"][0]["template"]["spec"]["completionMode"] == "Indexed"
        js["metadata"]["name"] = "v"
        js["spec"]["network"] = {"subdomain": "Not_A_Subdomain"}
        code, body = cluster.request(path, "POST", js)
        assert code == 403 and isinstance(body, dict) and "vjobset.kb.io" in body["message"], body
    finally:
        ctl.stop()
    assert not ctl.running() and "jobset-controller" not in cluster.processes
    for name in names:
        assert cluster.kubectl("get", name, check=False).returncode != 0
    cluster.kubectl("delete", "namespace", "webhooks", "--wait=false")
