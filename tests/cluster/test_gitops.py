"""A ClusterQueue that a GitOps controller also applies (server-side, as Argo CD and Flux do), with
claims writing its quota: what happens, on a real API server with Kueue's real CRDs (the cell's).

A queue's ``spec.resourceGroups`` is an atomic list in Kueue's schema, so its field ownership is
the whole list: the claims' patch (an update) takes it from the GitOps manager. Then the manager's
re-apply of its manifest is refused (409, naming node-workload-summary) without force; with force
(Flux's apply; Argo CD's with Force=true) it puts Git's quota back, and the claims write theirs again
at once: one write per re-apply, a fight bounded by --quota-max-writes-per-hour. Applied with the
live nominalQuota in place of Git's (what Argo CD's ignoreDifferences with RespectIgnoreDifferences
sends), it goes through and the claims write nothing: the configuration docs/kueue.md#gitops gives.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from demo.kueue import cell, cluster_queue_spec, install_kueue, resource_flavor
from kubeindex.model.objects import API_VERSION
from localkube.cluster import LocalCluster, Options
from localkube.service import Service, select, wait_for
from tests.kube import create_node
from tests.paths import CRDS

pytestmark = pytest.mark.kueue  # and in make test-kueue-matrix, on every Kueue cell

GPU = "nvidia.com/gpu"
NODE = {"cpu": "8", "memory": "32Gi", "pods": "110", GPU: "4"}
GITOPS = "argocd-controller"  # Argo CD's field manager (Flux's: kustomize-controller)
QUEUE = "gitops-research"


def git_manifest(gpus: Any = "0", strategy: str = "BestEffortFIFO") -> dict[str, Any]:
    """The ClusterQueue as Git has it."""
    return {"apiVersion": cell().api, "kind": "ClusterQueue", "metadata": {"name": QUEUE},
            "spec": {**cluster_queue_spec({"a100": {"cpu": "16", GPU: gpus}}), "queueingStrategy": strategy}}


def gitops_apply(kube: LocalCluster, manifest: dict[str, Any], force: bool = False) -> tuple[int, str]:
    proc = kube.kubectl("apply", "--server-side", f"--field-manager={GITOPS}",
                        *(["--force-conflicts"] if force else []), "-f", "-", input=json.dumps(manifest), check=False)
    return proc.returncode, proc.stderr


def live(kube: LocalCluster) -> dict[str, Any]:
    return json.loads(kube.kubectl("get", "clusterqueues.kueue.x-k8s.io", QUEUE, "-o", "json",
                                   "--show-managed-fields").stdout)


def gpus(kube: LocalCluster) -> str:
    resources = live(kube)["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    return str(next(r["nominalQuota"] for r in resources if r["name"] == GPU))


def owners(kube: LocalCluster) -> dict[str, str]:
    """Manager -> operation, of the managers owning spec.resourceGroups."""
    return {m["manager"]: m["operation"] for m in live(kube)["metadata"]["managedFields"]
            if "f:resourceGroups" in m.get("fieldsV1", {}).get("f:spec", {})}


def applied(svc: Service) -> float:
    return sum(select(svc.scrape(), "nws_quota_writes_total", cluster_queue=QUEUE, result="applied").values())


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    """A control plane of its own: Kueue's CRDs made and deleted module after module on the session's
    plane have had their deletion stall for minutes ("storage is (re)initializing")."""
    with LocalCluster(Options(), binaries) as cluster:
        cluster.install_crds(CRDS)
        install_kueue(cluster)
        for n in (1, 2):
            create_node(cluster, f"gitops-{n}", {"pool": "gitops"}, allocatable=NODE)
        resource_flavor(cluster, "a100", {"pool": "gitops"})
        yield cluster


def test_a_gitops_reapply_of_a_claimed_queue(kube: LocalCluster) -> None:
    assert gitops_apply(kube, git_manifest())[0] == 0
    svc = Service(kube, ("--identity=a", "--quota-settle=1", "--quota-actuation=on")).start()
    try:
        kube.kubectl("apply", "--server-side", "--field-manager=admin", "-f", "-", input=json.dumps({
            "apiVersion": API_VERSION, "kind": "ClusterResourceClaim", "metadata": {"name": "gitops"},
            "spec": {"flavor": "a100", "resourceAssignments": [{"clusterQueueName": QUEUE, "shares": {GPU: "50%"}}]}}))
        wait_for(lambda: gpus(kube) == "4", timeout=20)
        # The claims' patch took the atomic list: the GitOps manager owns it no more.
        assert owners(kube) == {"node-workload-summary": "Update"}, owners(kube)

        # Re-applied as it is in Git, without force: refused, naming the claims' manager; nothing moves.
        code, err = gitops_apply(kube, git_manifest())
        assert code != 0 and 'conflict with "node-workload-summary"' in err and ".spec.resourceGroups" in err, err
        assert gpus(kube) == "4" and applied(svc) == 1

        # With force (Flux always; Argo CD with Force=true): Git's 0 comes back, the claims write 4 again.
        assert gitops_apply(kube, git_manifest(), force=True)[0] == 0
        wait_for(lambda: gpus(kube) == "4" and applied(svc) == 2, timeout=20)
        assert owners(kube) == {"node-workload-summary": "Update"}, owners(kube)

        # Git's manifest with the live nominalQuota in place of its own (Argo CD's ignoreDifferences on
        # nominalQuota, with RespectIgnoreDifferences=true): applied without conflict, Git's other edit
        # lands, and the claims have nothing to write.
        code, err = gitops_apply(kube, git_manifest(gpus=gpus(kube), strategy="StrictFIFO"))
        assert code == 0, err
        obj = live(kube)
        assert obj["spec"]["queueingStrategy"] == "StrictFIFO" and gpus(kube) == "4"
        assert set(owners(kube)) == {"node-workload-summary", GITOPS}  # the same value: owned by both
        time.sleep(3)  # a write would have come by now
        assert applied(svc) == 2
        generation = obj["metadata"]["generation"]
        code, _ = gitops_apply(kube, git_manifest(gpus="4", strategy="StrictFIFO"))  # its next sync
        assert code == 0 and live(kube)["metadata"]["generation"] == generation and applied(svc) == 2
    finally:
        svc.stop()
