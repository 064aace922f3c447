"""A NodeSummary's size as the API server returns it, on a real control plane: its bytes with and
without managedFields stay under budget, our applies leave one small managedFields entry each
(metadata+spec, status), the printer columns still read it, and the first v1alpha1 shape of its
status can be computed from it."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest

from demo.workloads import node_summarizer
from kubeindex.model.resources import NODE_SUMMARIES
from localkube.cluster import LocalCluster
from localkube.service import Service, wait_for
from tests.kube import create_node, create_pod, get_object
from tests.reference import old_from_new

pytestmark = pytest.mark.compat  # one of the core scenarios make compat runs on every Kubernetes minor

LABEL = "size.example.com/pool"
NAME = "size-pool-a"
# Bytes of GET .../nodesummaries/size-pool-a: 3 nodes with cpu, memory and pods, 6 pods. Measured
# 1,533 with managedFields and 947 without (the first v1alpha1 shape: 2,178 and 1,013); the slack
# is for longer resourceVersions and names of a busier control plane.
BUDGET = 1600
BUDGET_WITHOUT_MANAGED_FIELDS = 980


@pytest.fixture(scope="module")
def summary(cluster: LocalCluster) -> Iterator[bytes]:
    node_summarizer(cluster, "size", LABEL)
    cluster.kubectl("create", "namespace", "size")
    for i in range(3):
        create_node(cluster, f"size-{i}", {LABEL: "pool-a"},
                    allocatable={"cpu": "31850m", "memory": "120Gi", "pods": "110"})
        for j in range(2):
            create_pod(cluster, "size", f"p-{i}-{j}", f"size-{i}", cpu="500m")
    svc = Service(cluster).start()
    try:
        def written() -> bool:
            status = (get_object(cluster, NODE_SUMMARIES.path(name=NAME)) or {}).get("status", {})
            return status.get("podCount") == 6

        wait_for(written, timeout=30)
        yield raw(cluster, NODE_SUMMARIES.path(name=NAME))
    finally:
        svc.stop()


def raw(cluster: LocalCluster, path: str) -> bytes:
    """The body exactly as the API server sends it."""
    with urllib.request.urlopen(f"{cluster.server}{path}", timeout=10, context=cluster._ssl) as resp:
        return resp.read()


def test_bytes_under_budget(summary: bytes) -> None:
    obj = json.loads(summary)
    bare = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "managedFields"}}
    without = len(json.dumps(bare, separators=(",", ":")))
    assert len(summary) <= BUDGET, (len(summary), without)
    assert without <= BUDGET_WITHOUT_MANAGED_FIELDS, (len(summary), without)


def test_one_small_managed_fields_entry_per_apply(summary: bytes) -> None:
    """spec and status are atomic: each entry names them whole, not one field per count and
    resource (which took 829 bytes for the status alone)."""
    entries = json.loads(summary)["metadata"]["managedFields"]
    assert [(e["manager"], e["operation"], e.get("subresource")) for e in entries] == [
        ("node-workload-summary", "Apply", None), ("node-workload-summary", "Apply", "status")]
    main, status = (e["fieldsV1"] for e in entries)
    assert status == {"f:status": {}}
    assert main["f:spec"] == {} and set(main) == {"f:metadata", "f:spec"}


def test_printer_columns_and_old_shape(cluster: LocalCluster, summary: bytes) -> None:
    status = json.loads(summary)["status"]
    assert status["nodesByState"] == {"Ready": 3}
    old = old_from_new(status)
    assert old["nodesByState"] == {"Ready": 3, "NotReady": 0, "Unknown": 0, "Disrupting": 0, "Cordoned": 0,
                                   "Degraded": 0}
    assert old["allocatable"] == {"cpu": "95550m", "memory": "360Gi", "pods": "330"}
    assert old["requested"] == {"cpu": "3"}
    header, row = (line.split() for line in cluster.kubectl("get", "nodesummaries", NAME, "-o", "wide")
                   .stdout.splitlines())
    assert header[:9] == ["NAME", "NODES", "READY", "NOT", "READY", "CPU", "MEMORY", "GPU", "UNHEALTHY"], header
    # NAME NODES READY NOT-READY CPU MEMORY (GPU empty) UNHEALTHY (TPU empty) CORDONED PODS PREFIX AGE
    assert row[:10] == [NAME, "3", "3", "0", "95550m", "360Gi", "0", "0", "6", "size-*"], row
