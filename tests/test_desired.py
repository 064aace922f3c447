"""Unit tests of the reconciler's pure parts: names, types, desired objects."""

from __future__ import annotations

import re

from kubeindex.index import ClusterIndex, WorkloadAgg
from kubeindex.objects import WorkloadType
from reconciler.desired import (
    TypeInfo,
    desired_state,
    long_type,
    names_prefix,
    node_claim,
    short_type,
    workload_claim,
)
from reconciler.names import NameAllocator
from tests.reference import Owner
from tests.test_index import make_node, make_pod, ref

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
