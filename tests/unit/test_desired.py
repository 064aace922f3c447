"""Unit tests of the reconciler's pure parts: names, types, desired objects."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeindex.model.index import NODE_STATES, PHASES, ClusterIndex, NodeGroupAgg, WorkloadAgg
from kubeindex.model.objects import PodLabelWorkload, Taint, WorkloadType, long_type
from kubeindex.model.quantity import parse_nano
from kubeindex.model.revision import Stamped
from kubeindex.watch.discovery import describe
from reconciler.desired import (
    LABEL_SHORT_TYPE,
    NODE_SUMMARY_STATUS,
    WORKLOAD_SUMMARY_STATUS,
    Cache,
    Desired,
    Layout,
    Made,
    Naming,
    TypeInfo,
    desired_all,
    desired_one,
    desired_state,
    label_claim,
    layout,
    made_from,
    names_prefix,
    node_claim,
    short_type,
    workload_claim,
)
from reconciler.names import NameAllocator
from reconciler.summaries import Summary, SummaryMeta, claim_of_summary
from tests.builders import SUBDOMAIN, label_values, make_node, make_pod, ref
from tests.paths import CRDS
from tests.reference import Owner, old_from_new, old_quantity
from tests.scenario import KINDS, Scenario

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
    # Messages name a kind at a version the same way (docs/troubleshooting.md).
    assert describe(("batch", "Job", "v2")) == "job.batch/v2" and describe(("", "Pod", None)) == "Pod (core)"


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
    assert ns.status["nodesByState"] == {"Ready": 1, "Unknown": 1}  # states with no node left out
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
    claim = claim_of_summary("workloadsummaries", held)
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


# -- the NodeSummary's size, and that its shape since v1alpha1's first loses nothing --------------

def old_shape(agg: NodeGroupAgg) -> dict[str, Any]:
    """A NodeSummary status in the first v1alpha1 shape, computed from the aggregate as it was."""
    not_ready = agg.conditions.get("NotReady", 0) + agg.conditions.get("Unknown", 0)
    status = {
        "nodeCount": agg.nodes, "nodeNamesPrefix": names_prefix(agg.node_names),
        "conditions": [{"type": "Ready", "count": agg.conditions.get("Ready", 0)},
                       {"type": "NotReady", "count": not_ready}],
        "unschedulableCount": agg.unschedulable, "podCount": sum(agg.pods.values()),
        "pods": {p: agg.pods[p] for p in PHASES if agg.pods.get(p)},
        **{field: {r: old_quantity(r, v) for r, v in sorted(getattr(agg, name).items())}
           for field, name in (("allocatable", "allocatable"), ("capacity", "capacity"), ("requested", "requested"),
                               ("unhealthyAccelerators", "accelerators_unhealthy"))},
        "nodesByState": {s: agg.states.get(s, 0) for s in NODE_STATES},
        "unhealthyNodeCount": sum(n for s, n in agg.states.items() if s not in ("Ready", "Cordoned")),
    }
    return {k: v for k, v in status.items() if v not in ({}, [], "", None)}


node_specs = st.fixed_dictionaries({
    "ready": st.sampled_from(["True", "True", "False", "Unknown", None]),
    "unschedulable": st.booleans(),
    "disrupted": st.booleans(),
    "problem": st.booleans(),
    "cpu": st.sampled_from(["4", "31850m", "0.5", "2000", "1k", "250u"]),
    "memory": st.sampled_from(["16Gi", "32880576Ki", "96G", "1500", "120Gi", "1Ki"]),
    "storage": st.sampled_from(["95Gi", "94580335255", "100G"]),
    "gpus": st.sampled_from([None, ("8", "8"), ("8", "6")]),
    "pods": st.lists(st.tuples(st.sampled_from(["Running", "Pending", "Succeeded", "Failed"]),
                               st.sampled_from(["100m", "500m", "1", "1u", "0.0005", "2k"])), max_size=4),
})


@settings(max_examples=150, deadline=None)
@given(st.lists(node_specs, min_size=1, max_size=8))
def test_every_field_of_the_old_shape_is_computed_from_the_new(specs: list[dict[str, Any]]) -> None:
    index = ClusterIndex()
    index.set_node_summarizer("pool", "pool")
    for i, spec in enumerate(specs):
        alloc = {"cpu": spec["cpu"], "memory": spec["memory"], "pods": "110", "ephemeral-storage": spec["storage"]}
        capacity = dict(alloc)
        if spec["gpus"]:
            capacity["nvidia.com/gpu"], alloc["nvidia.com/gpu"] = spec["gpus"]
        index.upsert_node(make_node(f"n-{i}", {"pool": "a"}, ready=spec["ready"], unschedulable=spec["unschedulable"],
                                    allocatable=alloc, capacity=capacity,
                                    taints=[Taint("karpenter.sh/disrupted", "NoSchedule")] if spec["disrupted"] else [],
                                    conditions={"KernelDeadlock": "True"} if spec["problem"] else None))
        for j, (phase, cpu) in enumerate(spec["pods"]):
            index.upsert_pod(make_pod(f"p-{i}-{j}", f"p-{i}-{j}", node=f"n-{i}", phase=phase, cpu=cpu))
    (summary,) = desired_state(index, {"pool": "uid-pool"}, {})
    agg = index.node_groups[("pool", "a")]
    assert old_from_new(summary.status) == old_shape(agg)
    for field in ("allocatable", "capacity", "requested", "unhealthyAccelerators"):  # and exactly, where the
        for resource, text in summary.status.get(field, {}).items():  # old one rounded
            assert parse_nano(text) == getattr(agg, ATTR.get(field, field))[resource]
    assert sum(summary.status["nodesByState"].values()) == summary.status["nodeCount"]
    assert 0 not in summary.status["nodesByState"].values()


ATTR = {"unhealthyAccelerators": "accelerators_unhealthy"}

# Bytes of a NodeSummary's status as the API server encodes it (compact JSON): a 3-resource group
# (cpu, memory, pods) of 3 Ready nodes with 90 pods: 391 bytes; the first v1alpha1 shape took 457.
STATUS_BUDGET = 400


def test_a_node_summary_status_fits_its_budget() -> None:
    index = ClusterIndex()
    index.set_node_summarizer("pool", "cloud.google.com/gke-nodepool")
    for i in range(3):
        index.upsert_node(make_node(f"gke-pool-a-{i}", {"cloud.google.com/gke-nodepool": "pool-a"},
                                    allocatable={"cpu": "31850m", "memory": "120Gi", "pods": "110"}))
        for j in range(30):
            index.upsert_pod(make_pod(f"p-{i}-{j}", f"p-{i}-{j}", node=f"gke-pool-a-{i}", cpu="500m"))
    (summary,) = desired_state(index, {"pool": "uid-pool"}, {})
    size = len(json.dumps(summary.status, separators=(",", ":")))
    old = len(json.dumps(old_shape(index.node_groups[("pool", "pool-a")]), separators=(",", ":")))
    assert size <= STATUS_BUDGET < old, (size, old)


@pytest.mark.parametrize(("plural", "table"), [("nodesummaries", NODE_SUMMARY_STATUS),
                                               ("workloadsummaries", WORKLOAD_SUMMARY_STATUS)])
def test_every_status_field_is_declared_by_the_crd(plural: str, table: dict[str, Any]) -> None:
    """A new summary field is one function in its table and its property in the CRD's status
    schema: the API server drops what the schema does not declare."""
    crd = yaml.safe_load((CRDS / f"{plural}.yaml").read_text())
    for version in crd["spec"]["versions"]:
        declared = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
        assert set(table) == set(declared), version["name"]


@pytest.mark.parametrize("seed", range(25))
def test_a_pass_over_what_changed_equals_a_pass_over_everything(seed: int) -> None:
    """The reconciler's pass between changes to the sets of node groups and workloads queues only
    the keys of the aggregates the index says were touched (its cursor, made_from),
    and a worker makes each object when it takes the key (desired_one), after any number of passes:
    after any random events, the objects it holds are those a pass over everything makes."""
    scenario = Scenario(random.Random(seed))
    index = scenario.index
    infos = {(group, kind): TypeInfo(f"{group}/v1", short_type(group, kind, None), long_type(group, kind, "v1"))
             for group, kind in KINDS}
    naming = Naming.empty()
    cache: Cache = Stamped()
    cursor = index.cursor()
    plan: Layout | None = None
    held: dict[str, str] = {}
    ours: dict[tuple[str, str], Desired] = {}
    queued: dict[tuple[str, str], Made] = {}
    incremental = 0
    for step in range(300):
        scenario.step()
        uids = {name: f"uid-{name}" for name in index.node_summarizers}
        changes = cursor.take()
        if changes.structure or plan is None or uids != held:
            plan, held = layout(index, uids, infos, naming), uids
            ours = {(d.plural, d.key): d for d in desired_all(index, plan, cache)}
            queued.clear()
        else:
            incremental += 1
            queued.update(made_from(index, plan, changes.node_groups, changes.workloads))
        if step % 3 == 0:  # the queued keys taken: each made from the index as it is now
            for key, made in queued.items():
                d = desired_one(index, plan, cache, made)
                assert d is not None and (d.plural, d.key) == key
                ours[key] = d
            queued.clear()
            # The same name allocator: names, once given, stay (a fresh one may settle a clash otherwise).
            everything = desired_state(index, uids, infos, naming=naming)
            assert {k: (d.body, d.status) for k, d in ours.items()} == \
                {(d.plural, d.key): (d.body, d.status) for d in everything}, f"seed {seed}, step {step}"
    assert incremental > 30  # most passes were the cheap kind
