"""The five CRDs on a real kube-apiserver: installation, validation, printer columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubeindex.model.objects import API_VERSION, GROUP
from kubeindex.model.resources import NODE_SUMMARIES, WORKLOAD_SUMMARIES
from localkube.build import KUEUE, ensure_binaries
from localkube.cluster import LocalCluster, Options
from localkube.service import wait_for
from tests.paths import CRDS, EXAMPLES
from tests.support.crds import KINDS

pytestmark = pytest.mark.compat  # one of the core scenarios make compat runs on every Kubernetes minor


def _create(cluster: LocalCluster, manifest: dict) -> tuple[int, str]:
    proc = cluster.kubectl("create", "-f", "-", input=json.dumps(manifest), check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _nodesummarizer(name: str, label_key: str) -> dict:
    return {"apiVersion": API_VERSION, "kind": "NodeSummarizer", "metadata": {"name": name},
            "spec": {"labelKey": label_key}}


def _workloadsummarizer(name: str, types: list[dict]) -> dict:
    return {"apiVersion": API_VERSION, "kind": "WorkloadSummarizer", "metadata": {"name": name},
            "spec": {"workloadTypes": types}}


def test_all_crds_established(cluster: LocalCluster) -> None:
    scopes = {}
    for plural in KINDS:
        crd = json.loads(cluster.kubectl("get", "crd", f"{plural}.{GROUP}", "-o", "json").stdout)
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions["Established"] == "True", plural
        assert conditions["NamesAccepted"] == "True", plural
        version = crd["spec"]["versions"][0]
        assert version["name"] == "v1alpha1"
        assert version["subresources"] == {"status": {}}, plural
        scopes[plural] = crd["spec"]["scope"]
    assert scopes == {"clusterresourceclaims": "Cluster", "nodesummarizers": "Cluster", "nodesummaries": "Cluster",
                      "workloadsummarizers": "Cluster", "workloadsummaries": "Namespaced"}


def test_design_doc_examples_are_accepted(cluster: LocalCluster) -> None:
    out = cluster.kubectl("apply", "-f", str(EXAMPLES), "-o", "name").stdout.split()
    assert f"nodesummarizer.{GROUP}/gke-nodepool" in out
    assert f"workloadsummarizer.{GROUP}/ai-workloads" in out
    assert f"clusterresourceclaim.{GROUP}/a100" in out
    wsz = json.loads(cluster.kubectl("get", "workloadsummarizer", "ai-workloads", "-o", "json").stdout)
    types = {t["kind"]: t for t in wsz["spec"]["workloadTypes"]}
    assert types["JobSet"]["version"] == "v1alpha2"
    assert "version" not in types["LeaderWorkerSet"]
    assert types["Deployment"]["group"] == "apps"


def test_workload_types_version_and_short_type_optional(cluster: LocalCluster) -> None:
    code, out = _create(cluster, _workloadsummarizer("minimal", [{"group": "apps", "kind": "StatefulSet"}]))
    assert code == 0, out
    code, out = _create(cluster, _workloadsummarizer("core-group", [{"kind": "ReplicationController"}]))
    assert code == 0, out


@pytest.mark.parametrize(
    "label_key",
    [
        "cloud.google.com/gke-nodepool",
        "karpenter.sh/nodepool",
        "pool",
        "node.kubernetes.io/instance-type",
        "a" * 63,
        "Upper_case.ok",
    ],
)
def test_valid_label_keys(cluster: LocalCluster, label_key: str) -> None:
    name = f"valid-{abs(hash(label_key)) % 10**8}"
    code, out = _create(cluster, _nodesummarizer(name, label_key))
    assert code == 0, out
    cluster.kubectl("delete", "nodesummarizer", name)


@pytest.mark.parametrize(
    "label_key",
    [
        "has space",
        "-leading-dash",
        "trailing-dash-",
        "a" * 64,  # name part longer than 63
        "UPPER.example.com/pool",  # prefix must be lower case
        "a/b/c",
        "/pool",
        "",
    ],
)
def test_invalid_label_key_rejected_naming_the_field(cluster: LocalCluster, label_key: str) -> None:
    code, out = _create(cluster, _nodesummarizer("bad-key", label_key))
    assert code != 0
    assert "spec.labelKey" in out, out


def test_missing_label_key_rejected(cluster: LocalCluster) -> None:
    manifest = _nodesummarizer("no-key", "x")
    manifest["spec"] = {}
    code, out = _create(cluster, manifest)
    assert code != 0
    assert "spec.labelKey" in out and "Required" in out, out


def test_empty_workload_types_rejected(cluster: LocalCluster) -> None:
    code, out = _create(cluster, _workloadsummarizer("empty", []))
    assert code != 0
    assert "spec.workloadTypes" in out, out


def test_missing_kind_rejected(cluster: LocalCluster) -> None:
    code, out = _create(cluster, _workloadsummarizer("no-kind", [{"group": "apps", "version": "v1"}]))
    assert code != 0
    assert "spec.workloadTypes[0].kind" in out and "Required" in out, out


def test_resource_name_instead_of_kind_rejected(cluster: LocalCluster) -> None:
    code, out = _create(cluster, _workloadsummarizer("plural", [{"group": "apps", "kind": "deployments"}]))
    assert code != 0
    assert "spec.workloadTypes[0].kind" in out and "CamelCase" in out, out


def test_pod_as_workload_type_rejected(cluster: LocalCluster) -> None:
    code, out = _create(cluster, _workloadsummarizer("pods", [{"kind": "Pod"}]))
    assert code != 0
    assert "spec.workloadTypes[0]" in out and "Pod is not a workload type" in out, out


def test_duplicate_workload_type_rejected(cluster: LocalCluster) -> None:
    types = [{"group": "apps", "kind": "Deployment"}, {"group": "apps", "kind": "Deployment", "shortType": "d"}]
    code, out = _create(cluster, _workloadsummarizer("dup", types))
    assert code != 0
    assert "spec.workloadTypes[1]" in out and "Duplicate" in out, out


def _label_summarizer(name: str, entries: list[dict]) -> dict:
    return {"apiVersion": API_VERSION, "kind": "WorkloadSummarizer", "metadata": {"name": name},
            "spec": {"podLabelWorkloads": entries}}


def test_pod_label_workloads_alone_or_beside_workload_types(cluster: LocalCluster) -> None:
    code, out = _create(cluster, _label_summarizer("gangs", [
        {"labelKey": "pod-group.scheduling.kubenexus.io/name", "shortType": "pg"},
        {"labelKey": "volcano.sh/job-name"}, {"labelKey": "Upper_case.ok"}]))
    assert code == 0, out
    both = _workloadsummarizer("both", [{"group": "apps", "kind": "Deployment"}])
    both["spec"]["podLabelWorkloads"] = [{"labelKey": "volcano.sh/job-name"}]
    code, out = _create(cluster, both)
    assert code == 0, out
    cluster.kubectl("delete", "workloadsummarizer", "gangs", "both")


def test_a_summarizer_listing_nothing_is_rejected(cluster: LocalCluster) -> None:
    code, out = _create(cluster, {"apiVersion": API_VERSION, "kind": "WorkloadSummarizer",
                                  "metadata": {"name": "nothing"}, "spec": {}})
    assert code != 0
    assert "must list workloadTypes, podLabelWorkloads or both" in out, out


@pytest.mark.parametrize(("entries", "field", "says"), [
    ([{"labelKey": "has space"}], "spec.podLabelWorkloads[0].labelKey", "must be a valid label key"),
    ([{"labelKey": "UPPER.example.com/x"}], "spec.podLabelWorkloads[0].labelKey", "must be a valid label key"),
    ([{"labelKey": "a" * 64}], "spec.podLabelWorkloads[0].labelKey", "must be a valid label key"),
    ([{"shortType": "pg"}], "spec.podLabelWorkloads[0].labelKey", "Required"),
    ([{"labelKey": "x", "shortType": "Not_OK"}], "spec.podLabelWorkloads[0].shortType", "lower-case"),
    ([{"labelKey": "x"}, {"labelKey": "x", "shortType": "y"}], "spec.podLabelWorkloads[1]", "Duplicate"),
    # "should have at least 1 items" up to 1.37, "Too few: 0: must have at least 1 item" from 1.38.
    ([], "spec.podLabelWorkloads", "at least 1 item"),
])
def test_invalid_pod_label_workloads_rejected_naming_the_field(cluster: LocalCluster, entries: list[dict],
                                                               field: str, says: str) -> None:
    code, out = _create(cluster, _label_summarizer("bad-labels", entries))
    assert code != 0
    assert field in out and says in out, out


@pytest.mark.parametrize(("ref", "valid"), [
    ({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u"}, True),
    ({"labelKey": "volcano.sh/job-name", "labelValue": "Gang_A.v2"}, True),
    ({"labelKey": "volcano.sh/job-name"}, False),
    ({"labelKey": "volcano.sh/job-name", "labelValue": "a", "kind": "Deployment"}, False),
])
def test_workload_ref_is_an_object_or_a_pod_label(cluster: LocalCluster, ref: dict, valid: bool) -> None:
    cluster.kubectl("create", "namespace", "refs", check=False)
    code, out = _create(cluster, {"apiVersion": API_VERSION, "kind": "WorkloadSummary",
                                  "metadata": {"name": "ref", "namespace": "refs"}, "spec": {"workloadRef": ref}})
    assert (code == 0) == valid, out
    if valid:
        cluster.kubectl("delete", "workloadsummary", "ref", "-n", "refs")
    else:
        assert "spec.workloadRef" in out and "a pod label reference has labelKey and labelValue" in out, out


def test_node_summary_selector_is_immutable(cluster: LocalCluster) -> None:
    summary = {
        "apiVersion": API_VERSION, "kind": "NodeSummary", "metadata": {"name": "immutable-pool-a"},
        "spec": {"selector": {"matchLabels": {"cloud.google.com/gke-nodepool": "pool-a"}}},
    }
    code, out = _create(cluster, summary)
    assert code == 0, out
    patch = json.dumps({"spec": {"selector": {"matchLabels": {"cloud.google.com/gke-nodepool": "pool-b"}}}})
    proc = cluster.kubectl("patch", "nodesummary", "immutable-pool-a", "--type=merge", "-p", patch, check=False)
    assert proc.returncode != 0
    assert "spec.selector" in proc.stderr and "immutable" in proc.stderr, proc.stderr
    # An unchanged selector (e.g. a label on the object) is still accepted.
    proc = cluster.kubectl("label", "nodesummary", "immutable-pool-a", "team=infra", check=False)
    assert proc.returncode == 0, proc.stderr


def _set_status(cluster: LocalCluster, path: str, status: dict) -> None:
    code, body = cluster.request(f"{path}/status", "PATCH", {"status": status},
                                 content_type="application/merge-patch+json")
    assert code == 200, body


def test_kubectl_get_workloads_columns(cluster: LocalCluster) -> None:
    cluster.kubectl("create", "namespace", "team-a")
    code, out = _create(cluster, {"apiVersion": API_VERSION, "kind": "WorkloadSummary",
                                  "metadata": {"name": "trainer", "namespace": "team-a"}})
    assert code == 0, out
    _set_status(cluster, WORKLOAD_SUMMARIES.path("team-a", "trainer"), {
        "podCount": 12, "shortType": "js", "longType": "jobset.jobset.x-k8s.io/v1alpha2",
        "nodeSummaryRefs": [{"name": "gke-nodepool-tpu-v5", "nodeCount": 3},
                            {"name": "gke-nodepool-cpu", "nodeCount": 1}],
        "placement": "gke-nodepool-tpu-v5=3,gke-nodepool-cpu=1", "podsOnUnhealthyNodes": 4,
    })
    lines = cluster.kubectl("get", "workloads", "-n", "team-a").stdout.splitlines()
    assert lines[0].split()[:8] == ["NAME", "N_PODS", "SHORT_TYPE", "LONG_TYPE", "UNHEALTHY", "AT_RISK", "GANGS",
                                    "AGE"], lines
    assert lines[1].split()[:5] == ["trainer", "12", "js", "jobset.jobset.x-k8s.io/v1alpha2", "4"], lines
    wide = cluster.kubectl("get", "workloads.ux", "-n", "team-a", "-o", "wide").stdout.splitlines()
    assert "PLACEMENT" in wide[0] and "gke-nodepool-tpu-v5=3,gke-nodepool-cpu=1" in wide[1], wide


def test_kubectl_get_nodesummaries_columns(cluster: LocalCluster) -> None:
    code, out = _create(cluster, {
        "apiVersion": API_VERSION, "kind": "NodeSummary", "metadata": {"name": "gke-nodepool-gpu"},
        "spec": {"selector": {"matchLabels": {"cloud.google.com/gke-nodepool": "gpu"}}},
    })
    assert code == 0, out
    _set_status(cluster, NODE_SUMMARIES.path(name="gke-nodepool-gpu"), {
        "nodeCount": 4, "nodeNamesPrefix": "gke-gpu-*",
        "conditions": [{"type": "Ready", "count": 3}, {"type": "NotReady", "count": 1}],
        "allocatable": {"cpu": "380", "memory": "1.5Ti", "nvidia.com/gpu": "32"},
        "unschedulableCount": 1, "podCount": 17, "unhealthyNodeCount": 1,
    })
    lines = cluster.kubectl("get", "nodesummaries", "gke-nodepool-gpu").stdout.splitlines()
    assert lines[0].split() == ["NAME", "NODES", "READY", "NOT", "READY", "CPU", "MEMORY", "GPU", "UNHEALTHY",
                                "BLOCKED", "AGE"], lines
    assert lines[1].split()[:8] == ["gke-nodepool-gpu", "4", "3", "1", "380", "1.5Ti", "32", "1"], lines
    wide = cluster.kubectl("get", "nodesummaries", "gke-nodepool-gpu", "-o", "wide").stdout.splitlines()
    assert "CORDONED" in wide[0] and "gke-gpu-*" in wide[1], wide


def test_kubectl_get_workloads_where_kueue_is_installed(binaries: dict[str, Path]) -> None:
    """kubectl prefers a resource whose plural is `workloads` over our shortName; `workloads.ux`
    always means ours."""
    with LocalCluster(Options(), binaries) as c:
        c.install_crds(CRDS)
        c.kubectl("create", "namespace", "team-a")
        code, out = _create(c, {"apiVersion": API_VERSION, "kind": "WorkloadSummary",
                                "metadata": {"name": "ours", "namespace": "team-a"}})
        assert code == 0, out
        assert "ours" in c.kubectl("get", "workloads", "-n", "team-a").stdout  # no Kueue: our shortName
        c.install_crds(ensure_binaries((KUEUE,))["kueue-crds.yaml"])  # Kueue's real CRDs
        # kubectl resolves `workloads` from its discovery cache, written before Kueue came, and
        # nothing invalidates it while the name resolves; `kubectl api-resources` refreshes it.
        assert "workloads.kueue.x-k8s.io" in c.kubectl("api-resources", "-o", "name").stdout
        wait_for(lambda: "ours" not in c.kubectl("get", "workloads", "-n", "team-a", check=False).stdout, timeout=30)
        proc = c.kubectl("get", "workloads", "-n", "team-a", check=False)
        assert "No resources found" in proc.stderr  # Kueue's (empty) Workloads, silently
        assert "ours" in c.kubectl("get", "workloads.ux", "-n", "team-a").stdout
