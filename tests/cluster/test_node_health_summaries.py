"""Node health in the summaries, on a real control plane: each transition moves the node's state in
its NodeSummary and shows the impact in the WorkloadSummary of every workload with pods there
within 2 s, then returns to zero; the printer columns show it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from demo.workloads import ok
from kubeindex.model.resources import BY_PLURAL, NODES
from localkube.cluster import LocalCluster
from localkube.service import Service, wait_for
from tests.kube import create_node, create_pod, deployment, get_object, summarized_cluster

pytestmark = pytest.mark.compat  # one of the core scenarios make compat runs on every Kubernetes minor

NS = "train"
GPU = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "8"}
HEALTHY = {"Ready": 2}  # states with no node are left out of nodesByState


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    with summarized_cluster(binaries, NS) as c:
        for i in range(2):
            create_node(c, f"gpu-{i}", {"pool": "gpu"}, allocatable=GPU)
        create_node(c, "cpu-0", {"pool": "cpu"})
        for name, nodes in (("trainer", ["gpu-0", "gpu-0", "gpu-1"]), ("web", ["cpu-0"])):
            owner = deployment(c, NS, name)
            for i, node in enumerate(nodes):
                create_pod(c, NS, f"{name}-{i}", node, owner=owner)
        yield c


@pytest.fixture(scope="module")
def service(kube: LocalCluster) -> Iterator[Service]:
    svc = Service(kube, ("--write-debounce=0.2",)).start()
    wait_for(lambda: status(kube, "nodesummaries/pool-gpu").get("nodesByState") == HEALTHY, timeout=15)
    yield svc
    svc.stop()


def status(kube: LocalCluster, path: str) -> dict:
    """The status of ``<plural>/<name>`` or ``namespaces/<namespace>/<plural>/<name>`` of this project's kinds."""
    *where, plural, name = path.split("/")
    return (get_object(kube, BY_PLURAL[plural].path(where[1] if where else "", name)) or {}).get("status", {})


def patch_node(kube: LocalCluster, name: str, body: dict, subresource: str = "") -> None:
    ok(kube.request(NODES.path(name=f"{name}{subresource}"), "PATCH", body,
                    content_type="application/strategic-merge-patch+json"))


def conditions(ready: str, **problems: str) -> dict:
    conds = [{"type": "Ready", "status": ready, "reason": "Test"}]
    conds += [{"type": t, "status": s, "reason": "Test"} for t, s in problems.items()]
    return {"status": {"conditions": conds}}


TRANSITIONS: dict[str, tuple[str, Callable[[LocalCluster], None], Callable[[LocalCluster], None]]] = {
    "taint": ("Disrupting",
              lambda k: patch_node(k, "gpu-0", {"spec": {"taints": [
                  {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}}),
              lambda k: patch_node(k, "gpu-0", {"spec": {"taints": None}})),
    "condition": ("Degraded",
                  lambda k: patch_node(k, "gpu-0", conditions("True", KernelDeadlock="True"), "/status"),
                  lambda k: patch_node(k, "gpu-0", conditions("True", KernelDeadlock="False"), "/status")),
    "cordon": ("Cordoned",
               lambda k: patch_node(k, "gpu-0", {"spec": {"unschedulable": True}}),
               lambda k: patch_node(k, "gpu-0", {"spec": {"unschedulable": False}})),
    "not-ready": ("NotReady",
                  lambda k: patch_node(k, "gpu-0", conditions("False"), "/status"),
                  lambda k: patch_node(k, "gpu-0", conditions("True"), "/status")),
}


@pytest.mark.parametrize("transition", list(TRANSITIONS))
def test_transition_reaches_the_summaries(kube: LocalCluster, service: Service, transition: str) -> None:
    state, go, back = TRANSITIONS[transition]
    go(kube)
    took = wait_for(lambda: status(kube, "nodesummaries/pool-gpu")["nodesByState"] == HEALTHY | {
        "Ready": 1, state: 1}, timeout=5)
    took = max(took, wait_for(lambda: status(kube, f"namespaces/{NS}/workloadsummaries/trainer").get(
        "podsByNodeState") == {state: 2}, timeout=5))
    assert took <= 2, f"{transition}: {took:.2f}s"
    trainer = status(kube, f"namespaces/{NS}/workloadsummaries/trainer")
    assert trainer["podsOnUnhealthyNodes"] == 2
    assert trainer["nodeSummaryRefs"] == [{"name": "pool-gpu", "nodeCount": 2, "unhealthyNodeCount": 1}]
    unhealthy = 0 if state == "Cordoned" else 1  # cordoned nodes are out of service on purpose
    assert status(kube, "nodesummaries/pool-gpu")["unhealthyNodeCount"] == unhealthy
    assert status(kube, f"namespaces/{NS}/workloadsummaries/web")["podsOnUnhealthyNodes"] == 0  # elsewhere
    back(kube)
    wait_for(lambda: status(kube, "nodesummaries/pool-gpu")["nodesByState"] == HEALTHY, timeout=5)
    wait_for(lambda: status(kube, f"namespaces/{NS}/workloadsummaries/trainer")["podsOnUnhealthyNodes"] == 0,
             timeout=5)
    trainer = status(kube, f"namespaces/{NS}/workloadsummaries/trainer")
    assert "podsByNodeState" not in trainer  # no stale entry
    assert trainer["nodeSummaryRefs"][0]["unhealthyNodeCount"] == 0


def test_accelerators_dropping_and_recovering(kube: LocalCluster, service: Service) -> None:
    patch_node(kube, "gpu-1", {"status": {"allocatable": GPU | {"nvidia.com/gpu": "6"}}}, "/status")
    wait_for(lambda: status(kube, "nodesummaries/pool-gpu").get("unhealthyAccelerators") == {"nvidia.com/gpu": "2"},
             timeout=5)
    assert status(kube, "nodesummaries/pool-gpu")["nodesByState"]["Degraded"] == 1
    rows = kube.kubectl("get", "nodesummaries").stdout.splitlines()
    header, gpu = rows[0].split(), next(r.split() for r in rows if r.startswith("pool-gpu"))
    assert header[-3:] == ["UNHEALTHY", "BLOCKED", "AGE"] and gpu[-2] == "1"  # BLOCKED empty: no Karpenter here
    # A WorkloadSummary is written a debounce after its first change: it may trail the NodeSummary.
    wait_for(lambda: status(kube, f"namespaces/{NS}/workloadsummaries/trainer").get("podsOnUnhealthyNodes") == 1,
             timeout=5)
    rows = kube.kubectl("get", "workloads.ux", "-n", NS).stdout.splitlines()
    assert rows[0].split()[:5] == ["NAME", "N_PODS", "SHORT_TYPE", "LONG_TYPE", "UNHEALTHY"]
    assert next(r.split() for r in rows if r.startswith("trainer"))[4] == "1"  # the pod on gpu-1
    patch_node(kube, "gpu-1", {"status": {"allocatable": GPU}}, "/status")
    wait_for(lambda: "unhealthyAccelerators" not in status(kube, "nodesummaries/pool-gpu"), timeout=5)
    assert status(kube, "nodesummaries/pool-gpu")["nodesByState"] == HEALTHY
