"""The image as users run it: built from the Dockerfile (`make image`), installed with the chart,
started by a real kubelet on a real node (containerd, runc, a CNI bridge, kube-proxy) beside KWOK
nodes. In-cluster configuration, the kubelet's probes, the securityContext, leader election between
two real pods and SIGTERM within the grace period are exercised here and nowhere else.

`make test-node` runs this module (root, Debian's runc, CNI plugins and podman: `make node-tools`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localkube.cluster import LocalCluster, Options
from localkube.node import NODE_ADDRESS, RealNode
from localkube.service import wait_for
from tests.conftest import CRDS, ROOT
from tests.kube import create_node

pytestmark = pytest.mark.node

IMAGE = "localhost/node-workload-summary"
TAG = "node-test"
NS = "nws"
POOL = "example.com/pool"
APP = "app.kubernetes.io/name=node-workload-summary"
GRACE = 15  # the chart's terminationGracePeriodSeconds
LEASE_SECONDS = 15  # --lease-duration's default


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image built as `make image` builds it, saved as an OCI archive for the node."""
    archive = tmp_path_factory.mktemp("image") / "nws.oci.tar"
    subprocess.run([sys.executable, "-m", "deploy.image", "--tag", f"{IMAGE}:{TAG}", "--save", str(archive)],
                   check=True, cwd=ROOT)
    return archive


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    options = Options(node_address=NODE_ADDRESS, controller_manager=True, scheduler=True, kwok=True)
    with LocalCluster(options, binaries) as c:
        c.install_crds(CRDS)
        yield c


@pytest.fixture(scope="module")
def node(kube: LocalCluster, image: Path) -> Iterator[RealNode]:
    started = time.monotonic()
    real = RealNode(kube).start()
    print(f"real node Ready in {time.monotonic() - started:.1f}s")
    real.load_image(image)
    yield real
    assert real.stop() == [], "the node left something behind"


@pytest.fixture(scope="module")
def release(kube: LocalCluster, node: RealNode, helm: list[str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """`helm install` with the image just built, on the real node; two KWOK nodes in pool "sim"."""
    for name in ("sim-1", "sim-2"):
        create_node(kube, name, {POOL: "sim"})
    values = tmp_path_factory.mktemp("values") / "values.yaml"
    values.write_text(json.dumps({
        "image": {"repository": IMAGE, "tag": TAG, "pullPolicy": "Never"},
        "nodeSelector": {"localkube.local/real-node": "true"},
        "nodeSummarizers": {"pool": {"labelKey": POOL}},
    }))
    env = [f"KUBECONFIG={kube.kubeconfig}"]
    started = time.monotonic()
    subprocess.run([*helm[:1], *env, *helm[1:], "install", "nws", str(ROOT / "charts/node-workload-summary"),
                    "--namespace", NS, "--create-namespace", "-f", str(values), "--wait", "--timeout", "180s"],
                   check=True, capture_output=True, text=True)
    print(f"helm install --wait: {time.monotonic() - started:.1f}s")
    return "nws"


def pods(kube: LocalCluster) -> list[dict]:
    return json.loads(kube.kubectl("get", "pods", "-n", NS, "-l", APP, "-o", "json").stdout)["items"]


def ready(pod: dict) -> bool:
    conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
    return pod["status"].get("phase") == "Running" and conditions.get("Ready") == "True" \
        and "deletionTimestamp" not in pod["metadata"]


def holder(kube: LocalCluster) -> str:
    lease = json.loads(kube.kubectl("get", "lease", "-n", NS, "node-workload-summary", "-o", "json",
                                    check=False).stdout or "{}")
    return lease.get("spec", {}).get("holderIdentity", "")


def test_two_pods_ready_through_the_kubelets_probes_and_one_holds_the_lease(kube: LocalCluster, release: str) -> None:
    running = pods(kube)
    assert len(running) == 2 and all(ready(p) for p in running), [p["status"] for p in running]
    assert {p["spec"]["nodeName"] for p in running} == {"node-real"}
    assert all(p["status"]["podIP"].startswith("10.88.") for p in running)
    names = {p["metadata"]["name"] for p in running}
    wait_for(lambda: holder(kube) in names, timeout=LEASE_SECONDS * 2)
    # The kubelet itself decided Ready: its probes reached the probe port at the pod's address.
    probe = running[0]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    assert probe["path"] == "/readyz"


def test_summaries_are_written_by_the_pod_with_its_service_account(kube: LocalCluster, release: str) -> None:
    def summary() -> dict:
        proc = kube.kubectl("get", "nodesummary", "pool-sim", "-o", "json", "--show-managed-fields", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else {}

    wait_for(lambda: summary().get("status", {}).get("nodeCount") == 2, timeout=60)
    managers = {f["manager"] for f in summary()["metadata"]["managedFields"]}
    assert managers == {"node-workload-summary"}, managers
    # The in-cluster configuration: the pod reached the API server through the `kubernetes`
    # Service (kube-proxy) with its mounted token; its log says where it went.
    log = kube.kubectl("logs", "-n", NS, holder(kube)).stdout
    assert "https://10.0.0.1:443" in log, log[-2000:]


def test_container_runs_as_65532_read_only_without_capabilities(kube: LocalCluster, release: str) -> None:
    pod = pods(kube)[0]["metadata"]["name"]
    script = """
import os
status = dict(line.split(":", 1) for line in open("/proc/1/status"))
try:
    open("/written", "w")
    writable = "yes"
except OSError as err:
    writable = err.strerror
print(status["Uid"].split()[0], status["Gid"].split()[0], status["CapEff"].strip(), status["CapBnd"].strip(),
      status["NoNewPrivs"].strip(), writable, sep="|")
"""
    out = kube.kubectl("exec", "-n", NS, pod, "--", "python", "-c", script).stdout.strip()
    uid, gid, effective, bounding, no_new_privs, writable = out.split("|")
    assert (uid, gid) == ("65532", "65532")
    assert int(effective, 16) == 0 and int(bounding, 16) == 0, out  # every capability dropped
    assert no_new_privs == "1"
    assert writable == "Read-only file system", out


def test_deleted_leader_ends_within_its_grace_and_the_other_pod_leads(kube: LocalCluster, release: str) -> None:
    leader = holder(kube)
    count = len(json.loads(kube.kubectl("get", "nodesummaries", "-o", "json").stdout)["items"])
    started = time.monotonic()
    kube.kubectl("delete", "pod", "-n", NS, leader, "--wait=true", f"--timeout={GRACE + 30}s")
    ended = time.monotonic() - started
    assert ended < GRACE, f"the container took {ended:.1f}s to end after SIGTERM (grace {GRACE}s)"
    # It released the lease on the way out, so the other replica leads at once, not a lease later.
    took = wait_for(lambda: holder(kube) not in ("", leader), timeout=LEASE_SECONDS)
    print(f"SIGTERM to gone: {ended:.1f}s; the other pod led {took:.1f}s later")
    wait_for(lambda: len(pods(kube)) == 2 and all(ready(p) for p in pods(kube)), timeout=120)
    items = json.loads(kube.kubectl("get", "nodesummaries", "-o", "json").stdout)["items"]
    assert len(items) == count and {i["metadata"]["name"] for i in items} >= {"pool-sim"}
