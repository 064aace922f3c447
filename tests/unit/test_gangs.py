"""Unit tests of gangs (kubeindex/model/gangs.py, no cluster): which gang a pod is in, its counts
per root workload, Whole / Pending / Broken after the grace, and where its missing members were.
A property test holds the incremental counts equal to a recount from scratch through any sequence
of pod and node events."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeindex.model.gangs import BROKEN, JOBSET, LWS, PENDING, PODGROUP, WHOLE, Gang, GangConfig, Member, declared
from kubeindex.model.index import READY, TERMINATED, ClusterIndex, WorkloadAgg
from kubeindex.model.objects import (
    GangPodLabels,
    GangSchedulingPolicy,
    JobSet,
    LeaderWorkerSet,
    ObjectMeta,
    Pod,
    PodGroup,
    PodGroupSchedulingPolicy,
    PodGroupSpec,
    PodSchedulingGroup,
    WorkloadGangs,
    WorkloadSummarizer,
)
from tests.builders import configured, make_node, make_pod, ref

NS = "ns"
GROUP_LABEL, MIN_LABEL = "pod-group.scheduling.kubenexus.io/name", "pod-group.scheduling.kubenexus.io/min-available"
RACK = "example.com/rack"
DEPLOY = ("apps", "Deployment", "dep-uid")
KUBENEXUS = WorkloadGangs(podLabels=(GangPodLabels(GROUP_LABEL, MIN_LABEL),))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cluster(gangs: WorkloadGangs = KUBENEXUS, grace: float = 60.0) -> tuple[ClusterIndex, Clock]:
    """Two racks of two nodes in pool a, a summarizer of Deployments (owned by nothing here: the
    ReplicaSet is the pods' controller, so the root is the ReplicaSet's Deployment) with ``gangs``."""
    clock = Clock()
    index = ClusterIndex(now=clock, gang_grace=grace, gang_topology_label=RACK)
    index.set_node_summarizer("pools", "pool")
    index.set_workload_summarizer("w", configured(("apps", "Deployment")), gangs=gangs)
    index.upsert_owner(("apps", "Deployment"), NS, "train", "dep-uid", None)
    for i in range(4):
        index.upsert_node(make_node(f"n{i}", {"pool": "a", RACK: f"r{i // 2}"}))
    return index, clock


def member(name: str, node: str, ready: bool = True, phase: str = "Running", group: str = "g",
           minimum: str = "4") -> Pod:
    labels = {GROUP_LABEL: group, MIN_LABEL: minimum}
    return make_pod(name, f"uid-{name}", node=node, phase=phase, owner=ref(DEPLOY, "train"), labels=labels,
                    ready=ready)


def gang(index: ClusterIndex, key: str = f"label/{GROUP_LABEL}:{NS}/g") -> Gang:
    return index.workloads["dep-uid"].gangs[key]


def whole_gang() -> tuple[ClusterIndex, Clock]:
    index, clock = cluster()
    for i in range(4):
        index.upsert_pod(member(f"p{i}", f"n{i}"))
    return index, clock


def test_a_pod_label_gang_is_whole_when_its_ready_members_reach_the_minimum() -> None:
    index, _ = cluster()
    for i in range(3):
        index.upsert_pod(member(f"p{i}", f"n{i}"))
    g = gang(index)
    assert (g.required, g.pods, g.scheduled, g.ready, g.state) == (4, 3, 3, 3, PENDING)
    index.upsert_pod(member("p3", "n3", ready=False))
    assert (g.ready, g.state, g.lost) == (3, PENDING, {((("pools", "a"),), "r1"): 1})
    index.upsert_pod(member("p3", "n3"))
    assert (g.ready, g.state, g.lost) == (4, WHOLE, {})


def test_a_rack_lost_breaks_the_gang_after_the_grace_naming_the_pool_and_rack() -> None:
    index, clock = whole_gang()
    stamp = index.workloads["dep-uid"].revision
    for name in ("n2", "n3"):  # rack r1
        index.upsert_node(make_node(name, {"pool": "a", RACK: "r1"}, ready="False"))
    g = gang(index)
    assert (g.ready, g.missing, g.lost_members, g.state) == (2, 2, 2, PENDING)  # within the grace: no break yet
    assert index.workloads["dep-uid"].revision > stamp
    clock.now += 59
    index.tick()
    assert g.state == PENDING
    clock.now += 2
    index.tick()
    assert g.state == BROKEN
    assert g.places() == {((("pools", "a"),), "r1"): 2}
    # A replica that starts now says the same once the grace has passed for it: the verdict is read
    # from the objects, not remembered.
    other, other_clock = cluster()
    for i in range(4):
        other.upsert_node(make_node(f"n{i}", {"pool": "a", RACK: f"r{i // 2}"}, ready="False" if i > 1 else "True"))
        other.upsert_pod(member(f"p{i}", f"n{i}"))
    other_clock.now += 61
    other.tick()
    assert (gang(other).state, gang(other).places()) == (BROKEN, g.places())
    # The node lifecycle controller evicts them; their replacements wait unscheduled: nothing is
    # lost any more (Pending: the scheduler's to place), and where they were is still named.
    for i in (2, 3):
        index.delete_pod(f"{NS}/p{i}")
        index.upsert_pod(member(f"q{i}", "", ready=False, phase="Pending"))
    assert (g.state, g.places(), g.pods, g.scheduled) == (PENDING, {((("pools", "a"),), "r1"): 2}, 4, 2)
    for i in (2, 3):  # rescheduled on rack r0 and ready: whole again, the past forgotten
        index.upsert_pod(member(f"q{i}", f"n{i - 2}"))
    assert (g.state, g.places(), g.ready) == (WHOLE, {}, 4)


def test_a_member_still_starting_is_not_lost_and_one_that_crashed_is() -> None:
    index, clock = whole_gang()
    index.upsert_pod(member("p3", "n3", ready=False, phase="Pending"))  # replaced, pulling its image
    clock.now += 120
    index.tick()
    assert (gang(index).state, gang(index).lost_members) == (PENDING, 0)
    index.upsert_pod(member("p3", "n3", ready=False))  # Running, not Ready: crashed, or failing its probe
    clock.now += 61
    index.tick()
    assert (gang(index).state, gang(index).places()) == (BROKEN, {((("pools", "a"),), "r1"): 1})


def test_a_member_back_within_the_grace_is_no_break() -> None:
    index, clock = whole_gang()
    index.upsert_pod(member("p0", "n0", ready=False))
    clock.now += 30
    index.tick()
    index.upsert_pod(member("p0", "n0"))
    clock.now += 60
    index.tick()
    assert gang(index).state == WHOLE
    assert not index._short


def test_a_finished_gang_is_whole_and_never_broken() -> None:
    index, clock = whole_gang()
    for i in range(4):
        index.upsert_pod(member(f"p{i}", f"n{i}", ready=False, phase="Succeeded"))
    g = gang(index)
    assert (g.succeeded, g.pods, g.state) == (4, 0, WHOLE)
    index.delete_node("n0")
    clock.now += 120
    index.tick()
    assert g.state == WHOLE


def test_an_in_tree_podgroup_sizes_its_gang_and_a_change_of_min_count_judges_it_again() -> None:
    index, _ = cluster(WorkloadGangs(kinds=(PODGROUP,)))
    group = PodGroup(ObjectMeta(name="workers", namespace=NS, uid="pg-uid"),
                     PodGroupSpec(schedulingPolicy=PodGroupSchedulingPolicy(GangSchedulingPolicy(3))))
    for i in range(2):
        pod = make_pod(f"p{i}", f"uid-p{i}", node=f"n{i}", owner=ref(DEPLOY, "train"), ready=True)
        pod.spec.schedulingGroup = PodSchedulingGroup("workers")
        index.upsert_pod(pod)
    key = f"{PODGROUP}:{NS}/workers"
    g = gang(index, key)
    assert (g.name, g.required, g.state) == ("workers", None, PENDING)  # not seen yet: size unknown
    index.upsert_pod_group(group)
    assert (g.required, g.state) == (3, PENDING)
    group.spec.schedulingPolicy.gang = GangSchedulingPolicy(2)
    index.upsert_pod_group(group)
    assert (g.required, g.state) == (2, WHOLE)
    index.delete_pod_group(f"{NS}/workers")
    assert g.required is None


def test_jobset_and_leaderworkerset_gangs_are_sized_by_their_objects() -> None:
    index, _ = cluster(WorkloadGangs(kinds=(JOBSET, LWS)))
    for i in range(4):
        index.upsert_pod(make_pod(f"js{i}", f"uid-js{i}", node=f"n{i}", owner=ref(DEPLOY, "train"), ready=True,
                                  labels={"jobset.sigs.k8s.io/jobset-name": "train"}))
        index.upsert_pod(make_pod(f"lws{i}", f"uid-lws{i}", node=f"n{i}", owner=ref(DEPLOY, "train"), ready=True,
                                  labels={"leaderworkerset.sigs.k8s.io/name": "serve",
                                          "leaderworkerset.sigs.k8s.io/group-index": str(i // 2)}))
    jobset = msgspec.json.decode(b'{"metadata": {"name": "train", "namespace": "ns"}, "spec": {"replicatedJobs": ['
                                 b'{"replicas": 2, "template": {"spec": {"parallelism": 2, "completions": 4}}},'
                                 b'{"template": {"spec": {"completions": 1}}}]}}', type=JobSet)
    lws = msgspec.json.decode(b'{"metadata": {"name": "serve", "namespace": "ns"},'
                              b'"spec": {"leaderWorkerTemplate": {"size": 2}}}', type=LeaderWorkerSet)
    assert (jobset.gang_size(), lws.gang_size()) == (5, 2)
    index.set_gang_size(f"{JOBSET}:{NS}/train", jobset.gang_size())
    index.set_gang_size(f"{LWS}:{NS}/serve", lws.gang_size())
    gangs = index.workloads["dep-uid"].gangs
    assert {k: (g.name, g.required, g.ready, g.state) for k, g in gangs.items()} == {
        f"{JOBSET}:{NS}/train": ("train", 5, 4, PENDING),
        f"{LWS}:{NS}/serve/0": ("serve-0", 2, 2, WHOLE),
        f"{LWS}:{NS}/serve/1": ("serve-1", 2, 2, WHOLE),
    }


def test_a_pod_is_in_one_gang_the_first_that_names_it() -> None:
    config = GangConfig(frozenset({PODGROUP, JOBSET, LWS}), ((GROUP_LABEL, MIN_LABEL),))
    labels = {GROUP_LABEL: "kn", MIN_LABEL: "3", "jobset.sigs.k8s.io/jobset-name": "js"}
    assert config.member(NS, labels, "pg") == Member(f"{PODGROUP}:{NS}/pg", "pg", f"{PODGROUP}:{NS}/pg")
    assert config.member(NS, labels, None) == Member(f"label/{GROUP_LABEL}:{NS}/kn", "kn", "", 3)
    assert config.member(NS, {"jobset.sigs.k8s.io/jobset-name": "js"}, None) == \
        Member(f"{JOBSET}:{NS}/js", "js", f"{JOBSET}:{NS}/js")
    lws = {"leaderworkerset.sigs.k8s.io/name": "l", "leaderworkerset.sigs.k8s.io/group-index": "2"}
    assert config.member(NS, lws, None) == Member(f"{LWS}:{NS}/l/2", "l-2", f"{LWS}:{NS}/l")
    assert config.member(NS, {"leaderworkerset.sigs.k8s.io/name": "l"}, None) is None  # no group index
    assert GangConfig().member(NS, labels, "pg") is None
    assert [declared(v) for v in ("4", "0", "-1", "x", "", None, "9999999999")] == [4, None, None, None, None,
                                                                                  None, None]


def test_members_that_declare_no_minimum_take_the_others_and_unknown_stays_pending() -> None:
    index, _ = cluster()
    index.upsert_pod(member("p0", "n0", minimum=""))
    assert (gang(index).required, gang(index).state) == (None, PENDING)
    index.upsert_pod(member("p1", "n1", minimum="2"))
    assert (gang(index).required, gang(index).state) == (2, WHOLE)


def test_a_summarizer_edit_that_drops_gangs_takes_every_pod_out_of_them() -> None:
    index, _ = whole_gang()
    index.set_workload_summarizer("w", configured(("apps", "Deployment")))
    assert index.workloads["dep-uid"].gangs == {}
    assert sum(index.workloads["dep-uid"].pods.values()) == 4
    index.set_workload_summarizer("w", configured(("apps", "Deployment")), gangs=KUBENEXUS)
    for i in range(4):  # as Sources does: the pods handed over again
        index.upsert_pod(member(f"p{i}", f"n{i}"))
    assert gang(index).state == WHOLE


def test_the_summarizer_spec_reads_gangs() -> None:
    obj = msgspec.json.decode(b'{"metadata": {"name": "w"}, "spec": {"workloadTypes": [{"kind": "JobSet"}], '
                              b'"gangs": {"kinds": ["JobSet"], "podLabels": [{"labelKey": "a", '
                              b'"minAvailableLabelKey": "b"}]}}}', type=WorkloadSummarizer)
    assert obj.spec.gangs == WorkloadGangs(("JobSet",), (GangPodLabels("a", "b"),))


# -- the counts are those of a recount, whatever the events ---------------------------------------

def recount(index: ClusterIndex, agg: WorkloadAgg) -> dict[str, tuple[int, ...]]:
    """(pods, scheduled, ready, succeeded, lost) per gang, from the pods and nodes as they are."""
    out: dict[str, list[int]] = {}
    for entry in index.pods.values():
        if entry.gang is None or entry.workload != agg.uid:
            continue
        counts = out.setdefault(entry.gang.key, [0, 0, 0, 0, 0])
        if entry.phase == "Succeeded":
            counts[3] += 1
        elif entry.phase not in TERMINATED:
            counts[0] += 1
            if entry.node:
                counts[1] += 1
                node = index.nodes.get(entry.node)
                node_ready = node is not None and node.present and node.ready == READY
                counts[2] += entry.ready and node_ready
                counts[4] += not node_ready or (entry.phase == "Running" and not entry.ready)
    return {k: tuple(v) for k, v in out.items()}


pod_event = st.tuples(st.just("pod"), st.integers(0, 5), st.sampled_from(["", "n0", "n1", "n2"]),
                      st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]), st.booleans(),
                      st.sampled_from(["g", "h"]))
node_event = st.tuples(st.just("node"), st.integers(0, 2), st.sampled_from(["True", "False", "gone"]))
delete_event = st.tuples(st.just("delete"), st.integers(0, 5))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(pod_event, node_event, delete_event), max_size=40))
def test_gang_counts_are_those_of_a_recount(events: list[tuple]) -> None:
    index, _ = cluster()
    for event in events:
        if event[0] == "pod":
            _, i, node, phase, ready, group = event
            index.upsert_pod(member(f"p{i}", node, ready=ready, phase=phase, group=group))
        elif event[0] == "node":
            _, i, ready = event
            if ready == "gone":
                index.delete_node(f"n{i}")
            else:
                index.upsert_node(make_node(f"n{i}", {"pool": "a", RACK: f"r{i // 2}"}, ready=ready))
        else:
            index.delete_pod(f"{NS}/p{event[1]}")
    agg = index.workloads.get("dep-uid")
    gangs = agg.gangs if agg is not None else {}
    assert {k: (g.pods, g.scheduled, g.ready, g.succeeded, g.lost_members) for k, g in gangs.items()} == \
        (recount(index, agg) if agg is not None else {})
    for g in gangs.values():
        assert sum(g.lost.values()) == g.lost_members


# -- what the summaries and the metrics show of them -----------------------------------------------

def test_the_workload_summary_counts_gangs_and_names_the_worst_with_where_members_were_lost() -> None:
    from reconciler.desired import TypeInfo, workload_summary

    index, clock = whole_gang()
    for i in range(2):  # a second gang, still forming
        index.upsert_pod(member(f"h{i}", f"n{i}", group="h"))
    for name in ("n2", "n3"):
        index.upsert_node(make_node(name, {"pool": "a", RACK: "r1"}, ready="False"))
    clock.now += 61
    index.tick()
    status = workload_summary(index.workloads["dep-uid"], "train", TypeInfo("apps/v1", "deploy", "x"),
                              {("pools", "a"): "pools-a"}).status
    assert status["gangs"] == {"count": 2, "whole": 0, "pending": 1, "broken": 1}
    assert status["gangsWhole"] == "0/2"
    assert status["worstGangs"] == [
        {"name": "g", "state": "Broken", "required": 4, "scheduled": 4, "ready": 2,
         "lost": [{"nodeSummary": "pools-a", "domain": "r1", "members": 2}]},
        {"name": "h", "state": "Pending", "required": 4, "scheduled": 2, "ready": 2},  # never had them
    ]


def test_a_workload_without_gangs_has_no_gang_fields_nor_series() -> None:
    from exporter.metrics import gang_series
    from reconciler.desired import TypeInfo, workload_summary

    index, _ = cluster()
    index.upsert_pod(make_pod("solo", "uid-solo", node="n0", owner=ref(DEPLOY, "train")))
    status = workload_summary(index.workloads["dep-uid"], "train", TypeInfo("apps/v1", "deploy", "x"), {}).status
    assert not {"gangs", "gangsWhole", "worstGangs"} & status.keys()
    assert gang_series(index.workloads["dep-uid"].gangs.values()) == ({}, {}, {})


def test_lost_series_are_for_broken_gangs_only_and_capped() -> None:
    from exporter.metrics import MAX_LOST_SERIES, OTHER, gang_series

    index, clock = cluster()
    for i in range(14):
        index.upsert_node(make_node(f"m{i}", {"pool": "b", RACK: f"x{i:02}"}))
        index.upsert_pod(member(f"m{i}", f"m{i}", minimum="14"))
    states, members, lost = gang_series(index.workloads["dep-uid"].gangs.values())
    assert (states, members, lost) == ({"Whole": 1, "Pending": 0, "Broken": 0},
                                       {"required": 14, "scheduled": 14, "ready": 14, "at_risk": 0}, {})
    for i in range(12):
        index.upsert_node(make_node(f"m{i}", {"pool": "b", RACK: f"x{i:02}"}, ready="Unknown"))
    _, _, lost = gang_series(index.workloads["dep-uid"].gangs.values())
    assert lost == {}  # short, within the grace: no place series yet
    clock.now += 61
    index.tick()
    _, members, lost = gang_series(index.workloads["dep-uid"].gangs.values())
    assert members == {"required": 14, "scheduled": 14, "ready": 2, "at_risk": 0}
    assert len(lost) == MAX_LOST_SERIES + 1 and sum(lost.values()) == 12
    assert lost[("pools", OTHER, "")] == 2


def test_members_of_a_node_deleted_under_them_are_lost_where_it_was() -> None:
    index, clock = whole_gang()
    index.delete_node("n3")
    g = gang(index)
    assert (g.ready, g.lost) == (3, {((("pools", "a"),), "r1"): 1})
    clock.now += 61
    index.tick()
    assert g.state == BROKEN
    index.delete_pod(f"{NS}/p3")  # the pod garbage collector's part
    assert (g.state, g.places(), index._gone_places) == (PENDING, {((("pools", "a"),), "r1"): 1}, {})


def test_a_gang_whose_object_is_deleted_is_no_break() -> None:
    """A JobSet deleted (background propagation: the object first, its pods after): its gang, short
    while its pods terminate, has no minimum any more and is Pending, never Broken."""
    index, clock = cluster(WorkloadGangs(kinds=(JOBSET,)))
    for i in range(2):
        index.upsert_pod(make_pod(f"js{i}", f"uid-js{i}", node=f"n{i}", owner=ref(DEPLOY, "train"), ready=True,
                                  labels={"jobset.sigs.k8s.io/jobset-name": "train"}))
    index.set_gang_size(f"{JOBSET}:{NS}/train", 2)
    g = gang(index, f"{JOBSET}:{NS}/train")
    assert g.state == WHOLE
    index.set_gang_size(f"{JOBSET}:{NS}/train", None)
    index.upsert_pod(make_pod("js0", "uid-js0", node="n0", owner=ref(DEPLOY, "train"), ready=False,
                              labels={"jobset.sigs.k8s.io/jobset-name": "train"}))
    clock.now += 120
    index.tick()
    assert (g.state, index._short) == (PENDING, {})


def test_gang_members_on_nodes_karpenter_may_disrupt_put_the_gang_at_risk() -> None:
    from exporter.metrics import gang_series
    from reconciler.desired import TypeInfo, workload_summary
    from tests.builders import make_nodeclaim

    index, _ = whole_gang()
    index.upsert_nodeclaim(make_nodeclaim("claim-n2", "n2", {"Drifted": "True"}))
    g = gang(index)
    assert (g.at_risk, g.state) == (1, WHOLE)  # drifted: a candidate, still running
    status = workload_summary(index.workloads["dep-uid"], "train", TypeInfo("apps/v1", "deploy", "x"),
                              {("pools", "a"): "pools-a"}).status
    assert status["atRisk"] == {"pods": 1, "reasons": {"Drifted": 1}, "gangs": 1,
                                "nodeSummaries": [{"name": "pools-a", "pods": 1}]}
    assert gang_series(index.workloads["dep-uid"].gangs.values())[1]["at_risk"] == 1
    index.upsert_nodeclaim(make_nodeclaim("claim-n2", "n2", {"Drifted": "False"}))
    assert g.at_risk == 0
