"""The local control plane itself: build errors, readiness, teardown, no process left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from demo import kueue
from localkube.build import JOBSET, KUBERNETES_CONTROLLERS, KWOK, LWS, ensure_binaries
from localkube.cluster import ClusterError, LocalCluster, Options, leftover_processes
from tests.paths import ROOT

pytestmark = pytest.mark.needs(KUBERNETES_CONTROLLERS, KWOK, JOBSET, LWS)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_binaries_are_cached_by_version(binaries: dict[str, Path]) -> None:
    every = ensure_binaries()  # what `localkube build` builds: the core (the fixture's) and the rest
    assert set(binaries) == {"etcd", "kube-apiserver", "kubectl"} and binaries.items() <= every.items()
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok"):
        assert every[name].is_file() and os.access(every[name], os.X_OK), name
    assert every["kube-apiserver"].parent.name.startswith("kubernetes-v1.")
    assert every["kube-scheduler"].parent == every["kube-apiserver"].parent  # one module, one cache directory
    assert every["etcd"].parent.name.startswith("etcd-v3.6.")
    # A second call builds nothing and returns the same paths, quickly.
    started = time.monotonic()
    assert ensure_binaries() == every
    assert time.monotonic() - started < 5
    version = subprocess.run([binaries["kubectl"], "version", "--client", "-o", "json"],
                             capture_output=True, text=True, check=True).stdout
    assert json.loads(version)["clientVersion"]["gitVersion"].startswith("v1.")


def test_cluster_serves_and_teardown_leaves_nothing(binaries: dict[str, Path]) -> None:
    cluster = LocalCluster(Options(), binaries)
    with cluster:
        pids = cluster.pids()
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        assert cluster.server.startswith("https://127.0.0.1:")
        nodes = cluster.kubectl("get", "nodes", "-o", "json").stdout
        assert json.loads(nodes)["items"] == []
        workdir = cluster.workdir
        assert (workdir / "kubeconfig").is_file()
    assert not any(_alive(p) for p in pids)
    assert not workdir.exists()


def test_interrupted_start_leaves_nothing(binaries: dict[str, Path]) -> None:
    """A failure part way through start() (here: a component that cannot start) stops the rest."""
    broken = dict(binaries, **{"kube-scheduler": Path("/bin/false")})
    before = set(leftover_processes())  # e.g. the session's cluster
    cluster = LocalCluster(Options(scheduler=True, start_timeout=20), broken)
    with pytest.raises(ClusterError, match="kube-scheduler exited"):
        cluster.start()
    assert set(leftover_processes()) == before


def test_killed_parent_leaves_no_process(binaries: dict[str, Path]) -> None:
    """Even SIGKILL of the Python process that started the control plane leaves nothing behind.
    (``binaries``: built beforehand, and the test marked `cluster`.)"""
    script = (
        "import sys, time\n"
        "from localkube.cluster import LocalCluster\n"
        "c = LocalCluster(); c.start()\n"
        "print(' '.join(map(str, c.pids())), flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline() if parent.stdout else ""
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids), line
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def test_full_control_plane_runs_a_deployment_on_kwok_nodes(binaries: dict[str, Path]) -> None:
    """kube-controller-manager + kube-scheduler + KWOK: Deployment -> ReplicaSet -> scheduled, Running pods."""
    with LocalCluster(Options(controller_manager=True, scheduler=True, kwok=True), binaries) as cluster:
        for i in range(2):
            cluster.kubectl("apply", "-f", "-", input=json.dumps({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": f"kwok-node-{i}", "annotations": {"kwok.x-k8s.io/node": "fake"},
                             "labels": {"type": "kwok"}},
                "spec": {"taints": []},
            }))
        cluster.kubectl("create", "deployment", "web", "--image=nginx", "--replicas=3")
        cluster.kubectl("rollout", "status", "deployment/web", "--timeout=60s", timeout=90)
        pods = json.loads(cluster.kubectl("get", "pods", "-l", "app=web", "-o", "json").stdout)["items"]
        assert len(pods) == 3
        for pod in pods:
            assert pod["status"]["phase"] == "Running"
            assert pod["spec"]["nodeName"].startswith("kwok-node-")
            assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
        nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
        ready = [c["status"] for n in nodes for c in n["status"]["conditions"] if c["type"] == "Ready"]
        assert ready == ["True", "True"]
        pids = cluster.pids()
        assert len(pids) == 5
    assert not any(_alive(p) for p in pids)


def test_restart_apiserver_and_expire_resource_versions(cluster: LocalCluster) -> None:
    cluster.kubectl("create", "configmap", "survives-restart", "--from-literal=a=b")
    old_pid = cluster.processes["kube-apiserver"].pid
    cluster.restart_apiserver()
    assert cluster.processes["kube-apiserver"].pid != old_pid
    out = cluster.kubectl("get", "configmap", "survives-restart", "-o", "jsonpath={.data.a}").stdout
    assert out == "b"
    code, body = cluster.request("/api/v1/namespaces/default/configmaps")
    assert code == 200 and isinstance(body, dict)
    old_rv = body["metadata"]["resourceVersion"]
    cluster.kubectl("create", "configmap", "after-rv", "--from-literal=a=b")
    cluster.expire_resource_versions()
    code, body = cluster.request(f"/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={old_rv}"
                                 "&timeoutSeconds=1")
    # A watch from a compacted resourceVersion is answered with an ERROR event carrying 410 Gone.
    assert code == 200 and isinstance(body, dict)
    assert body["type"] == "ERROR" and body["object"]["code"] == 410, body


def test_real_crds_of_jobset_lws_and_kueue_install(cluster: LocalCluster) -> None:
    """The CRDs come from the projects' pinned Go modules and are served as the projects serve them."""
    for component in (JOBSET, LWS, kueue.cell().crds):
        for path in ensure_binaries((component,)).values():
            assert component.version in str(path)
            cluster.install_crds(path)
    served = cluster.kubectl("api-resources", "-o", "name").stdout.split()
    for resource in ("jobsets.jobset.x-k8s.io", "leaderworkersets.leaderworkerset.x-k8s.io",
                     "resourceflavors.kueue.x-k8s.io", "clusterqueues.kueue.x-k8s.io", "workloads.kueue.x-k8s.io",
                     "multikueueclusters.kueue.x-k8s.io"):
        assert resource in served
    # The real schemas validate: a ClusterQueue quota that is not a quantity is refused.
    bad = cluster.kubectl("apply", "-f", "-", check=False, input=json.dumps({
        "apiVersion": kueue.cell().api, "kind": "ClusterQueue", "metadata": {"name": "bad"},
        "spec": {"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
            {"name": "f", "resources": [{"name": "cpu", "nominalQuota": "lots"}]}]}]}}))
    assert bad.returncode != 0 and "nominalQuota" in bad.stderr
