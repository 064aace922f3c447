"""What the real node's tests share (tests/node/test_real_node.py, tests/node/test_fleet_pods.py): the image
built as `make image` builds it, helm against a cluster, the chart's pods and its Lease's holder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from localkube.cluster import LocalCluster
from tests.paths import ROOT

IMAGE = "localhost/node-workload-summary"
TAG = "node-test"
APP = "app.kubernetes.io/name=node-workload-summary"
LEASE = "node-workload-summary"  # the chart's Lease, in the release's namespace


def build_image(directory: Path) -> Path:
    """The image built as `make image` builds it, saved as an OCI archive for the node."""
    archive = directory / "nws.oci.tar"
    subprocess.run([sys.executable, "-m", "deploy.image", "--tag", f"{IMAGE}:{TAG}", "--save", str(archive)],
                   check=True, cwd=ROOT)
    return archive


def helm_process(kube: LocalCluster, helm: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    env, command = helm[:1], helm[1:]  # ["env", HELM_*=..., helm]
    return subprocess.run([*env, f"KUBECONFIG={kube.kubeconfig}", *command, *args], capture_output=True, text=True)


def run_helm(kube: LocalCluster, helm: list[str], *args: str) -> str:
    proc = helm_process(kube, helm, *args)
    assert proc.returncode == 0, f"helm {' '.join(args[:2])}: {proc.stderr}"
    return proc.stdout


def pods(kube: LocalCluster, namespace: str) -> list[dict]:
    return json.loads(kube.kubectl("get", "pods", "-n", namespace, "-l", APP, "-o", "json").stdout)["items"]


def ready(pod: dict) -> bool:
    conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
    return pod["status"].get("phase") == "Running" and conditions.get("Ready") == "True" \
        and "deletionTimestamp" not in pod["metadata"]


def holder(kube: LocalCluster, namespace: str) -> str:
    lease = json.loads(kube.kubectl("get", "lease", "-n", namespace, LEASE, "-o", "json", check=False).stdout or "{}")
    return lease.get("spec", {}).get("holderIdentity", "")
