"""The resource descriptors (kubeindex/model/resources.py): the paths kube-apiserver serves, as
client-go's REST client builds them, and each of this project's kinds as its CRD declares it."""

from __future__ import annotations

import re

import yaml

from kubeindex.model import resources
from kubeindex.model.objects import API_VERSION
from kubeindex.model.resources import (
    CLUSTER_QUEUES,
    LEASES,
    NODES,
    OURS,
    PODS,
    WORKLOAD_SUMMARIES,
    Resource,
)
from tests.paths import CRDS, ROOT


def test_paths_are_the_api_servers() -> None:
    assert NODES.path() == "/api/v1/nodes"
    assert NODES.path(name="n-1", subresource="status") == "/api/v1/nodes/n-1/status"
    assert PODS.path() == "/api/v1/pods"  # every namespace
    assert PODS.path("ml") == "/api/v1/namespaces/ml/pods"
    assert PODS.path("ml", "p-0") == "/api/v1/namespaces/ml/pods/p-0"
    assert LEASES.path("kube-system", "nws") == "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/nws"
    assert WORKLOAD_SUMMARIES.path("ml", "web", "status") == \
        f"/apis/{API_VERSION}/namespaces/ml/workloadsummaries/web/status"
    assert CLUSTER_QUEUES.at("v1beta1").path(name="prod") == "/apis/kueue.x-k8s.io/v1beta1/clusterqueues/prod"
    assert CLUSTER_QUEUES.version == "v1beta2"  # at() made another value


def test_names_are_kubectls() -> None:
    assert PODS.name == "pods" and PODS.api_version == "v1"
    assert LEASES.name == "leases.coordination.k8s.io" and LEASES.api_version == "coordination.k8s.io/v1"
    assert CLUSTER_QUEUES.group_kind == ("kueue.x-k8s.io", "ClusterQueue")


def test_our_kinds_are_declared_as_their_crds_say() -> None:
    crds = {doc["spec"]["names"]["kind"]: doc for path in sorted(CRDS.glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc}
    assert {r.kind for r in OURS} == set(crds)
    for r in OURS:
        spec = crds[r.kind]["spec"]
        served = [v["name"] for v in spec["versions"] if v["served"]]
        assert (r.group, r.plural, r.namespaced, r.api_version) == (
            spec["group"], spec["names"]["plural"], spec["scope"] == "Namespaced", API_VERSION), r
        assert r.version in served, r


def test_every_declared_resource_has_one_plural() -> None:
    declared = [r for r in vars(resources).values() if isinstance(r, Resource)]
    assert len({(r.group, r.plural) for r in declared}) == len(declared)


# Where a declared resource's path may still be written out: the descriptors and their own test,
# and the reflector's tests of the wire (a path is their input, as a recorded request).
SPELLED_OUT = {"kubeindex/model/resources.py", "tests/unit/test_resources.py"}
API_PATH = re.compile(r"""["'](/apis?/[^"']*)["']""")


def test_no_declared_resource_has_a_hand_built_path() -> None:
    """A path to a declared resource is made by its descriptor, in the service, the tooling and the
    tests alike: a string literal that spells one out is found here (by its plural after an
    /api or /apis prefix)."""
    declared = {r.plural for r in vars(resources).values() if isinstance(r, Resource)}
    found = []
    for package in ("kubeindex", "exporter", "reconciler", "node_workload_summary", "localkube", "demo", "bench",
                    "tests", "dashboards", "alerts", "deploy"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel in SPELLED_OUT or "/gomod/" in rel:
                continue
            for line_no, line in enumerate(path.read_text().splitlines(), 1):
                for literal in API_PATH.findall(line):
                    segments = set(re.split(r"[/?]", literal))
                    if segments & declared:
                        found.append(f"{rel}:{line_no}: {literal}")
    assert found == []
