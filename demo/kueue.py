"""Kueue objects on the local control plane, with the real CRDs of one Kueue "cell", shared by the demo
and the tests. Most run no Kueue controller or webhooks (the CRDs' own schema and validation rules
check what is created); tests/cluster/test_kueue_admission.py runs the cell's controller manager
(localkube.controllers).

The cells (``CELLS``): Kueue v0.14.0 (kueue.x-k8s.io/v1beta1 only); v0.19.0, the newest release the
module proxy serves (v1beta2 and v1beta1 served); and v0.19.0 with v1beta1 unserved, which is what
the API server of Kueue v0.20 and later serves. The objects are written at the cell's ``version``:
the one the service reads there (v1beta2 wherever it is served). The tests pick the cell with
``pytest --kueue`` (the newest by default, ``select``); a process that does not (the benches) gets
``DEFAULT``, the v1beta1 cell its objects are written for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeindex.model.resources import Resource
from localkube.build import KUEUE, KUEUE_019, Component, ensure_binaries
from localkube.cluster import LocalCluster
from localkube.controllers import KUEUE_019_PROJECT, KUEUE_PROJECT, KueueController, Project, unserve
from tests.kube import found, get_object

GROUP = "kueue.x-k8s.io"
WORKLOADS = Resource(GROUP, "v1beta2", "Workload", "workloads", True)  # Kueue's (the service reads none)


@dataclass(frozen=True)
class Cell:
    """One Kueue as an API server serves it: its CRDs and controller (``project``), the versions served."""

    name: str
    crds: Component
    project: Project
    served: tuple[str, ...]  # newest first: the objects are written at the first
    unserved: tuple[str, ...] = ()  # versions of the CRDs set ``served: false``

    @property
    def version(self) -> str:
        return self.served[0]

    @property
    def api(self) -> str:
        return f"{GROUP}/{self.version}"

    @property
    def release(self) -> str:
        return self.crds.version

    def at(self, resource: Resource) -> Resource:
        """One of Kueue's resources at the version this cell's objects are written at."""
        return resource.at(self.version)


V014 = Cell("v0.14.0", KUEUE, KUEUE_PROJECT, ("v1beta1",))
V019 = Cell("v0.19.0", KUEUE_019, KUEUE_019_PROJECT, ("v1beta2", "v1beta1"))
V019_V1BETA2_ONLY = Cell("v0.19.0-v1beta2-only", KUEUE_019, KUEUE_019_PROJECT, ("v1beta2",), unserved=("v1beta1",))
CELLS = {c.name: c for c in (V014, V019, V019_V1BETA2_ONLY)}
NEWEST = V019_V1BETA2_ONLY.name  # make test's; make test-kueue-matrix runs the others
DEFAULT = V014.name  # a process that selects none: bench.fleet and bench.neighbours_quota write v1beta1

_selected = CELLS[DEFAULT]
API = _selected.api  # the default cell's; a test reads cell().api (select changes it)


def select(name: str) -> Cell:
    """The cell this process installs and writes objects for (pytest --kueue)."""
    global _selected, API
    if name not in CELLS:
        raise ValueError(f"no Kueue cell {name!r}: the cells are {', '.join(CELLS)}")
    _selected = CELLS[name]
    API = _selected.api
    return _selected


def cell() -> Cell:
    return _selected


def install_kueue(cluster: LocalCluster) -> None:
    """The cell's CRDs of the kinds the service reads, MultiKueueCluster (a fleet hub's members) among them."""
    current = cell()
    paths = ensure_binaries((current.crds,))
    for bundle in ("kueue-crds.yaml", "multikueue-crds.yaml"):
        path: Path = paths[bundle]
        if current.unserved:
            path = cluster.workdir / f"{current.name}-{bundle}"
            path.write_text(unserve(paths[bundle].read_text(), current.unserved))
        cluster.install_crds(path)


def controller(cluster: LocalCluster) -> KueueController:
    """The cell's Kueue controller manager (not started), installing every CRD of its module."""
    current = cell()
    return KueueController(cluster, current.project, current.unserved)


def _apply(cluster: LocalCluster, obj: dict) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=admin", "-f", "-",
                    input=json.dumps(obj))


def resource_flavor(cluster: LocalCluster, name: str, node_labels: dict[str, str]) -> None:
    """Create or replace a ResourceFlavor."""
    _apply(cluster, {"apiVersion": cell().api, "kind": "ResourceFlavor", "metadata": {"name": name},
                     "spec": {"nodeLabels": node_labels} if node_labels else {}})


def cluster_queue_spec(quotas: dict[str, dict[str, Any]], cohort: str = "") -> dict[str, Any]:
    """A ClusterQueue's spec with one resource group: flavor -> resource -> nominalQuota, or a whole
    resource entry (a dict: nominalQuota, lendingLimit, ...); every flavor lists the same resources,
    in the same order, as Kueue requires. The cohort is ``cohort`` in v1beta1, ``cohortName`` in v1beta2."""
    resources = sorted({r for q in quotas.values() for r in q})

    def entry(name: str, quota: Any) -> dict[str, Any]:
        return {"name": name, **quota} if isinstance(quota, dict) else {"name": name, "nominalQuota": quota}

    flavors = [{"name": f, "resources": [entry(r, q.get(r, "0")) for r in resources]} for f, q in quotas.items()]
    spec: dict[str, Any] = {"namespaceSelector": {},
                            "resourceGroups": [{"coveredResources": resources, "flavors": flavors}]}
    if cohort:
        spec["cohortName" if cell().version == "v1beta2" else "cohort"] = cohort
    return spec


def cluster_queue(cluster: LocalCluster, name: str, quotas: dict[str, dict[str, Any]], cohort: str = "") -> None:
    """Create or replace a ClusterQueue (``cluster_queue_spec``)."""
    _apply(cluster, {"apiVersion": cell().api, "kind": "ClusterQueue", "metadata": {"name": name},
                     "spec": cluster_queue_spec(quotas, cohort)})


def multikueue_cluster(cluster: LocalCluster, name: str, secret: str) -> None:
    """Create or replace a MultiKueueCluster whose kubeconfig is the Secret ``secret`` (in Kueue's
    namespace): ``spec.kubeConfig`` in v1beta1, ``spec.clusterSource.kubeConfig`` in v1beta2."""
    where = {"locationType": "Secret", "location": secret}
    spec = {"clusterSource": {"kubeConfig": where}} if cell().version == "v1beta2" else {"kubeConfig": where}
    _apply(cluster, {"apiVersion": cell().api, "kind": "MultiKueueCluster", "metadata": {"name": name}, "spec": spec})


def local_queue(cluster: LocalCluster, namespace: str, name: str, cluster_queue: str) -> None:
    """Create or replace a LocalQueue feeding ``cluster_queue``."""
    _apply(cluster, {"apiVersion": cell().api, "kind": "LocalQueue",
                     "metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": cluster_queue}})


def workload(cluster: LocalCluster, namespace: str, name: str, queue: str, requests: dict[str, str]) -> None:
    """Create a Workload in LocalQueue ``queue``: one pod asking for ``requests`` (as limits too,
    which extended resources require)."""
    container = {"name": "c", "image": "example.com/train",
                 "resources": {"requests": requests, "limits": requests}}
    _apply(cluster, {"apiVersion": cell().api, "kind": "Workload", "metadata": {"name": name, "namespace": namespace},
                     "spec": {"queueName": queue, "podSets": [{"name": "main", "count": 1, "template": {
                         "spec": {"restartPolicy": "Never", "containers": [container]}}}]}})


def workload_condition(cluster: LocalCluster, namespace: str, name: str, type_: str) -> dict[str, Any]:
    """The Workload's condition ``type_`` ({} while it has none)."""
    obj = found(get_object(cluster, cell().at(WORKLOADS).path(namespace, name)))
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})
