"""Kueue objects on the local control plane, with the real CRDs of Kueue v0.14.0, shared by the demo
and the tests. Most run no Kueue controller or webhooks (the CRDs' own schema and validation rules
check what is created); tests/test_kueue_admission.py runs its controller manager
(localkube.controllers)."""

from __future__ import annotations

import json
from typing import Any

from localkube.build import KUEUE, ensure_binaries
from localkube.cluster import LocalCluster
from tests.kube import found, get_object

API = "kueue.x-k8s.io/v1beta1"


def install_kueue(cluster: LocalCluster) -> None:
    """Kueue's CRDs, MultiKueue's MultiKueueCluster (a fleet hub's members) among them."""
    for crds in ensure_binaries((KUEUE,)).values():
        cluster.install_crds(crds)


def _apply(cluster: LocalCluster, obj: dict) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=admin", "-f", "-",
                    input=json.dumps(obj))


def resource_flavor(cluster: LocalCluster, name: str, node_labels: dict[str, str]) -> None:
    """Create or replace a ResourceFlavor."""
    _apply(cluster, {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": name},
                     "spec": {"nodeLabels": node_labels} if node_labels else {}})


def cluster_queue(cluster: LocalCluster, name: str, quotas: dict[str, dict[str, str]]) -> None:
    """Create or replace a ClusterQueue with one resource group: flavor -> resource -> nominalQuota
    (every flavor lists the same resources, in the same order, as Kueue requires)."""
    resources = sorted({r for q in quotas.values() for r in q})
    flavors = [{"name": f, "resources": [{"name": r, "nominalQuota": q.get(r, "0")} for r in resources]}
               for f, q in quotas.items()]
    _apply(cluster, {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": name},
                     "spec": {"namespaceSelector": {},
                              "resourceGroups": [{"coveredResources": resources, "flavors": flavors}]}})


def local_queue(cluster: LocalCluster, namespace: str, name: str, cluster_queue: str) -> None:
    """Create or replace a LocalQueue feeding ``cluster_queue``."""
    _apply(cluster, {"apiVersion": API, "kind": "LocalQueue", "metadata": {"name": name, "namespace": namespace},
                     "spec": {"clusterQueue": cluster_queue}})


def workload(cluster: LocalCluster, namespace: str, name: str, queue: str, requests: dict[str, str]) -> None:
    """Create a Workload in LocalQueue ``queue``: one pod asking for ``requests`` (as limits too,
    which extended resources require)."""
    container = {"name": "c", "image": "example.com/train",
                 "resources": {"requests": requests, "limits": requests}}
    _apply(cluster, {"apiVersion": API, "kind": "Workload", "metadata": {"name": name, "namespace": namespace},
                     "spec": {"queueName": queue, "podSets": [{"name": "main", "count": 1, "template": {
                         "spec": {"restartPolicy": "Never", "containers": [container]}}}]}})


def workload_condition(cluster: LocalCluster, namespace: str, name: str, type_: str) -> dict[str, Any]:
    """The Workload's condition ``type_`` ({} while it has none)."""
    obj = found(get_object(cluster, f"/apis/{API}/namespaces/{namespace}/workloads/{name}"))
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})
