"""Unit tests of the reconciler's pure parts: names, types, desired objects."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from kubeindex.index import ClusterIndex, WorkloadAgg
from kubeindex.objects import PodLabelWorkload, WorkloadType
from reconciler.controller import Summary, SummaryMeta, claim_of
from reconciler.desired import (
    LABEL_SHORT_TYPE,
    Desired,
    Naming,
    TypeInfo,
    desired_state,
    label_claim,
    long_type,
    names_prefix,
    node_claim,
    short_type,
    workload_claim,
)
from reconciler.names import NameAllocator
from tests.reference import Owner
from tests.test_index import make_node, make_pod, ref
from tests.test_names import SUBDOMAIN, label_values

DNS = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def node_names(pairs: list[tuple[str, str]]) -> list[str]:
    names = NameAllocator().assign([node_claim(s, v) for s, v in pairs])
    return [names[node_claim(s, v)] for s, v in pairs]


def test_valid_names_are_kept() -> None:
    assert node_names([("gke-nodepool", "pool-a")]) == ["gke-nodepool-pool-a"]


def test_odd_label_values_get_safe_distinct_names() -> None:
    values = ["Pool_A", "pool-a", "pool_a", "POOL.A", "", "x" * 63, "x" * 62 + "y", "-lead", "trail.", "a..b",
              "a.-b", "a-.b"]
    names = node_names([("sum", v) for v in values])
    assert len(set(names)) == len(values), names
    for name in names:
        assert DNS.match(name) and len(name) <= 253, name
    assert names[1] == "sum-pool-a"  # unchanged where valid
    assert node_names([("sum", "Pool_A")]) == names[:1]  # a pure function of the claim where nothing collides


def test_colliding_plain_names_across_summarizers() -> None:
    """`gke` + `pool-a` and `gke-pool` + `a` both want `gke-pool-a`: the first claim placed keeps
    it, the other gets a hashed name, and neither changes when the other comes or goes."""
    allocator = NameAllocator()
    first = allocator.assign([node_claim("gke", "pool-a")])
    assert first == {node_claim("gke", "pool-a"): "gke-pool-a"}
    both = allocator.assign([node_claim("gke", "pool-a"), node_claim("gke-pool", "a")])
    assert both[node_claim("gke", "pool-a")] == "gke-pool-a"
    hashed = both[node_claim("gke-pool", "a")]
    assert hashed != "gke-pool-a" and hashed.startswith("gke-pool-a-")
    assert allocator.assign([node_claim("gke-pool", "a")]) == {node_claim("gke-pool", "a"): hashed}


def test_names_are_read_back_from_existing_objects() -> None:
    """After a restart (a new allocator), an object that exists keeps its name, even a hashed one
    whose plain name is free now."""
    claim = node_claim("gke-pool", "a")
    names = NameAllocator().assign([claim], {claim: ["gke-pool-a-1234567890"]})
    assert names[claim] == "gke-pool-a-1234567890"


def test_short_and_long_types() -> None:
    assert short_type("apps", "Deployment", None) == "deploy"
    assert short_type("jobset.x-k8s.io", "JobSet", None) == "js"
    assert short_type("leaderworkerset.x-k8s.io", "LeaderWorkerSet", "lws") == "lws"
    assert short_type("example.com", "FooBar", None) == "foobar"
    assert short_type("apps", "Deployment", "web") == "web"
    assert long_type("jobset.x-k8s.io", "JobSet", "v1alpha2") == "jobset.jobset.x-k8s.io/v1alpha2"
    assert long_type("", "ReplicationController", "v1") == "replicationcontroller/v1"


def test_names_prefix() -> None:
    assert names_prefix({"gke-a-pool-1", "gke-a-pool-22", "gke-a-pool-3"}) == "gke-a-pool-*"
    assert names_prefix({"only"}) == "only*"
    assert names_prefix({"a", "b"}) == "*"


def test_same_name_different_kinds_disambiguated_deterministically() -> None:
    a = WorkloadAgg("u1", "ns", "train", "batch", "Job")
    b = WorkloadAgg("u2", "ns", "train", "jobset.x-k8s.io", "JobSet")
    c = WorkloadAgg("u3", "other", "train", "batch", "Job")
    claims = [workload_claim(w.namespace, w.group, w.kind, w.name) for w in (a, b, c)]
    for order in (claims, claims[::-1]):
        names = NameAllocator().assign(order)
        assert [names[c] for c in claims][::2] == ["train", "train"]
        assert names[claims[1]].startswith("train-") and names[claims[1]] != "train"


def test_desired_state_from_index() -> None:
    index = ClusterIndex()
    index.set_node_summarizer("pool", "pool")
    index.set_workload_summarizer("w", [WorkloadType(kind="Deployment", group="apps")])
    index.upsert_node(make_node("n-1", {"pool": "a"}))
    index.upsert_node(make_node("n-2", {"pool": "a"}, ready="Unknown"))
    index.upsert_owner(("apps", "Deployment"), "ns", "web", "d1", None)
    index.upsert_owner(("apps", "ReplicaSet"), "ns", "web-1", "r1", ("apps/v1", "Deployment", "d1"))
    rs = Owner("r1", "apps", "ReplicaSet", "ns", "web-1", "d1")
    for i, node in enumerate(["n-1", "n-1", "n-2"]):
        index.upsert_pod(make_pod(f"p{i}", f"p{i}", node=node, owner=ref(rs)))
    infos = {("apps", "Deployment"): TypeInfo("apps/v1", "deploy", "deployment.apps/v1")}
    out = {d.key: d for d in desired_state(index, {"pool": "uid-pool"}, infos)}
    ns = out["pool-a"]
    assert ns.body["spec"] == {"selector": {"matchLabels": {"pool": "a"}}}
    assert ns.body["metadata"]["ownerReferences"][0]["uid"] == "uid-pool"
    assert ns.status["nodeCount"] == 2 and ns.status["nodeNamesPrefix"] == "n-*"
    assert ns.status["conditions"] == [{"type": "Ready", "count": 1}, {"type": "NotReady", "count": 1}]
    assert ns.status["allocatable"] == {"cpu": "8", "memory": "32Gi", "pods": "220"}
    assert ns.status["requested"] == {"cpu": "300m", "memory": "192Mi"}
    assert ns.status["nodesByState"] == {"Ready": 1, "NotReady": 0, "Unknown": 1, "Disrupting": 0, "Cordoned": 0,
                                         "Degraded": 0}
    assert ns.status["unhealthyNodeCount"] == 1 and "unhealthyAccelerators" not in ns.status
    ws = out["ns/web"]
    assert ws.status == {"podCount": 3, "shortType": "deploy", "longType": "deployment.apps/v1",
                         "pods": {"Running": 3}, "podsOnUnhealthyNodes": 1, "podsByNodeState": {"Unknown": 1},
                         "nodeSummaryRefs": [{"name": "pool-a", "nodeCount": 2, "unhealthyNodeCount": 1}],
                         "placement": "pool-a=2"}
    assert ws.body["metadata"]["ownerReferences"] == [{"apiVersion": "apps/v1", "kind": "Deployment",
                                                       "name": "web", "uid": "d1"}]
    # A summarizer not yet seen (no uid) or a type not served gives no objects.
    assert desired_state(index, {}, {}) == []


def test_kind_label_qualified_only_where_kinds_collide() -> None:
    from exporter.metrics import kind_labels

    labels = kind_labels([("batch", "Job"), ("batch.volcano.sh", "Job"), ("apps", "Deployment")])
    assert labels == {("batch", "Job"): "Job.batch", ("batch.volcano.sh", "Job"): "Job.batch.volcano.sh",
                      ("apps", "Deployment"): "Deployment"}


# -- label workloads -------------------------------------------------------------------------------

GANG = "pod-group.scheduling.kubenexus.io/name"
DEPLOYMENT = {("apps", "Deployment"): TypeInfo("apps/v1", "deploy", "deployment.apps/v1")}


def label_index(*values: str, short_type: str | None = "pg") -> ClusterIndex:
    """Deployment `web` (one pod) and pods labelled GANG=<value> for each value, in namespace ns."""
    index = ClusterIndex(workload_pod_labels=["flag.example.com/job"])
    index.set_workload_summarizer("w", [WorkloadType(kind="Deployment", group="apps")],
                                  [PodLabelWorkload(GANG, short_type)])
    index.upsert_owner(("apps", "Deployment"), "ns", "web", "d1", None)
    index.upsert_pod(make_pod("web-1", "w1", owner=ref(Owner("d1", "apps", "Deployment", "ns", "web", None))))
    for i, value in enumerate(values):
        index.upsert_pod(make_pod(f"g{i}", f"g{i}", labels={GANG: value}))
    index.upsert_pod(make_pod("flagged", "f1", labels={"flag.example.com/job": "old"}))
    return index


def workload_summaries(index: ClusterIndex, naming: Naming | None = None) -> dict[str, Desired]:
    return {d.key: d for d in desired_state(index, {}, DEPLOYMENT, naming=naming) if d.plural == "workloadsummaries"}


def test_label_workload_summary() -> None:
    out = workload_summaries(label_index("train", "train", "web"))
    train = out["ns/train"]
    assert train.body["spec"] == {"workloadRef": {"labelKey": GANG, "labelValue": "train"}}
    assert "ownerReferences" not in train.body["metadata"]  # no owner object: the reconciler deletes it
    assert train.status["podCount"] == 2
    assert (train.status["shortType"], train.status["longType"]) == ("pg", f"label/{GANG}")
    # The label value `web` wants the Deployment's name: a different claim, so a hashed name.
    assert out["ns/web"].body["spec"]["workloadRef"]["kind"] == "Deployment"
    (hashed,) = [d for d in out.values() if d.body["spec"]["workloadRef"].get("labelValue") == "web"]
    assert hashed.name.startswith("web-") and DNS.match(hashed.name)
    # The deprecated flag's key names a workload for the metrics, not a summary.
    assert not [d for d in out.values() if d.body["spec"]["workloadRef"].get("labelValue") == "old"]
    assert set(out) == {"ns/train", "ns/web", f"ns/{hashed.name}"}


def test_label_workload_default_short_type() -> None:
    status = workload_summaries(label_index("train", short_type=None))["ns/train"].status
    assert LABEL_SHORT_TYPE == "label" and (status["shortType"], status["longType"]) == ("label", f"label/{GANG}")


def test_label_workload_claims_read_back_from_objects() -> None:
    """After a restart, the claim of an existing object comes from its workloadRef: a label
    workload keeps its hashed name even where the plain one is free now."""
    held = Summary(SummaryMeta(name="web-0123456789", namespace="ns"),
                   spec={"workloadRef": {"labelKey": GANG, "labelValue": "web"}})
    claim = claim_of("workloadsummaries", held)
    assert claim == label_claim("ns", GANG, "web") != workload_claim("ns", "", GANG, "web")
    index = label_index("web")
    index.delete_pod("ns/web-1")
    index.delete_owner(("apps", "Deployment"), "ns/web")
    naming = Naming(NameAllocator(), NameAllocator(), {}, {claim: {"web-0123456789"}})
    assert "ns/web-0123456789" in workload_summaries(index, naming)


@settings(max_examples=150, deadline=None)
@given(st.lists(label_values.filter(bool) | st.sampled_from(["A" * 63, "Gang_A.v2", "web"]), min_size=1,
                max_size=12, unique=True))
def test_any_label_value_gets_a_valid_name_unique_per_claim(values: list[str]) -> None:
    """Upper case, dots, underscores, 63 characters: every pod label value apimachinery allows."""
    out = workload_summaries(label_index(*values))
    by_value = {d.body["spec"]["workloadRef"].get("labelValue"): d.name for d in out.values()}
    assert set(values) <= by_value.keys()
    names = list(by_value.values())
    assert len(set(names)) == len(names)  # unique, the Deployment `web` included
    for name in names:
        assert SUBDOMAIN.fullmatch(name) and len(name) <= 253, name
