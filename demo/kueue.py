"""Kueue objects on the local control plane, with the real CRDs of Kueue v0.14.0 (no Kueue
controller or webhooks: the CRDs' own schema and validation rules check what is created): shared by
the demo and the tests."""

from __future__ import annotations

import json

from localkube.build import KUEUE, ensure_binaries
from localkube.cluster import LocalCluster

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
