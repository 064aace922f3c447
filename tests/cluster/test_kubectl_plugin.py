"""`kubectl nws` as kubectl runs it (the real kubectl finds `kubectl-nws` on PATH) against the
session's control plane, where it must print what `kubectl get` prints for the same summaries. Its
pure logic: tests/unit/test_kubectl_plugin.py."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from demo.workloads import create, ok
from kubeindex.model.objects import API_VERSION
from kubeindex.model.resources import NODE_SUMMARIES, WORKLOAD_SUMMARIES
from localkube.cluster import LocalCluster, free_port
from node_workload_summary import kubectl as nws
from tests.kube import create_node, token_kubeconfig
from tests.support.kubectl import PLUGIN, plugin_env


def run_plugin(cluster: LocalCluster, *args: str, kubeconfig: Path | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`kubectl nws ARGS --kubeconfig ...` through the real kubectl, as a user types it."""
    argv = [str(cluster.kubectl_path), "nws", *args, f"--kubeconfig={kubeconfig or cluster.kubeconfig}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env or plugin_env())


def _status(cluster: LocalCluster, path: str, status: dict) -> None:
    ok(cluster.request(f"{path}/status", "PATCH", {"status": status}, content_type="application/merge-patch+json"))


def _workload(cluster: LocalCluster, namespace: str, name: str, refs: dict[str, tuple[int, int]], pods: int,
              unhealthy: int = 0, short: str = "deploy") -> None:
    create(cluster, WORKLOAD_SUMMARIES.path(namespace),
           {"apiVersion": API_VERSION, "kind": "WorkloadSummary", "metadata": {"name": name, "namespace": namespace}})
    _status(cluster, WORKLOAD_SUMMARIES.path(namespace, name), {
        "podCount": pods, "shortType": short, "longType": "deployment.apps/v1", "podsOnUnhealthyNodes": unhealthy,
        "nodeSummaryRefs": [{"name": p, "nodeCount": n, "unhealthyNodeCount": u} for p, (n, u) in refs.items()],
        "placement": ",".join(f"{p}={n}" for p, (n, _) in refs.items())})


def _pool(cluster: LocalCluster, name: str, value: str, nodes: int, ready: int) -> None:
    create(cluster, NODE_SUMMARIES.path(), {
        "apiVersion": API_VERSION, "kind": "NodeSummary", "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"nws-test-pool": value}}}})
    _status(cluster, NODE_SUMMARIES.path(name=name), {
        "nodeCount": nodes,
        "conditions": [{"type": "Ready", "count": ready}, {"type": "NotReady", "count": nodes - ready}],
        "allocatable": {"cpu": str(8 * nodes), "memory": f"{32 * nodes}Gi"}, "unhealthyNodeCount": nodes - ready,
        "nodeNamesPrefix": f"{value}-*"})


@pytest.fixture(scope="module")
def summaries(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """Two pools (NodeSummaries) and four workloads (WorkloadSummaries) in two namespaces, as the
    reconciler writes them; and a node of pool a."""
    for ns in ("nws-a", "nws-b"):
        cluster.kubectl("create", "namespace", ns)
    _pool(cluster, "pool-a", "a", nodes=4, ready=3)
    _pool(cluster, "pool-b", "b", nodes=2, ready=2)
    _workload(cluster, "nws-a", "web", {"pool-a": (3, 1)}, pods=8, unhealthy=2)
    _workload(cluster, "nws-a", "train", {"pool-a": (1, 0), "pool-b": (2, 0)}, pods=12, short="js")
    _workload(cluster, "nws-b", "batch", {"pool-b": (1, 0)}, pods=1, short="job")
    _workload(cluster, "nws-b", "idle", {}, pods=0)
    create_node(cluster, "nws-a-1", {"nws-test-pool": "a"})
    yield cluster


def _same_age(text: str) -> str:
    """Ages tick between two commands: one word for any age at a line's end."""
    return re.sub(r"\b\d+[smhd]\S*$", "AGE", text, flags=re.M)


@pytest.mark.parametrize("args", [
    ("workloads", "-A"), ("workloads", "-A", "-o", "wide"), ("workloads", "-n", "nws-a"),
    ("workloads", "-A", "--no-headers"), ("workloads", "-A", "-o", "name"), ("pools",), ("pools", "-o", "wide"),
], ids=lambda a: " ".join(a))
def test_prints_what_kubectl_get_prints(summaries: LocalCluster, args: tuple[str, ...]) -> None:
    kind = "workloadsummaries.ux.sean.example.com" if args[0] == "workloads" else "nodesummaries.ux.sean.example.com"
    theirs = summaries.kubectl("get", kind, *args[1:])
    ours = run_plugin(summaries, *args)
    assert ours.returncode == 0, ours.stderr
    assert _same_age(ours.stdout) == _same_age(theirs.stdout), (ours.stdout, theirs.stdout)
    if args[0] == "workloads" and "-A" in args:
        assert {"web", "train", "batch", "idle"} <= set(re.findall(r"\b(web|train|batch|idle)\b", ours.stdout))


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_objects_are_kubectls(summaries: LocalCluster, output: str) -> None:
    ours = run_plugin(summaries, "workloads", "-A", "-o", output)
    assert ours.returncode == 0, ours.stderr
    theirs = yaml.safe_load(summaries.kubectl("get", "workloadsummaries.ux", "-A", "-o", output).stdout)
    mine = yaml.safe_load(ours.stdout)
    assert mine["kind"] == theirs["kind"] == "List"
    assert [i["metadata"]["uid"] for i in mine["items"]] == [i["metadata"]["uid"] for i in theirs["items"]]
    assert mine["items"] == theirs["items"]


def test_the_context_and_its_namespace(summaries: LocalCluster) -> None:
    config = yaml.safe_load(summaries.kubeconfig.read_text())
    main = config["contexts"][0]
    config["contexts"] = [{"name": "team-a", "context": {**main["context"], "namespace": "nws-a"}},
                          {"name": "team-b", "context": {**main["context"], "namespace": "nws-b"}}]
    config["current-context"] = "team-a"
    path = summaries.workdir / "two-contexts.kubeconfig"
    path.write_text(json.dumps(config))
    names = {ctx: run_plugin(summaries, "workloads", "-o", "name", *(["--context", ctx] if ctx else []),
                             kubeconfig=path).stdout.split() for ctx in ("", "team-b")}
    assert names[""] == [f"workloadsummary.ux.sean.example.com/{n}" for n in ("train", "web")]  # the context's
    assert names["team-b"] == [f"workloadsummary.ux.sean.example.com/{n}" for n in ("batch", "idle")]
    proc = run_plugin(summaries, "workloads", "--context", "nope", kubeconfig=path)
    assert proc.returncode == 1 and proc.stderr.startswith("error: ") and "nope" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    # $KUBECONFIG, as kubectl reads it.
    proc = subprocess.run([str(summaries.kubectl_path), "nws", "workloads", "-o", "name"], capture_output=True,
                          text=True, timeout=60, env=plugin_env(KUBECONFIG=str(path)))
    assert proc.stdout.split() == names[""], proc.stderr


def test_impact_of_a_pool_and_of_a_node(summaries: LocalCluster) -> None:
    proc = run_plugin(summaries, "impact", "pool/pool-a")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == nws.IMPACT_HEADERS
    assert [line.split() for line in lines[1:]] == [  # the unhealthy first
        ["nws-a", "web", "deploy", "pool-a", "3", "1", "8", "2"],
        ["nws-a", "train", "js", "pool-a", "1", "0", "12", "0"]]
    assert run_plugin(summaries, "impact", "pool/a").stdout == proc.stdout  # the pool's label value
    node = run_plugin(summaries, "impact", "node/nws-a-1")
    assert node.returncode == 0 and node.stdout == proc.stdout, node.stderr
    assert "node nws-a-1 is in pool pool-a" in node.stderr and "not which" in node.stderr
    scoped = run_plugin(summaries, "impact", "pool/pool-b", "-n", "nws-b", "-o", "name")
    assert scoped.stdout.split() == ["workloadsummary.ux.sean.example.com/batch"]
    listed = yaml.safe_load(run_plugin(summaries, "impact", "pool/pool-b", "-o", "yaml").stdout)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["train", "batch"]
    for target, says in (("pool/nope", 'no NodeSummary "nope"'), ("node/nope", 'nodes "nope" not found'),
                         ("nope", "pool/NAME")):
        bad = run_plugin(summaries, "impact", target)
        assert bad.returncode == 1 and says in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_clear_errors_no_cluster_no_config_forbidden(summaries: LocalCluster, tmp_path: Path) -> None:
    config = yaml.safe_load(summaries.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"  # nothing listens
    down = tmp_path / "down.kubeconfig"
    down.write_text(json.dumps(config))
    proc = run_plugin(summaries, "workloads", kubeconfig=down)
    assert proc.returncode == 1, proc.stdout
    assert proc.stderr.startswith("error: no answer from the API server at https://127.0.0.1:"), proc.stderr
    assert "--context" in proc.stderr and "Traceback" not in proc.stderr

    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in plugin_env(HOME=str(home)).items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    proc = subprocess.run([str(summaries.kubectl_path), "nws", "pools"], capture_output=True, text=True, timeout=60,
                          env=env)
    assert proc.returncode == 1 and proc.stderr.startswith("error: no Kubernetes API configuration"), proc.stderr

    summaries.kubectl("create", "serviceaccount", "nws-nobody", "-n", "nws-a")
    nobody = token_kubeconfig(summaries, "nws-nobody", "nws-a")
    proc = run_plugin(summaries, "workloads", "-A", kubeconfig=nobody)
    assert proc.returncode == 1, proc.stdout
    assert proc.stderr.startswith("Error from server (Forbidden): workloadsummaries.ux.sean.example.com is "
                                  'forbidden: User "system:serviceaccount:nws-a:nws-nobody" cannot list'), proc.stderr


def test_kubectl_finds_the_plugin(summaries: LocalCluster) -> None:
    proc = subprocess.run([str(summaries.kubectl_path), "plugin", "list"], capture_output=True, text=True,
                          timeout=60, env=plugin_env())
    assert str(PLUGIN) in proc.stdout, proc.stdout + proc.stderr
    empty = run_plugin(summaries, "workloads", "-n", "nws-empty")
    assert empty.returncode == 0 and empty.stdout == ""
    assert empty.stderr.strip() == "No resources found in nws-empty namespace."
