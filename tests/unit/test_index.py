"""Unit tests of the cluster index (no cluster): workloads named by pod labels, requests, node
groups and node state, and incremental == from scratch. Owner chains are in test_owners.py."""

from __future__ import annotations

import json
import random
import sys
from typing import Unpack

import msgspec
import pytest

from kubeindex.model.index import NODE_STATES, UNHEALTHY_STATES, ClusterIndex, effective_requests, pod_requests
from kubeindex.model.nodeset import SUMMED, NodeSetAgg, node_into
from kubeindex.model.objects import (
    Container,
    Pod,
    PodLabelWorkload,
    PodSpec,
    Resources,
    Taint,
    WorkloadType,
    object_key,
    share,
)
from kubeindex.model.owners import NONE
from kubeindex.model.quantity import NANO
from tests.builders import DISRUPTED, GPU, NodeFields, add_owner, configured, labels_of, make_node, make_pod, ref
from tests.reference import (
    Owner,
    health_snapshot,
    karpenter_snapshot,
    recompute,
    recompute_health,
    recompute_karpenter,
    snapshot,
)
from tests.scenario import Scenario

# -- workloads named by a pod label -----------------------------------------------------------------

def test_pod_label_names_the_workload_where_no_owner_does() -> None:
    index = ClusterIndex(workload_pod_labels=["volcano.sh/job-name"])
    index.set_workload_summarizer("w", configured(("apps", "Deployment")))
    for i in range(2):
        index.upsert_pod(make_pod(f"v{i}", f"v{i}", labels={"volcano.sh/job-name": "sim"}))
    index.upsert_pod(make_pod("bare", "bare"))
    (wl,) = index.workloads.values()
    assert (wl.name, wl.label_key, wl.pods) == ("sim", "volcano.sh/job-name", {"Running": 2})
    assert index.unresolved == {NONE: 1}
    for i in range(2):
        index.delete_pod(f"ns/v{i}")
    assert index.workloads == {}


VOLCANO, KUBENEXUS = "volcano.sh/job-name", "pod-group.scheduling.kubenexus.io/name"


def label_workloads(index: ClusterIndex) -> dict[tuple[str, str], dict[str, int]]:
    """(label key, value) -> pods by phase, of the workloads named by a pod label."""
    return {(w.label_key, w.name): w.pods for w in index.workloads.values() if not w.is_object}


def test_label_workloads_follow_live_summarizer_edits() -> None:
    """Keys dropped or reordered take effect at once; a key added takes effect as pods are
    upserted again (Sources relists the pods then: the index keeps only configured keys' values)."""
    index = ClusterIndex()
    index.set_workload_summarizer("gangs", [], labels_of(VOLCANO))
    pods = [make_pod("a", "a", labels={VOLCANO: "sim", KUBENEXUS: "pg"}),
            make_pod("b", "b", labels={VOLCANO: "sim"}), make_pod("c", "c", labels={KUBENEXUS: "pg"})]
    for pod in pods:
        index.upsert_pod(pod)
    assert label_workloads(index) == {(VOLCANO, "sim"): {"Running": 2}}
    assert index.unresolved == {NONE: 1}

    index.set_workload_summarizer("gangs", [], labels_of(KUBENEXUS, VOLCANO))
    assert label_workloads(index) == {(VOLCANO, "sim"): {"Running": 2}}  # c's value of the new key: not known yet
    for pod in pods:
        index.upsert_pod(pod)
    assert label_workloads(index) == {(KUBENEXUS, "pg"): {"Running": 2}, (VOLCANO, "sim"): {"Running": 1}}
    assert index.unresolved == {}

    cursor = index.cursor()  # the reconciler's record of what changes
    cursor.take()
    index.set_workload_summarizer("a-first", [], [PodLabelWorkload(VOLCANO, "vc")])  # sorts before gangs
    assert index.label_keys == (VOLCANO, KUBENEXUS) and index.label_types[VOLCANO].short_type == "vc"
    assert label_workloads(index) == {(KUBENEXUS, "pg"): {"Running": 1}, (VOLCANO, "sim"): {"Running": 2}}
    assert cursor.take().structure  # short types: every summary is redone

    index.delete_workload_summarizer("a-first")
    index.set_workload_summarizer("gangs", [], [])
    assert label_workloads(index) == {} and index.unresolved == {NONE: 3}


def test_the_first_summarizer_by_name_gives_a_key_its_short_type_and_the_flag_only_metrics() -> None:
    index = ClusterIndex(workload_pod_labels=[VOLCANO, "flag.example.com/job"])
    index.set_workload_summarizer("zz", [], [PodLabelWorkload(VOLCANO, "z")])
    index.set_workload_summarizer("aa", [], [PodLabelWorkload(VOLCANO, "a")])
    assert index.label_types[VOLCANO].summarizer == "aa" and index.label_types[VOLCANO].short_type == "a"
    assert index.label_types["flag.example.com/job"].summarizer == ""  # the deprecated flag's: metrics only
    assert index.label_keys == (VOLCANO, "flag.example.com/job")


def test_an_owner_of_a_configured_kind_wins_over_a_pod_label() -> None:
    index = ClusterIndex()
    index.set_workload_summarizer("w", configured(("apps", "Deployment")), labels_of(VOLCANO))
    index.upsert_owner(("apps", "Deployment"), "ns", "web", "d1", None)
    deployment = Owner("d1", "apps", "Deployment", "ns", "web", None)
    index.upsert_pod(make_pod("p", "p1", owner=ref(deployment), labels={VOLCANO: "web"}))
    assert index.workloads["d1"].pods == {"Running": 1} and label_workloads(index) == {}
    index.set_workload_summarizer("w", configured(("apps", "StatefulSet")), labels_of(VOLCANO))
    assert label_workloads(index) == {(VOLCANO, "web"): {"Running": 1}} and "d1" not in index.workloads
    index.set_workload_summarizer("w", configured(("apps", "Deployment")), labels_of(VOLCANO))
    assert index.workloads["d1"].pods == {"Running": 1} and label_workloads(index) == {}


def test_a_label_workload_goes_with_its_last_pod() -> None:
    index = ClusterIndex()
    index.set_workload_summarizer("gangs", [], labels_of(VOLCANO))
    index.upsert_pod(make_pod("a", "a", labels={VOLCANO: "sim"}))
    index.upsert_pod(make_pod("b", "b", labels={VOLCANO: "sim"}, namespace="other"))
    assert {(w.namespace, w.name, w.label_key) for w in index.workloads.values()} == {
        ("ns", "sim", VOLCANO), ("other", "sim", VOLCANO)}  # one per namespace and value
    cursor = index.cursor()  # the reconciler's record of what changes
    cursor.take()
    index.upsert_pod(make_pod("a", "a", labels={VOLCANO: "renamed"}))  # its label changed: it moves
    assert {(w.namespace, w.name) for w in index.workloads.values()} == {("ns", "renamed"), ("other", "sim")}
    assert cursor.take().structure
    index.delete_pod("ns/a")
    index.delete_pod("other/b")
    assert index.workloads == {} and cursor.take().structure


def test_effective_requests_with_init_containers_sidecars_and_overhead() -> None:
    spec = PodSpec(
        containers=[Container(Resources({"cpu": "500m"})), Container(Resources({"cpu": "250m", "memory": "1Gi"}))],
        initContainers=[
            Container(Resources({"cpu": "2"})),  # a big one-off init step
            Container(Resources({"cpu": "100m"}), restartPolicy="Always"),  # a sidecar
        ],
        overhead={"cpu": "10m"},
    )
    got = effective_requests(spec)
    assert got["cpu"] == (2000 + 10) * NANO // 1000  # max(500+250+100, 2000) + 10 millicores
    assert got["memory"] == 2**30 * NANO


def test_pod_level_requests_replace_the_container_sum_for_the_resources_they_name() -> None:
    """As k8s.io/component-helpers' PodRequests: cpu, memory and hugepages-* set in
    spec.resources.requests replace the containers' aggregate; other resources keep it; overhead
    is added after."""
    gpu = "nvidia.com/gpu"
    spec = msgspec.json.decode(json.dumps({
        "containers": [{"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi", gpu: "1"}}},
                       {"name": "b", "resources": {"requests": {"cpu": "250m", "ephemeral-storage": "1Gi"}}}],
        "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2", "memory": "3Gi"}}}],
        "resources": {"requests": {"cpu": "4", "hugepages-2Mi": "20Mi", gpu: "7"}, "limits": {"cpu": "8"}},
        "overhead": {"cpu": "10m", "memory": "1Mi"},
    }), type=PodSpec)
    got = effective_requests(spec)
    assert got["cpu"] == 4010 * NANO // 1000  # the pod-level 4, not max(750m, 2): + overhead
    assert got["memory"] == (3 * 2**30 + 2**20) * NANO  # not named at pod level: the containers' max
    assert got["hugepages-2Mi"] == 20 * 2**20 * NANO
    assert got[gpu] == NANO  # not a pod-level resource: the pod-level value is ignored
    assert got["ephemeral-storage"] == 2**30 * NANO
    # Only unsupported names at pod level: as if none were set.
    plain = msgspec.structs.replace(spec, resources=Resources({gpu: "7"}), overhead={})
    assert effective_requests(plain)["cpu"] == 2 * NANO  # max(750m, the 2-cpu init container)


def test_a_pods_requests_are_its_effective_requests_looked_up_by_their_text() -> None:
    """pod_requests: the interned effective requests; one container's are looked up by its
    requests as written (the same vector object for the same text), any other pod computed."""
    def one(requests: dict[str, str]) -> PodSpec:
        return PodSpec(containers=[Container(Resources(requests))])

    first = pod_requests(one({"cpu": "100m", "memory": "64Mi"}))
    assert first == ((("cpu", 100 * NANO // 1000), ("memory", 64 * 2**20 * NANO)))
    assert pod_requests(one({"cpu": "100m", "memory": "64Mi"})) is first
    assert pod_requests(one({"memory": "64Mi", "cpu": "0.1"})) is first  # other text, the same vector
    assert pod_requests(one({"cpu": "0", "memory": "64Mi"})) == (("memory", 64 * 2**20 * NANO),)
    assert pod_requests(one({})) == ()
    two = PodSpec(containers=[Container(Resources({"cpu": "100m"})), Container(Resources({"cpu": "1"}))])
    assert pod_requests(two) == (("cpu", 1100 * NANO // 1000),)
    sidecar = PodSpec(containers=[Container(Resources({"cpu": "100m"}))],
                      initContainers=[Container(Resources({"cpu": "1"}), restartPolicy="Always")])
    assert pod_requests(sidecar) == (("cpu", 1100 * NANO // 1000),)
    overhead = msgspec.structs.replace(one({"cpu": "100m"}), overhead={"cpu": "10m"})
    assert pod_requests(overhead) == (("cpu", 110 * NANO // 1000),)


def test_node_groups_exact_values() -> None:
    index = ClusterIndex()
    index.set_node_summarizer("pool", "pool")
    index.upsert_node(make_node("a1", {"pool": "a"}))
    index.upsert_node(make_node("a2", {"pool": "a"}, ready="False", unschedulable=True))
    index.upsert_node(make_node("b1", {"pool": "b"}, allocatable={"cpu": "8", "nvidia.com/gpu": "4"}))
    index.upsert_pod(make_pod("x", "x", node="a1", cpu="1500m"))
    index.upsert_pod(make_pod("y", "y", node="a2", phase="Succeeded"))
    a, b = index.node_groups[("pool", "a")], index.node_groups[("pool", "b")]
    assert (a.nodes, a.conditions, a.unschedulable) == (2, {"Ready": 1, "NotReady": 1}, 1)
    assert a.allocatable["cpu"] == 8 * NANO and a.pods == {"Running": 1, "Succeeded": 1}
    assert a.requested == {"cpu": 1500 * NANO // 1000, "memory": 64 * 2**20 * NANO}
    assert b.allocatable == {"cpu": 8 * NANO, "nvidia.com/gpu": 4 * NANO}
    # A label change moves the node and the pods on it.
    index.upsert_node(make_node("a1", {"pool": "b"}))
    assert index.node_groups[("pool", "b")].pods == {"Running": 1}
    assert index.node_groups[("pool", "a")].pods == {"Succeeded": 1}
    index.delete_node("a2")
    assert ("pool", "a") not in index.node_groups


# -- node state -----------------------------------------------------------------------------------

SICK_GPU: NodeFields = {"allocatable": {"cpu": "8", GPU: "7"}, "capacity": {"cpu": "8", GPU: "8"}}


def _state(**fields: Unpack[NodeFields]) -> str:
    index = ClusterIndex()
    index.upsert_node(make_node("n", {}, **fields))
    return index.nodes["n"].state


@pytest.mark.parametrize(("node", "state"), [
    ({}, "Ready"),
    ({"ready": "False", "taints": [DISRUPTED], "unschedulable": True, **SICK_GPU}, "NotReady"),
    ({"ready": "Unknown", "taints": [DISRUPTED], "unschedulable": True}, "Unknown"),
    ({"ready": None, "taints": [DISRUPTED]}, "Unknown"),  # no Ready condition at all
    ({"taints": [DISRUPTED], "unschedulable": True, "conditions": {"KernelDeadlock": "True"}}, "Disrupting"),
    ({"taints": [Taint("ToBeDeletedByClusterAutoscaler", "NoSchedule")]}, "Disrupting"),
    ({"taints": [Taint("cloud.google.com/impending-node-termination", "NoExecute")]}, "Disrupting"),
    ({"taints": [Taint("DeletionCandidateOfClusterAutoscaler", "PreferNoSchedule")]}, "Ready"),
    ({"unschedulable": True, "conditions": {"ReadonlyFilesystem": "True"}, **SICK_GPU}, "Cordoned"),
    ({"conditions": {"KernelDeadlock": "True"}}, "Degraded"),
    ({"conditions": {"FrequentContainerdRestart": "True", "MemoryPressure": "False"}}, "Degraded"),
    ({"conditions": {"KernelDeadlock": "False", "MemoryPressure": "True"}}, "Ready"),  # not configured
    (SICK_GPU, "Degraded"),
    ({"allocatable": {GPU: "8"}, "capacity": {GPU: "8"}}, "Ready"),
    ({"allocatable": {"cpu": "7"}, "capacity": {"cpu": "8"}}, "Ready"),  # not an accelerator
    ({"allocatable": {"aws.amazon.com/neuroncore": "31"}, "capacity": {"aws.amazon.com/neuroncore": "32"}},
     "Degraded"),
    ({"allocatable": {}, "capacity": {"google.com/tpu": "4"}}, "Degraded"),  # allocatable missing the resource: 0
])
def test_node_state_precedence(node: NodeFields, state: str) -> None:
    assert _state(**node) == state


def test_unhealthy_states_are_every_state_but_ready() -> None:
    """Workloads count their pods by UNHEALTHY_STATES, a slice of NODE_STATES: Ready must be the
    slice left out, and the only one."""
    assert set(UNHEALTHY_STATES) == set(NODE_STATES) - {"Ready"} and len(UNHEALTHY_STATES) == len(NODE_STATES) - 1


def test_node_health_settings_replace_the_defaults() -> None:
    index = ClusterIndex(disruption_taints=["example.com/drain:NoExecute"], problem_conditions=["GPUXid"],
                         accelerator_resources=["example.com/fpga*"])
    cases = {
        "a": make_node("a", {}, taints=[Taint("example.com/drain", "NoExecute")]),
        "b": make_node("b", {}, taints=[Taint("example.com/drain", "NoSchedule")]),  # another effect
        "c": make_node("c", {}, taints=[DISRUPTED]),  # a default no longer configured
        "d": make_node("d", {}, conditions={"GPUXid": "True", "KernelDeadlock": "True"}),
        "e": make_node("e", {}, conditions={"KernelDeadlock": "True"}),
        "f": make_node("f", {}, allocatable={"example.com/fpga-x": "1"}, capacity={"example.com/fpga-x": "2"}),
        "g": make_node("g", {}, **SICK_GPU),
    }
    for node in cases.values():
        index.upsert_node(node)
    assert {n: index.nodes[n].state for n in cases} == {
        "a": "Disrupting", "b": "Ready", "c": "Ready", "d": "Degraded", "e": "Ready", "f": "Degraded", "g": "Ready"}


def test_node_state_reaches_groups_and_workloads() -> None:
    """A node changing state moves its group's state counts and the counts of every workload with
    pods there; a pod event on it moves only that pod; revisions move with them."""
    index = ClusterIndex()
    index.set_node_summarizer("pool", "pool")
    index.set_workload_summarizer("w", configured(("apps", "Deployment")))
    for d in ("web", "db", "far"):
        add_owner(index, Owner(d, "apps", "Deployment", "ns", d, None))
    index.upsert_node(make_node("g1", {"pool": "gpu"}, allocatable={GPU: "8"}))
    index.upsert_node(make_node("g2", {"pool": "gpu"}, allocatable={GPU: "8"}))
    index.upsert_node(make_node("c1", {"pool": "cpu"}))
    for i, (workload, node) in enumerate([("web", "g1"), ("web", "g1"), ("web", "g2"), ("db", "g1"), ("far", "c1")]):
        index.upsert_pod(make_pod(f"p{i}", f"p{i}", node=node, owner=ref(("apps", "Deployment", workload))))
    gpu, web, db, far = index.node_groups[("pool", "gpu")], *(index.workloads[w] for w in ("web", "db", "far"))
    assert gpu.states == {"Ready": 2} and gpu.accelerators_unhealthy == {}
    stamps = (gpu.revision, web.revision, db.revision, far.revision)

    index.upsert_node(make_node("g1", {"pool": "gpu"}, allocatable={GPU: "6"}, capacity={GPU: "8"}))
    assert gpu.states == {"Ready": 1, "Degraded": 1} and gpu.accelerators_unhealthy == {GPU: 2 * NANO}
    assert (web.pods_by_node_state, web.unhealthy_nodes, web.unhealthy_nodes_by_node_group) == (
        {"Degraded": 2}, 1, {("pool", "gpu"): 1})
    assert (db.pods_by_node_state, db.unhealthy_nodes) == ({"Degraded": 1}, 1)
    assert (far.pods_by_node_state, far.unhealthy_nodes, far.unhealthy_nodes_by_node_group) == ({}, 0, {})
    assert (gpu.revision > stamps[0], web.revision > stamps[1], db.revision > stamps[2],
            far.revision == stamps[3]) == (True, True, True, True)

    index.upsert_node(make_node("g2", {"pool": "gpu"}, ready="False", allocatable={GPU: "8"}))
    assert gpu.states == {"NotReady": 1, "Degraded": 1}
    assert (web.pods_by_node_state, web.unhealthy_nodes, web.unhealthy_nodes_by_node_group) == (
        {"Degraded": 2, "NotReady": 1}, 2, {("pool", "gpu"): 2})
    index.delete_pod("ns/p2")  # web leaves g2
    assert (web.pods_by_node_state, web.unhealthy_nodes) == ({"Degraded": 2}, 1)
    index.upsert_node(make_node("g1", {"pool": "cpu"}, allocatable={GPU: "6"}, capacity={GPU: "8"}))  # a move
    assert web.unhealthy_nodes_by_node_group == {("pool", "cpu"): 1} and web.nodes_by_node_group == {("pool", "cpu"): 1}
    index.delete_node("g1")  # pods stay bound to a node no longer there: no state
    assert (web.pods_by_node_state, web.unhealthy_nodes, web.unhealthy_nodes_by_node_group) == ({}, 0, {})
    assert (db.pods_by_node_state, db.unhealthy_nodes) == ({}, 0)
    index.upsert_node(make_node("g1", {"pool": "gpu"}, unschedulable=True))  # back, cordoned
    assert (web.pods_by_node_state, web.unhealthy_nodes, web.unhealthy_nodes_by_node_group) == (
        {"Cordoned": 2}, 1, {("pool", "gpu"): 1})
    index.upsert_node(make_node("g1", {"pool": "gpu"}))
    assert (web.pods_by_node_state, web.unhealthy_nodes, web.unhealthy_nodes_by_node_group) == ({}, 0, {})
    assert gpu.states == {"Ready": 1, "NotReady": 1}


def test_a_finished_pod_holds_no_node() -> None:
    """Pods in phase Succeeded or Failed count in their workload's phases, never on its nodes: a
    finished Job on a pool gone NotReady is not "on unhealthy nodes"; a Pending pod bound to a node
    is. Also for a pod without requests, whose phase change alone would otherwise take the short path."""
    index = ClusterIndex()
    index.set_node_summarizer("pool", "pool")
    index.set_workload_summarizer("w", configured(("batch", "Job")))
    add_owner(index, Owner("job", "batch", "Job", "ns", "report", None))
    index.upsert_node(make_node("n1", {"pool": "gpu"}, ready="False"))
    index.upsert_node(make_node("n2", {"pool": "gpu"}, ready="False"))
    job = ref(("batch", "Job", "job"))
    bare = PodSpec(nodeName="n2", containers=[Container(Resources({}))])  # requests nothing
    index.upsert_pod(make_pod("p1", "p1", node="n1", owner=job))
    index.upsert_pod(Pod(make_pod("p2", "p2", owner=job).metadata, bare, make_pod("p2", "p2").status))
    agg = index.workloads["job"]
    assert (agg.pods_by_node_state, agg.unhealthy_nodes, agg.nodes_by_node_group) == (
        {"NotReady": 2}, 2, {("pool", "gpu"): 2})
    index.upsert_pod(make_pod("p1", "p1", node="n1", phase="Succeeded", owner=job))
    index.upsert_pod(Pod(make_pod("p2", "p2", owner=job).metadata, bare, make_pod("p2", "p2", phase="Failed").status))
    assert agg.pods == {"Succeeded": 1, "Failed": 1}
    assert (agg.pods_by_node_state, agg.unhealthy_nodes, agg.unhealthy_nodes_by_node_group, agg.nodes_by_node_group
            ) == ({}, 0, {}, {})
    assert index.node_groups[("pool", "gpu")].pods == {"Succeeded": 1, "Failed": 1}  # still bound there
    index.upsert_node(make_node("n1", {"pool": "gpu"}))  # a node of finished pods alone: no workload news
    cursor = index.cursor()  # the reconciler's record of what changes
    assert cursor.take().workload_news == set()
    index.upsert_pod(make_pod("p3", "p3", node="n2", phase="Pending", owner=job))  # bound, not started: holds n2
    assert (agg.pods_by_node_state, agg.unhealthy_nodes) == ({"NotReady": 1}, 1)
    index.upsert_pod(Pod(make_pod("p4", "p4", owner=job).metadata, bare, make_pod("p4", "p4").status))  # a retry
    assert (agg.pods_by_node_state, agg.unhealthy_nodes) == ({"NotReady": 2}, 1)
    assert health_snapshot(index)[1]["job"] == (agg.pods_by_node_state, 1, {("pool", "gpu"): 1})


# -- incremental == from scratch --------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_incremental_equals_recomputation(seed: int) -> None:
    scenario = Scenario(random.Random(seed))
    for step in range(400):
        scenario.step()
        if step % 5 == 0:
            assert snapshot(scenario.index) == recompute(scenario.world), f"seed {seed}, step {step}"
            assert health_snapshot(scenario.index) == recompute_health(scenario.world), f"seed {seed}, step {step}"
            assert karpenter_snapshot(scenario.index) == recompute_karpenter(scenario.world), \
                f"seed {seed}, step {step}"
    assert snapshot(scenario.index) == recompute(scenario.world)
    assert health_snapshot(scenario.index) == recompute_health(scenario.world)
    assert karpenter_snapshot(scenario.index) == recompute_karpenter(scenario.world)


def test_configuring_kind_pod_is_ignored_not_a_crash() -> None:
    index = ClusterIndex()
    index.set_workload_summarizer("w", configured(("", "Pod"), ("apps", "Deployment")))
    index.upsert_pod(make_pod("p", "p1"))
    assert index.workloads == {} and index.unresolved == {NONE: 1}


def test_changes_name_what_the_summaries_are_made_of() -> None:
    """The reconciler redoes what its cursor names: the touched workloads and node groups, or
    everything when a workload or node group appears or goes (one without a pod too); and which
    node groups had node news (a node's readiness, schedulability...: not its pods, not a label
    no summarizer groups by), and which workloads (a node of theirs changed state)."""
    index = ClusterIndex()
    index.set_workload_summarizer("w", [WorkloadType(kind="Deployment", group="apps")])
    index.set_node_summarizer("pool", "pool")
    cursor = index.cursor()  # the reconciler's record of what changes
    assert cursor.take().structure  # the first take: everything
    index.upsert_owner(("apps", "Deployment"), "ns", "idle", "d1", None)
    assert "d1" in index.workloads and cursor.take().structure
    index.upsert_owner(("apps", "Deployment"), "ns", "idle", "d1", None)  # a status update: nothing new
    index.upsert_node(make_node("n1", {"pool": "a"}))
    assert cursor.take().structure  # node group pool=a appeared
    index.upsert_node(make_node("n1", {"pool": "a"}, ready="False"))  # its only node changed
    changes = cursor.take()
    assert not changes.structure and changes.node_groups == changes.node_news == {("pool", "a")}
    index.upsert_node(make_node("n1", {"pool": "a"}))
    assert cursor.take().node_news == {("pool", "a")}  # Ready again: news too
    index.upsert_node(make_node("n1", {"pool": "a", "team": "x"}))  # a label no summarizer groups by
    changes = cursor.take()
    assert changes.node_groups == {("pool", "a")} and changes.node_news == set()  # what it counts did not move
    deployment = Owner("d1", "apps", "Deployment", "ns", "idle", None)
    index.upsert_pod(make_pod("p", "p1", "n1", owner=ref(deployment)))
    index.upsert_pod(make_pod("p", "p1", "n1", phase="Failed", owner=ref(deployment)))
    changes = cursor.take()
    assert not changes.structure and changes.workloads == {"d1"} and changes.node_groups == {("pool", "a")}
    assert changes.node_news == changes.workload_news == set()  # its pods alone
    index.upsert_pod(make_pod("p", "p1", "n1", phase="Failed", owner=ref(deployment)))  # nothing counted moved
    changes = cursor.take()
    assert (changes.structure, changes.workloads, changes.node_groups) == (False, set(), set())
    index.upsert_node(make_node("n1", {"pool": "a", "team": "x"}, unschedulable=True))  # cordoned
    changes = cursor.take()
    assert changes.node_news == {("pool", "a")} and changes.workload_news == set()  # its pod Failed: on no node
    index.upsert_pod(make_pod("q", "q1", "n1", owner=ref(deployment)))  # its replacement, Running there
    cursor.take()
    index.upsert_node(make_node("n1", {"pool": "a", "team": "x"}))  # uncordoned
    changes = cursor.take()
    assert changes.node_news == {("pool", "a")} and changes.workload_news == {"d1"}  # its pod's node changed
    index.delete_pod("ns/p")
    index.delete_pod("ns/q")
    index.delete_owner(("apps", "Deployment"), "ns/idle")
    assert "d1" not in index.workloads and cursor.take().structure


def test_node_sets_add_up_field_by_field() -> None:
    """The exporter's `other` node group is a sum of node groups (NodeSetAgg.add_sums): the same
    as one node set holding all their nodes, for every field that adds up, present or future."""
    scenario = Scenario(random.Random(1))
    for _ in range(300):
        scenario.step()
    index = scenario.index
    index.set_node_summarizer("s-pool", "pool")
    groups = [g for (s, _), g in index.node_groups.items() if s == "s-pool"]
    summed, direct = NodeSetAgg(), NodeSetAgg()
    for g in groups:
        summed.add_sums(g)
    for entry in index.nodes.values():
        if any(s == "s-pool" for s, _ in entry.node_groups):
            node_into(direct, entry, +1, index.revision)
    assert len(groups) > 1 and direct.accelerators_unhealthy and direct.pods
    assert {f: getattr(summed, f) for f in SUMMED} == {f: getattr(direct, f) for f in SUMMED}


def test_pods_decoded_apart_share_what_they_repeat() -> None:
    """Memory per pod (bench.pod_memory): two pods decoded from their own bytes, as watch events
    arrive, hold one node name, namespace, owner UID, phase and owner-graph answer between them,
    and the reflector's store and the index one key per pod."""
    index = ClusterIndex()
    index.set_workload_summarizer("apps", configured(("apps", "Deployment")))
    index.upsert_owner(("apps", "Deployment"), "team-a", "web", "d-1", None)
    index.upsert_owner(("apps", "ReplicaSet"), "team-a", "web-5d8f", "rs-1", ("apps/v1", "Deployment", "d-1"))
    decode = msgspec.json.Decoder(Pod).decode
    owner = ref(("apps", "ReplicaSet", "rs-1"))
    pods = [decode(msgspec.json.encode(make_pod(f"web-5d8f-{n}", f"uid-{n}", "node-1", owner=owner,
                                                namespace="team-a"))) for n in ("a", "b")]
    assert pods[0].spec.nodeName is not pods[1].spec.nodeName  # apart, as decoded
    for pod in pods:
        index.upsert_pod(pod)
    a, b = index.pods["team-a/web-5d8f-a"], index.pods["team-a/web-5d8f-b"]
    assert a.workload == b.workload == "d-1"
    assert a.phase is b.phase
    va, vb = index.graph.vertices["uid-a"], index.graph.vertices["uid-b"]
    assert va.res is vb.res
    shared = share is sys.intern  # not on CPython 3.12.0 to 3.12.5 (immortal interned strings)
    assert (a.node is b.node, va.namespace is vb.namespace, va.parent is vb.parent) == (shared,) * 3
    assert (object_key(pods[0].metadata) is a.key) == shared  # what the reflector's store keys it by


def test_an_update_that_moves_no_count_leaves_the_aggregates_alone() -> None:
    """A pod update that changes nothing counted (conditions, container states: most of them) is
    not detached and attached again: the workload's revision, which makes the reconciler look at
    it again, stays. A change of phase alone moves the phase counts in place; one that ends the
    pod (its requests go) takes it out and puts it back."""
    index = ClusterIndex()
    index.set_workload_summarizer("apps", configured(("apps", "Deployment")))
    index.upsert_owner(("apps", "Deployment"), "ns", "web", "d-1", None)
    index.upsert_owner(("apps", "ReplicaSet"), "ns", "web-5d8f", "rs-1", ("apps/v1", "Deployment", "d-1"))
    owner = ref(("apps", "ReplicaSet", "rs-1"))
    index.upsert_pod(make_pod("web-5d8f-a", "uid-a", "node-1", owner=owner))
    revision = index.workloads["d-1"].revision
    entry = index.pods["ns/web-5d8f-a"]
    index.upsert_pod(make_pod("web-5d8f-a", "uid-a", "node-1", owner=owner))  # a status-only update
    assert index.workloads["d-1"].revision == revision and index.pods["ns/web-5d8f-a"] is entry
    index.upsert_pod(make_pod("web-5d8f-a", "uid-a", "node-1", phase="Pending", owner=owner))  # the phase alone
    assert index.workloads["d-1"].revision > revision and index.pods["ns/web-5d8f-a"] is entry
    assert index.workloads["d-1"].pods == {"Pending": 1} and index.nodes["node-1"].pod_phases == {"Pending": 1}
    revision = index.workloads["d-1"].revision
    index.upsert_pod(make_pod("web-5d8f-a", "uid-a", "node-1", phase="Failed", owner=owner))
    assert index.workloads["d-1"].revision > revision
    assert index.workloads["d-1"].pods == {"Failed": 1} and index.nodes["node-1"].pod_requests == {}


def test_each_consumer_has_a_cursor_of_its_own() -> None:
    """Two consumers of one index: what one takes, the other still gets; a cursor made later
    starts from everything."""
    index = ClusterIndex()
    index.set_node_summarizer("pool", "pool")
    index.upsert_node(make_node("n1", {"pool": "a"}))
    first, second = index.cursor(), index.cursor()
    assert first.take().structure and second.take().structure
    index.upsert_node(make_node("n1", {"pool": "a"}, ready="False"))
    assert first.take().node_news == {("pool", "a")}
    assert first.take().node_news == set()  # taken
    assert second.take().node_news == {("pool", "a")}  # the other's is its own
    assert index.cursor().take().structure
