"""What the fleet's tests share (tests/cluster/test_fleet.py: the hub as a process; tests/node/test_fleet_pods.py:
the hub as the chart's pods on a real node): the chart's RBAC, the hub's reader in a member, the
MultiKueueClusters, and the claims and the quota they read back."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from demo import kueue
from localkube.cluster import LocalCluster
from tests.paths import ROOT

READER = {"kind": "ServiceAccount", "name": "multikueue-sa", "namespace": "kueue-system"}
GPU = ("a100", "nvidia.com/gpu")
RELEASE = "node-workload-summary"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def reader_kubeconfig(kube: LocalCluster, server: str) -> str:
    """A self-contained kubeconfig (CA inline, a token) of the hub's reader in the member."""
    token = kube.kubectl("create", "token", READER["name"], "-n", READER["namespace"], "--duration=2h").stdout.strip()
    config = json.loads(kube.inline_kubeconfig(server))
    config["users"] = [{"name": "reader", "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = "reader"
    return json.dumps(config)


def chart_rbac(helm: list[str], tmp_path: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    """The RBAC objects (and ServiceAccount) the chart renders with ``values``."""
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    rendered = subprocess.run([*helm, "template", RELEASE, str(ROOT / "charts" / "node-workload-summary"),
                               "--namespace", RELEASE, "-f", str(file)], capture_output=True, text=True, check=True,
                              timeout=120).stdout
    return [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in RBAC_KINDS]


def hub_readers_rbac(helm: list[str], tmp_path: Path) -> str:
    """The chart's member-side RBAC (fleet.hubReaders), as `helm template` renders it."""
    docs = [d for d in chart_rbac(helm, tmp_path, {"fleet": {"hubReaders": [READER]}})
            if d["metadata"]["name"].endswith("-fleet-reader")]
    assert {d["kind"] for d in docs} == {"ClusterRole", "ClusterRoleBinding"}
    return "\n---\n".join(json.dumps(d) for d in docs)


def member_secret(hub: LocalCluster, member: LocalCluster, name: str, server: str) -> None:
    """The member's kubeconfig (its reader's, to ``server``) as the hub's Secret member-<name>."""
    config = reader_kubeconfig(member, server)
    hub.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"member-{name}", "namespace": "kueue-system"},
        "data": {"kubeconfig": base64.b64encode(config.encode()).decode()}}))


def join(kube: LocalCluster, name: str) -> None:
    kueue.multikueue_cluster(kube, name, f"member-{name}")


def claims(kube: LocalCluster) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in json.loads(
        kube.kubectl("get", "clusterresourceclaims", "-o", "json").stdout)["items"]}


def ready(kube: LocalCluster, name: str) -> dict[str, Any]:
    return next((c for c in claims(kube).get(name, {}).get("status", {}).get("conditions", [])
                 if c["type"] == "Ready"), {})


def research(kube: LocalCluster) -> dict[str, Any]:
    return json.loads(kube.kubectl("get", "clusterqueues.kueue.x-k8s.io", "research", "-o", "json").stdout)


def gpu_quota(kube: LocalCluster) -> str:
    spec = research(kube)["spec"]
    return next(str(r["nominalQuota"]) for g in spec["resourceGroups"] for f in g["flavors"] if f["name"] == GPU[0]
                for r in f["resources"] if r["name"] == GPU[1])


def assign(kube: LocalCluster, name: str, assignment: dict[str, Any], **spec: Any) -> None:
    kube.kubectl("patch", "clusterresourceclaims", name, "--type=merge", "-p", json.dumps(
        {"spec": {"resourceAssignments": [{"clusterQueueName": "research", **assignment}], **spec}}))
