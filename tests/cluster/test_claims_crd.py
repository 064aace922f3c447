"""The ClusterResourceClaim CRD on a real kube-apiserver: valid claims accepted with their
defaults, invalid ones refused with the CEL rule's message, the printer columns."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kubeindex.model.objects import API_VERSION
from localkube.cluster import LocalCluster

pytestmark = pytest.mark.compat  # one of the core scenarios make compat runs on every Kubernetes minor


def claim(name: str, assignments: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ClusterResourceClaim", "metadata": {"name": name},
            "spec": {"flavor": "a100", "resourceAssignments": assignments, **spec}}


def _create(cluster: LocalCluster, manifest: dict[str, Any]) -> tuple[int, str]:
    proc = cluster.kubectl("create", "-f", "-", input=json.dumps(manifest), check=False)
    return proc.returncode, proc.stdout + proc.stderr


def test_a_valid_claim_is_accepted_with_its_defaults(cluster: LocalCluster) -> None:
    code, out = _create(cluster, claim("pool", [
        {"clusterQueueName": "research", "resources": {"cpu": "64", "nvidia.com/gpu": 16, "memory": "512Gi"}},
        {"clusterQueueName": "prod", "shares": {"cpu": "50%", "nvidia.com/gpu": "33.3%"}},
        {"clusterQueueName": "dev", "shares": {"cpu": "50%", "nvidia.com/gpu": "66.7%"}}]))
    assert code == 0, out
    spec = json.loads(cluster.kubectl("get", "crc", "pool", "-o", "json").stdout)["spec"]
    assert spec["clusterName"] == "local" and spec["overAllocation"] == "Scale"


@pytest.mark.parametrize(("assignments", "message"), [
    # A pattern (apimachinery's quantity grammar without a minus), not a CEL rule: see the CRD.
    ([{"clusterQueueName": "a", "resources": {"cpu": "-1"}}], "resources.cpu in body should match '^\\+?(([0-9]+"),
    ([{"clusterQueueName": "a", "resources": {"cpu": "lots"}}], "resources.cpu in body should match"),
    ([{"clusterQueueName": "a", "resources": {"cpu": -1}}], "cpu in body should be greater than or equal to 0"),
    ([{"clusterQueueName": "a", "resources": {"cpu": "1"}, "shares": {"cpu": "5%"}}], "exactly one of resources"),
    ([{"clusterQueueName": "a"}], "exactly one of resources"),
    ([{"clusterQueueName": "a", "shares": {"cpu": "60%"}}, {"clusterQueueName": "b", "shares": {"cpu": "40.1%"}}],
     "must add up to at most 100%"),
    ([{"clusterQueueName": "a", "shares": {"cpu": "101%"}}], "must be a percentage from 0% to 100%"),
    ([{"clusterQueueName": "a", "shares": {"cpu": "0.25"}}], "must be a percentage from 0% to 100%"),
    ([{"clusterQueueName": "a", "resources": {"cpu": "1"}}, {"clusterQueueName": "a", "resources": {"cpu": "2"}}],
     "Duplicate value"),
    ([{"clusterQueueName": "Not_A_Queue", "resources": {"cpu": "1"}}], "must be a ClusterQueue name"),
])
def test_invalid_assignments_are_refused_with_the_rule(cluster: LocalCluster, assignments: list[dict[str, Any]],
                                                        message: str) -> None:
    code, out = _create(cluster, claim("bad", assignments))
    assert code != 0 and message in out, out


def test_invalid_cluster_flavor_and_policy_are_refused(cluster: LocalCluster) -> None:
    for spec, message in (({"clusterName": "Other_Cluster"}, "must be a DNS-1123 subdomain"),
                          ({"flavor": "A100!"}, "must be a ResourceFlavor name"),
                          ({"overAllocation": "Drop"}, "Unsupported value")):
        code, out = _create(cluster, claim("bad", [], **spec))
        assert code != 0 and message in out, out


def test_kubectl_get_crc_columns(cluster: LocalCluster) -> None:
    assert _create(cluster, claim("columns", []))[0] == 0
    cluster.kubectl("patch", "crc", "columns", "--subresource=status", "--type=merge", "-p", json.dumps({"status": {
        "nominalResources": {"cpu": "128", "nvidia.com/gpu": "32"}, "assignedPercent": "75%",
        "conditions": [{"type": "Ready", "status": "True", "reason": "AssignmentsFit", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}))
    lines = cluster.kubectl("get", "crc").stdout.splitlines()
    assert lines[0].split() == ["NAME", "CLUSTER", "FLAVOR", "CPU", "GPU", "ASSIGNED%", "READY", "AGE"]
    assert lines[1].split()[:7] == ["columns", "local", "a100", "128", "32", "75%", "True"]
