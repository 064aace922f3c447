"""Kueue's real controller manager (the cell's: v0.19.0 in make test, v0.14.0 and v0.19.0 in make
test-kueue-matrix; with its webhooks) admits against the quota the service
writes: a Workload that did not fit its ClusterQueue's quota stays pending while the service only
reports (a dry run), and is admitted once the service, with actuation on, patches the quota that a
ClusterResourceClaim assigns. Kueue's validating webhook accepts every patch the service sends,
including the one its lendingLimit rule holds up."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from demo.kueue import (
    WORKLOADS,
    cell,
    cluster_queue,
    controller,
    local_queue,
    resource_flavor,
    workload,
    workload_condition,
)
from kubeindex.model.objects import API_VERSION
from kubeindex.model.resources import CLAIMS, CLUSTER_QUEUES
from localkube.cluster import LocalCluster, Options
from localkube.service import Service, select, value, wait_for
from tests.kube import create_node, found, get_object
from tests.paths import CRDS

pytestmark = [pytest.mark.needs(cell().project.controller), pytest.mark.kueue]  # kueue: make test-kueue-matrix

GPU = "nvidia.com/gpu"
NODE = {"cpu": "32", "memory": "128Gi", "pods": "110", GPU: "4"}
NAMESPACE = "research"
SETTLE = "1"


@pytest.fixture(scope="module")
def kueue(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    """A control plane of its own (Kueue's finalizers and webhooks stay out of the shared one) with
    Kueue's controller manager, every Kueue CRD and this project's CRDs; pool a100 of two nodes
    with 4 GPUs each, and its flavor."""
    with LocalCluster(Options(), binaries) as c, controller(c):
        c.install_crds(CRDS)
        for n in (1, 2):
            create_node(c, f"a100-{n}", {"pool": "a100"}, allocatable=NODE)
        resource_flavor(c, "a100", {"pool": "a100"})
        c.kubectl("create", "namespace", NAMESPACE)
        yield c


def queue_spec(kube: LocalCluster, name: str) -> dict[str, Any]:
    return found(get_object(kube, cell().at(CLUSTER_QUEUES).path(name=name)))


def quota(kube: LocalCluster, name: str) -> dict[tuple[str, str], str]:
    """(flavor, resource) -> nominalQuota of a ClusterQueue."""
    return {(f["name"], r["name"]): str(r["nominalQuota"])
            for g in queue_spec(kube, name)["spec"]["resourceGroups"] for f in g["flavors"] for r in f["resources"]}


def claim_status(kube: LocalCluster, name: str) -> dict[str, Any]:
    return found(get_object(kube, CLAIMS.path(name=name))).get("status", {})


def writes(svc: Service, result: str) -> float:
    return sum(select(svc.scrape(), "nws_quota_writes_total", result=result).values())


def refused(svc: Service) -> list[str]:
    """The service's log lines about a write the API server (or a webhook it calls) refused."""
    return [line for line in svc.log_text().splitlines() if re.search(r"clusterqueues/\S+: (400|403|422) ", line)]


def test_a_pending_workload_is_admitted_once_the_claim_raises_its_quota(kueue: LocalCluster) -> None:
    kube = kueue
    # research: 0 a100 GPUs, in no cohort (it can borrow from no one); prod: 8 a100 GPUs in a cohort,
    # lending at most 6 (lendingLimit): Kueue's webhook refuses a nominalQuota below that.
    cluster_queue(kube, "research", {"a100": {"cpu": "64", GPU: "0"}})
    cluster_queue(kube, "prod", {"a100": {"cpu": "64", GPU: {"nominalQuota": "8", "lendingLimit": "6"}}}, cohort="prod")
    # The webhook is in the path of every ClusterQueue write, JSON patches too.
    denied = kube.kubectl("patch", "clusterqueues.kueue.x-k8s.io", "research", "--type=json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/resourceGroups/0/flavors/0/resources/1/nominalQuota", "value": "-1"}]),
        check=False)
    assert denied.returncode != 0 and 'admission webhook "vclusterqueue.kb.io" denied' in denied.stderr, denied

    local_queue(kube, NAMESPACE, "research", "research")
    workload(kube, NAMESPACE, "train", "research", {"cpu": "1", GPU: "4"})
    wait_for(lambda: workload_condition(kube, NAMESPACE, "train", "QuotaReserved").get("status") == "False",
             timeout=30)
    pending = workload_condition(kube, NAMESPACE, "train", "QuotaReserved")
    assert pending["reason"] == "Pending" and "insufficient quota for nvidia.com/gpu" in pending["message"], pending

    # Half the pool's 8 GPUs to research, a quarter (2) to prod.
    kube.kubectl("apply", "--server-side", "--field-manager=admin", "-f", "-", input=json.dumps({
        "apiVersion": API_VERSION, "kind": "ClusterResourceClaim", "metadata": {"name": "a100"},
        "spec": {"flavor": "a100", "resourceAssignments": [
            {"clusterQueueName": "research", "shares": {GPU: "50%"}},
            {"clusterQueueName": "prod", "shares": {GPU: "25%"}}]}}))

    # A dry run: the claim reports what research would get, nothing is written, nothing admitted.
    generations = {q: queue_spec(kube, q)["metadata"]["generation"] for q in ("research", "prod")}
    dry = Service(kube, ("--identity=dry", f"--quota-settle={SETTLE}")).start()
    try:
        wait_for(lambda: value(dry.scrape(), "nws_queue_desired_quota", cluster_queue="research", flavor="a100",
                               resource=GPU) == 4, timeout=20)
        status = claim_status(kube, "a100")
        assert {q["name"]: q["resources"] for q in status["queues"]} == {"research": {GPU: "4"}, "prod": {GPU: "2"}}
        assert writes(dry, "applied") == 0
    finally:
        dry.stop()
    assert {q: queue_spec(kube, q)["metadata"]["generation"] for q in ("research", "prod")} == generations
    assert workload_condition(kube, NAMESPACE, "train", "QuotaReserved")["status"] == "False"

    svc = Service(kube, ("--identity=a", f"--quota-settle={SETTLE}", "--quota-actuation=on")).start()
    try:
        waited = wait_for(lambda: workload_condition(kube, NAMESPACE, "train", "Admitted").get("status") == "True",
                          timeout=30)
        assert quota(kube, "research")[("a100", GPU)] == "4"
        reserved = workload_condition(kube, NAMESPACE, "train", "QuotaReserved")
        assert reserved["status"] == "True", reserved
        admission = found(get_object(kube, cell().at(WORKLOADS).path(NAMESPACE, "train")))["status"]["admission"]
        assert admission["clusterQueue"] == "research"
        assert admission["podSetAssignments"][0]["flavors"][GPU] == "a100"
        assert admission["podSetAssignments"][0]["resourceUsage"][GPU] == "4"

        # prod: 2 GPUs claimed, but Kueue refuses a nominalQuota below the lendingLimit: lowered as
        # far as that allows (8 -> 6), which the webhook accepts, and the claim says why.
        wait_for(lambda: quota(kube, "prod")[("a100", GPU)] == "6", timeout=20)
        wait_for(lambda: any(c["reason"] == "LendingLimitAbove" for c in claim_status(kube, "a100")["conditions"]),
                 timeout=10)
        gpu = queue_spec(kube, "prod")["spec"]["resourceGroups"][0]["flavors"][0]["resources"][1]
        assert gpu == {"name": GPU, "nominalQuota": "6", "lendingLimit": "6"}  # the lendingLimit untouched

        samples = svc.scrape()
        assert value(samples, "nws_quota_writes_total", cluster_queue="research", result="applied") == 1
        assert value(samples, "nws_quota_writes_total", cluster_queue="prod", result="applied") == 1
        assert writes(svc, "error") == 0
        assert not {dict(k)["code"] for k in select(samples, "nws_reconciler_write_errors_total")} - {"409"}
        assert refused(svc) == [], refused(svc)
        print(f"admitted {waited:.1f}s after the service started")
    finally:
        svc.stop()
