"""What `kubectl get workloads` lists, per Kubernetes minor, with Kueue absent and present, and the
in-tree Workload API (scheduling.k8s.io/v1beta1, 1.37 and 1.38) off and on: ours, Kueue's or the
core's. The real kube-apiserver and kubectl of the minor (`make compat` runs this module on every
one, `make test` on the pinned one), our CRDs and one WorkloadSummary; Kueue's real CRDs (the newest
cell's); the core API by its feature gate and runtime-config. docs/kubectl.md's table must say what
each run finds, and `kubectl nws workloads`, `kubectl get wls` and `kubectl get nws` must list ours
in every cell."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo import kueue
from demo.workloads import create, ok
from kubeindex.model.objects import API_VERSION, GROUP
from kubeindex.model.resources import OURS as OUR_RESOURCES
from kubeindex.model.resources import WORKLOAD_SUMMARIES
from localkube.build import PINNED_MINOR
from localkube.cluster import LocalCluster, Options
from tests.paths import CRDS
from tests.support.kubectl import core_cells, documented, plugin_env

pytestmark = pytest.mark.compat

NS = "nws-names"
WHO = {GROUP: "ours", "kueue.x-k8s.io": "Kueue's", "scheduling.k8s.io": "the core's"}
OUR_KINDS = {r.plural for r in OUR_RESOURCES}


def minor_of(config: pytest.Config) -> str:
    return str(config.getoption("kubernetes") or PINNED_MINOR)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "core_api" in metafunc.fixturenames:
        metafunc.parametrize("core_api", core_cells(minor_of(metafunc.config)),
                             ids=lambda on: "core-api-on" if on else "core-api-off")


def resolved(cluster: LocalCluster, name: str, cache: Path) -> tuple[str, subprocess.CompletedProcess[str]]:
    """What `kubectl get NAME -n NS` lists: "ours (resource.group/version)" and so on, read from the
    request kubectl makes (-v=6), with a discovery cache of its own (what a first use resolves);
    and the same command's plain output."""
    argv = [str(cluster.kubectl_path), f"--kubeconfig={cluster.kubeconfig}", f"--cache-dir={cache}"]
    traced = subprocess.run([*argv, "get", name, "-n", NS, "-v=6"], capture_output=True, text=True, timeout=60)
    paths = re.findall(rf"https://[^\s\"']+?(/apis?/[^\s\"'?]*/namespaces/{NS}/[a-z]+)\b", traced.stderr)
    assert paths, traced.stderr[-3000:]
    parts = paths[-1].strip("/").split("/")
    group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
    plain = subprocess.run([*argv, "get", name, "-n", NS], capture_output=True, text=True, timeout=60)
    return f"{WHO.get(group, group)} ({parts[-1]}.{group}/{version})", plain


def discovery(cluster: LocalCluster) -> list[dict]:
    """Every resource the server serves (its preferred and other versions): name, singularName,
    shortNames, categories, group."""
    def get(path: str) -> dict:
        code, body = cluster.request(path)
        assert code == 200 and isinstance(body, dict), (path, code, body)
        return body

    out = [{**r, "group": ""} for r in get("/api/v1")["resources"]]
    for group in get("/apis")["groups"]:
        for version in group["versions"]:
            out += [{**r, "group": group["name"]} for r in get(f"/apis/{version['groupVersion']}")["resources"]
                    if "/" not in r["name"]]
    return out


def names_of(resource: dict) -> set[str]:
    return {resource["name"], resource.get("singularName") or "", *(resource.get("shortNames") or [])} - {""}


@pytest.fixture
def plane(binaries: dict[str, Path], core_api: bool) -> Iterator[LocalCluster]:
    with LocalCluster(Options(workload_api=core_api), binaries) as c:
        yield c


def _plugin(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(cluster.kubectl_path), "nws", *args, f"--kubeconfig={cluster.kubeconfig}"],
                          capture_output=True, text=True, timeout=60, env=plugin_env())


def test_what_kubectl_get_workloads_lists(plane: LocalCluster, core_api: bool, pytestconfig: pytest.Config) -> None:
    minor = minor_of(pytestconfig)
    code, version = plane.request("/version")
    assert code == 200 and isinstance(version, dict) and version["gitVersion"].startswith(f"v{minor}."), version
    core = "on" if core_api else "off"
    served = {r["group"] for r in discovery(plane) if r["name"] == "workloads"}
    assert served == ({"scheduling.k8s.io"} if core_api else set()), served

    # Before our CRDs: the plugin says so, in one line.
    missing = _plugin(plane, "workloads", "-A")
    assert missing.returncode == 1 and missing.stderr.startswith(
        "error: the server does not serve workloadsummaries.ux.sean.example.com"), missing.stderr

    plane.install_crds(CRDS)
    plane.kubectl("create", "namespace", NS)
    create(plane, WORKLOAD_SUMMARIES.path(NS),
           {"apiVersion": API_VERSION, "kind": "WorkloadSummary", "metadata": {"name": "ours", "namespace": NS}})
    ok(plane.request(WORKLOAD_SUMMARIES.path(NS, "ours", "status"), "PATCH",
                     {"status": {"podCount": 3, "shortType": "deploy", "longType": "deployment.apps/v1"}},
                     content_type="application/merge-patch+json"))
    table = documented()
    for present in (False, True):
        if present:
            kueue.install_kueue(plane)
        cell = (minor, "present" if present else "absent", core)
        lists, plain = resolved(plane, "workloads", plane.workdir / f"cache-{cell[1]}-plural")
        singular, _ = resolved(plane, "workload", plane.workdir / f"cache-{cell[1]}-singular")
        print(f"\n[{' / '.join(cell)}] kubectl get workloads -> {lists}; workload -> {singular}\n"
              f"$ kubectl get workloads -n {NS}\n{plain.stdout}{plain.stderr}")
        assert (lists, singular) == (table[cell]["`kubectl get workloads`"], table[cell]["`kubectl get workload`"])
        if lists.startswith("ours"):
            assert plain.stdout.split()[:5] == ["NAME", "N_PODS", "SHORT_TYPE", "LONG_TYPE", "UNHEALTHY"], plain
        else:
            assert "ours" not in plain.stdout and "No resources found" in plain.stderr, plain

        # Ours, in every cell: the plugin, the short name wls, the category nws.
        listed = _plugin(plane, "workloads", "-A")
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.splitlines()[1].split()[:4] == [NS, "ours", "3", "deploy"], listed.stdout
        print(f"$ kubectl nws workloads -A\n{listed.stdout}")
        wls = plane.kubectl("get", "wls", "-n", NS, "-o", "name").stdout.split()
        assert wls == [f"workloadsummary.{GROUP}/ours"]
        category = plane.kubectl("get", "nws", "-A", "-o", "name").stdout.split()
        assert category == [f"workloadsummary.{GROUP}/ours"], category  # the only object of our kinds here

        # No other resource claims our short names or our category; `workloads` and `workload` are
        # the plural and singular of exactly the ones the table names.
        resources = discovery(plane)
        ours = [r for r in resources if r["group"] == GROUP]
        assert {r["name"] for r in ours} == OUR_KINDS and all(r.get("categories") == ["nws"] for r in ours)
        others = [r for r in resources if r["group"] != GROUP]
        for short in {s for r in ours for s in r.get("shortNames") or []} - {"workloads", "workload"}:
            assert not [r["name"] for r in others if short in names_of(r)], short
        assert not [r for r in others if "nws" in names_of(r) or "nws" in (r.get("categories") or [])]
        claim = {r["group"] for r in others if {"workloads", "workload"} & names_of(r)}
        assert claim == {g for g, on in (("kueue.x-k8s.io", present), ("scheduling.k8s.io", core_api)) if on}
