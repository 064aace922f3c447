"""Test helpers that talk to the local control plane through its REST API (admin credentials)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from demo.workloads import create, node_summarizer, ok, owner_ref, workload_summarizer
from localkube.cluster import LocalCluster, Options
from localkube.service import Service, select, value, wait_for
from tests.paths import CRDS


def create_node(cluster: LocalCluster, name: str, labels: dict[str, str], ready: str = "True",
                allocatable: dict[str, str] | None = None, unschedulable: bool = False) -> dict:
    alloc = allocatable or {"cpu": "8", "memory": "32Gi", "pods": "110"}
    ok(cluster.request("/api/v1/nodes", "POST", {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": unschedulable},
    }))
    return set_node_status(cluster, name, ready, alloc)


def set_node_status(cluster: LocalCluster, name: str, ready: str, allocatable: dict[str, str] | None = None) -> dict:
    status: dict = {"conditions": [{"type": "Ready", "status": ready, "reason": "Test",
                                    "lastHeartbeatTime": None, "lastTransitionTime": None}]}
    if allocatable is not None:
        status["allocatable"] = allocatable
        status["capacity"] = allocatable
    return ok(cluster.request(f"/api/v1/nodes/{name}/status", "PATCH", {"status": status},
                              content_type="application/merge-patch+json"))


def set_node_labels(cluster: LocalCluster, name: str, labels: dict[str, str | None]) -> dict:
    return ok(cluster.request(f"/api/v1/nodes/{name}", "PATCH", {"metadata": {"labels": labels}},
                              content_type="application/merge-patch+json"))


def create_pod(cluster: LocalCluster, namespace: str, name: str, node: str = "", phase: str = "Running",
               owner: dict | None = None, cpu: str = "500m", labels: dict[str, str] | None = None) -> dict:
    meta: dict = {"name": name, "namespace": namespace, "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [owner_ref(owner)]
    spec: dict = {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}]}
    if node:
        spec["nodeName"] = node
    pod = create(cluster, f"/api/v1/namespaces/{namespace}/pods",
                 {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
    if phase != "Pending":
        set_pod_phase(cluster, namespace, name, phase)
    return pod


def set_pod_phase(cluster: LocalCluster, namespace: str, name: str, phase: str) -> dict:
    return ok(cluster.request(f"/api/v1/namespaces/{namespace}/pods/{name}/status", "PATCH",
                              {"status": {"phase": phase}}, content_type="application/merge-patch+json"))


def delete(cluster: LocalCluster, path: str) -> None:
    """Delete now; Background propagation, so no GC finalizer keeps the object (Jobs default to
    orphaning, which waits for kube-controller-manager)."""
    code, body = cluster.request(path, "DELETE", {"gracePeriodSeconds": 0, "propagationPolicy": "Background"})
    assert code in (200, 202, 404), (code, body)


def deployment(kube: LocalCluster, namespace: str, name: str) -> dict:
    """A Deployment with no replicas: a root workload that exists without a controller manager."""
    labels = {"app": name}
    return create(kube, f"/apis/apps/v1/namespaces/{namespace}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "c", "image": "example.com/x"}]}}}})


@contextmanager
def summarized_cluster(binaries: dict[str, Path], namespace: str) -> Iterator[LocalCluster]:
    """A control plane of a test module's own: the CRDs, NodeSummarizer `pool` (label `pool`),
    WorkloadSummarizer `apps` (Deployments) and ``namespace``."""
    with LocalCluster(Options(), binaries) as c:
        c.install_crds(CRDS)
        node_summarizer(c, "pool", "pool")
        workload_summarizer(c, "apps", [("apps", "Deployment")])
        c.kubectl("create", "namespace", namespace)
        yield c


def token_kubeconfig(kube: LocalCluster, account: str, namespace: str, name: str | None = None) -> Path:
    """The cluster's kubeconfig with a token of ServiceAccount ``namespace/account`` as its user."""
    token = kube.kubectl("create", "token", account, "-n", namespace, "--duration=2h").stdout.strip()
    config = yaml.safe_load(kube.kubeconfig.read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = account
    path = kube.workdir / f"{name or account}.kubeconfig"
    path.write_text(json.dumps(config))
    return path


# -- a replica's writes and leadership, from its /metrics ----------------------------------------

def writes(svc: Service) -> float:
    return sum(select(svc.scrape(), "nws_reconciler_writes_total").values())


def settled(svc: Service, quiet: float = 1.5) -> float:
    """Wait until the replica has written nothing for ``quiet`` seconds; its write count."""
    last = [writes(svc), time.monotonic()]

    def still() -> bool:
        now = writes(svc)
        if now != last[0]:
            last[:] = [now, time.monotonic()]
        return time.monotonic() - last[1] >= quiet

    wait_for(still, timeout=30, interval=0.2)
    return last[0]


def is_leader(svc: Service) -> bool:
    return value(svc.scrape(), "nws_reconciler_leader") == 1
