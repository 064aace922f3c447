"""Device health on a real control plane (1.36+: the ResourceHealthStatus gate, beta and on by
default there): the kubelet's report of a pod's devices, written to the pod's status as the
kubelet writes it, shows per node group and per workload in the metrics and the summaries, in
JSON and protobuf alike, and goes when the device is Healthy again or the pod finishes. The
bounds (20 s) are for a stall: on a cold machine building in the background a NodeSummary was
written 5 s after its metric."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.workloads import create, ok, owner_ref
from kubeindex.model.resources import BY_PLURAL, PODS
from localkube.cluster import LocalCluster
from localkube.service import Service, parse, value, wait_for
from tests.kube import create_node, delete, deployment, found, get_object, set_pod_phase, summarized_cluster

NS = "devices"
GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    with summarized_cluster(binaries, NS) as c:
        for i in range(2):
            create_node(c, f"gpu-{i}", {"pool": "gpu"}, allocatable={"cpu": "8", "pods": "110", GPU: "8"})
        deployment(c, NS, "trainer")
        yield c


def gpu_pod(kube: LocalCluster, name: str, node: str, owner: dict) -> None:
    requests = {"cpu": "1", GPU: "2"}
    create(kube, PODS.path(NS), {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "ownerReferences": [owner_ref(owner)]},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x",
                                                    "resources": {"requests": requests, "limits": {GPU: "2"}}}]}})
    set_pod_phase(kube, NS, name, "Running")


def report(kube: LocalCluster, pod: str, *health: str) -> None:
    """The kubelet's status of the pod's container, with the health of its two GPUs."""
    devices = [{"resourceID": f"{pod}-gpu-{i}", "health": h} for i, h in enumerate(health)]
    status = {"containerStatuses": [{
        "name": "c", "image": "x", "imageID": "", "ready": True, "restartCount": 0,
        "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}},
        "allocatedResourcesStatus": [{"name": GPU, "resources": devices}]}]}
    ok(kube.request(PODS.path(NS, pod, "status"), "PATCH", {"status": status},
                    content_type="application/merge-patch+json"))


def status(kube: LocalCluster, plural: str, name: str, namespace: str = "") -> dict:
    return (get_object(kube, BY_PLURAL[plural].path(namespace, name)) or {}).get("status", {})


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_unhealthy_devices_show_per_pool_and_workload_and_go(kube: LocalCluster, encoding: str) -> None:
    trainer = found(get_object(kube, f"/apis/apps/v1/namespaces/{NS}/deployments/trainer"))
    pods = [f"{encoding}-{i}" for i in range(2)]
    for i, pod in enumerate(pods):
        gpu_pod(kube, pod, f"gpu-{i}", trainer)
    svc = Service(kube, ("--write-debounce=0.2", f"--encoding={encoding}")).start()
    try:
        def metrics() -> dict[str, float | None]:
            samples = parse(svc.get("/metrics")[1])
            return {
                "group_pods": value(samples, "nws_nodegroup_pods_with_unhealthy_devices", summarizer="pool",
                                    group="gpu"),
                "group_gpus": value(samples, "nws_nodegroup_devices_unhealthy", summarizer="pool", group="gpu",
                                    resource=GPU),
                "workload_pods": value(samples, "nws_workload_pods_with_unhealthy_devices", namespace=NS,
                                       workload="trainer", kind="Deployment"),
                "workload_gpus": value(samples, "nws_workload_devices_unhealthy", namespace=NS,
                                       workload="trainer", kind="Deployment", resource=GPU)}

        none = dict.fromkeys(("group_pods", "group_gpus", "workload_pods", "workload_gpus"))
        wait_for(lambda: status(kube, "workloadsummaries", "trainer", NS).get("podCount") == 2, timeout=15)
        assert metrics() == none  # healthy: no series at all
        report(kube, pods[0], "Unhealthy", "Healthy")
        report(kube, pods[1], "Unhealthy", "Unhealthy")
        wait_for(lambda: metrics() == {"group_pods": 2, "group_gpus": 3, "workload_pods": 2, "workload_gpus": 3},
                 timeout=20)
        wait_for(lambda: status(kube, "nodesummaries", "pool-gpu").get("unhealthyDevices") == {GPU: 3}, timeout=20)
        assert status(kube, "nodesummaries", "pool-gpu")["podsWithUnhealthyDevices"] == 2
        wait_for(lambda: status(kube, "workloadsummaries", "trainer", NS).get("unhealthyDevices") == {GPU: 3},
                 timeout=20)
        assert status(kube, "workloadsummaries", "trainer", NS)["podsWithUnhealthyDevices"] == 2

        report(kube, pods[0], "Healthy", "Unknown")  # Unknown: no report, not a fault
        set_pod_phase(kube, NS, pods[1], "Failed")  # a finished pod holds no device
        wait_for(lambda: metrics() == none, timeout=20)
        wait_for(lambda: "unhealthyDevices" not in status(kube, "workloadsummaries", "trainer", NS), timeout=20)
        assert "podsWithUnhealthyDevices" not in status(kube, "nodesummaries", "pool-gpu")
    finally:
        svc.stop()
        for pod in pods:
            delete(kube, PODS.path(NS, pod))
