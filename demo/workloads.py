"""Build node pools and workloads on a local control plane through its API: shared by the demo and
the tests. Real controllers do the rest (Deployment -> ReplicaSet -> Pods, Job -> Pods,
StatefulSet -> Pods, and with localkube.controllers running JobSet -> Jobs and LeaderWorkerSet ->
StatefulSets); KWOK plays the kubelets of nodes annotated kwok.x-k8s.io/node=fake."""

from __future__ import annotations

from typing import Any

from kubeindex.model.objects import API_VERSION
from kubeindex.model.resources import NODE_SUMMARIZERS, NODES, WORKLOAD_SUMMARIZERS
from localkube.cluster import ClusterError, LocalCluster

POOL_LABEL = "cloud.google.com/gke-nodepool"


def ok(result: tuple[int, Any]) -> dict:
    code, body = result
    if not 200 <= code < 300:
        raise ClusterError(f"API request failed: HTTP {code}: {body}")
    return body


def create(cluster: LocalCluster, path: str, obj: dict) -> dict:
    return ok(cluster.request(path, "POST", obj))


def owner_ref(obj: dict) -> dict:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True}


def node_summarizer(cluster: LocalCluster, name: str, label_key: str) -> dict:
    return create(cluster, NODE_SUMMARIZERS.path(), {"apiVersion": API_VERSION, "kind": "NodeSummarizer",
                                                                    "metadata": {"name": name},
                                                                    "spec": {"labelKey": label_key}})


def workload_summarizer(cluster: LocalCluster, name: str, types: list[tuple[str, str]]) -> dict:
    """``types``: (group, kind) pairs."""
    return create(cluster, WORKLOAD_SUMMARIZERS.path(), {
        "apiVersion": API_VERSION, "kind": "WorkloadSummarizer", "metadata": {"name": name},
        "spec": {"workloadTypes": [{"group": g, "kind": k} for g, k in types]}})


def kwok_node(cluster: LocalCluster, name: str, pool: str, allocatable: dict[str, str],
              labels: dict[str, str] | None = None) -> dict:
    return create(cluster, NODES.path(), {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {POOL_LABEL: pool, **(labels or {})},
                     "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "status": {"allocatable": allocatable, "capacity": allocatable},
    })


def pod_template(labels: dict[str, str]) -> dict:
    container = {"name": "main", "image": "example.com/server:v1"}
    return {"metadata": {"labels": labels}, "spec": {"containers": [container]}}


def deployment_chain(cluster: LocalCluster, namespace: str, name: str) -> tuple[dict, dict]:
    """A Deployment and a ReplicaSet it owns, written directly (no controller needed): pods created
    with an ownerReference to the ReplicaSet then belong to the Deployment."""
    labels = {"app": name}
    spec = {"selector": {"matchLabels": labels}, "template": pod_template(labels)}
    deploy = create(cluster, f"/apis/apps/v1/namespaces/{namespace}/deployments",
                    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": spec})
    rs = create(cluster, f"/apis/apps/v1/namespaces/{namespace}/replicasets", {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": f"{name}-1", "ownerReferences": [owner_ref(deploy)]}, "spec": spec})
    return deploy, rs


def statefulset(cluster: LocalCluster, namespace: str, name: str, owner: dict | None, replicas: int,
                labels: dict[str, str] | None = None) -> dict:
    template = pod_template({"app": name, **(labels or {})})
    meta: dict = {"name": name}
    if owner is not None:
        meta["ownerReferences"] = [owner_ref(owner)]
    return create(cluster, f"/apis/apps/v1/namespaces/{namespace}/statefulsets", {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta,
        "spec": {"replicas": replicas, "serviceName": name, "selector": {"matchLabels": {"app": name}},
                 "template": template}})


def jobset_chain(cluster: LocalCluster, namespace: str, name: str, jobs: int, parallelism: int,
                 labels: dict[str, str] | None = None, node_selector: dict[str, str] | None = None) -> dict:
    """A real JobSet (jobset.x-k8s.io/v1alpha2) with one replicatedJob ``workers`` of ``jobs`` Jobs
    of ``parallelism`` pods: the JobSet controller (localkube.controllers) creates the Jobs
    ``<name>-workers-<i>``, kube-controller-manager's job controller their Pods."""
    pod_spec: dict = {"restartPolicy": "Never", "containers": [{"name": "main", "image": "example.com/train:v1"}]}
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    job = {"parallelism": parallelism, "completions": parallelism, "backoffLimit": 0,
           "template": {"metadata": {"labels": labels or {}}, "spec": pod_spec}}
    return create(cluster, f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets", {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": jobs, "template": {"spec": job}}]}})


def leaderworkerset_chain(cluster: LocalCluster, namespace: str, name: str, workers: int,
                          labels: dict[str, str] | None = None, replicas: int = 1) -> dict:
    """A real LeaderWorkerSet (leaderworkerset.x-k8s.io/v1): ``replicas`` groups of one leader and
    ``workers`` workers. The LWS controller (localkube.controllers) makes the shape LWS -> leader
    StatefulSet ``<name>`` -> leader Pod ``<name>-<group>`` -> worker StatefulSet ``<name>-<group>``
    -> worker Pods ``<name>-<group>-<n>``; kube-controller-manager's StatefulSet controller the Pods."""
    template = {"metadata": {"labels": labels or {}},
                "spec": {"containers": [{"name": "main", "image": "example.com/server:v1"}]}}
    return create(cluster, f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{namespace}/leaderworkersets", {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": name},
        "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": workers + 1, "workerTemplate": template}}})
