"""The ownership graph (kubeindex/model/owners.py), driven as Sources drives it, through the index's owner
and pod events: each pod's root workload is the topmost configured kind on its controller chain,
whatever order the objects come in; missing owners, UID mismatches, cycles and chains too deep are
counted, not followed."""

from __future__ import annotations

from kubeindex.model.index import ClusterIndex
from kubeindex.model.owners import CYCLE, MISSING, TOO_DEEP
from tests.builders import add_owner, configured, make_pod, ref
from tests.reference import Owner


def test_deployment_replicaset_pod() -> None:
    index = ClusterIndex()
    index.set_workload_summarizer("w", configured(("apps", "Deployment")))
    deploy = Owner("d1", "apps", "Deployment", "ns", "web", None)
    rs = Owner("rs1", "apps", "ReplicaSet", "ns", "web-abc", "d1")
    for o in (deploy, rs):
        add_owner(index, o)
    for i in range(3):
        index.upsert_pod(make_pod(f"web-abc-{i}", f"p{i}", owner=ref(rs)))
    (wl,) = index.workloads.values()
    assert (wl.namespace, wl.name, wl.group, wl.kind) == ("ns", "web", "apps", "Deployment")
    assert wl.pods == {"Running": 3}


def test_jobset_job_pod_and_pods_arriving_before_owners() -> None:
    index = ClusterIndex()
    index.set_workload_summarizer("w", configured(("jobset.x-k8s.io", "JobSet"), ("batch", "Job")))
    js = Owner("js1", "jobset.x-k8s.io", "JobSet", "ns", "train", None)
    job = Owner("job1", "batch", "Job", "ns", "train-workers-0", "js1")
    index.upsert_pod(make_pod("train-workers-0-0", "p0", node="n1", owner=ref(job)))
    assert index.unresolved == {MISSING: 1}  # owner not seen yet: unresolved, not a crash
    add_owner(index, job)
    # The Job's owner is still unknown: the Job, the topmost configured kind below the break, holds the pod.
    (wl,) = index.workloads.values()
    assert (wl.name, wl.kind, wl.pods) == ("train-workers-0", "Job", {"Running": 1})
    assert index.unresolved == {} and index.chain_broken == {MISSING: 1}
    add_owner(index, js)
    (wl,) = index.workloads.values()  # the Job is configured too, but the TOPMOST configured kind wins
    assert (wl.name, wl.kind, wl.pods) == ("train", "JobSet", {"Running": 1})
    assert index.unresolved == {} and index.chain_broken == {}


def test_leaderworkerset_chain_through_pods() -> None:
    """Pod -> worker StatefulSet -> leader Pod -> leader StatefulSet -> LeaderWorkerSet."""
    index = ClusterIndex()
    index.set_workload_summarizer("w", configured(("leaderworkerset.x-k8s.io", "LeaderWorkerSet"),
                                                  ("apps", "StatefulSet")))
    lws = Owner("lws1", "leaderworkerset.x-k8s.io", "LeaderWorkerSet", "ns", "llm", None)
    leader_sts = Owner("sts-leader", "apps", "StatefulSet", "ns", "llm", "lws1")
    worker_sts = Owner("sts-worker", "apps", "StatefulSet", "ns", "llm-0", "pod-leader")
    plain_sts = Owner("sts-plain", "apps", "StatefulSet", "ns", "db", None)
    for o in (lws, leader_sts, worker_sts, plain_sts):
        add_owner(index, o)
    index.upsert_pod(make_pod("llm-0", "pod-leader", node="n1", owner=ref(leader_sts)))
    for i in (1, 2):
        index.upsert_pod(make_pod(f"llm-0-{i}", f"pod-w{i}", node=f"n{i + 1}", owner=ref(worker_sts)))
    index.upsert_pod(make_pod("db-0", "pod-db", node="n1", owner=ref(plain_sts)))
    by_name = {w.name: w for w in index.workloads.values()}
    assert set(by_name) == {"llm", "db"}
    assert by_name["llm"].kind == "LeaderWorkerSet" and by_name["llm"].pods == {"Running": 3}
    assert by_name["db"].kind == "StatefulSet" and by_name["db"].pods == {"Running": 1}
    # The leader pod goes: until it is back the workers' chain is broken above their StatefulSet,
    # which holds them meanwhile.
    index.delete_pod("ns/llm-0")
    assert index.unresolved == {} and index.chain_broken == {MISSING: 2}
    assert {w.name: w.pods for w in index.workloads.values()} == {
        "llm": {}, "llm-0": {"Running": 2}, "db": {"Running": 1}}
    index.upsert_pod(make_pod("llm-0", "pod-leader", node="n1", owner=ref(leader_sts)))
    assert index.unresolved == {} and index.chain_broken == {} and by_name["llm"].pods == {"Running": 3}
    assert {w.name for w in index.workloads.values()} == {"llm", "db"}


def test_owner_cycle_is_unresolved_not_a_hang() -> None:
    index = ClusterIndex()
    index.set_workload_summarizer("w", configured(("apps", "ReplicaSet")))
    add_owner(index, Owner("a", "apps", "ReplicaSet", "ns", "a", "b"))
    add_owner(index, Owner("b", "apps", "ReplicaSet", "ns", "b", "a"))
    index.upsert_pod(make_pod("p", "p1", owner=ref(("apps", "ReplicaSet", "a"))))
    assert index.unresolved == {CYCLE: 1} and index.workloads == {}
    add_owner(index, Owner("b", "apps", "ReplicaSet", "ns", "b", None))  # the cycle is broken
    assert index.unresolved == {} and [w.name for w in index.workloads.values()] == ["b"]


def test_missing_owner_and_uid_mismatch() -> None:
    index = ClusterIndex()
    index.set_workload_summarizer("w", configured(("apps", "Deployment")))
    add_owner(index, Owner("d-new", "apps", "Deployment", "ns", "web", None))
    # The pod's reference names "web" but carries the UID of an earlier incarnation.
    index.upsert_pod(make_pod("p", "p1", owner=ref(("apps", "Deployment", "d-old"), name="web")))
    assert index.unresolved == {MISSING: 1}
    assert index.workloads["d-new"].pods == {}  # the workload exists, with no pods
    index.upsert_pod(make_pod("q", "q1", owner=ref(("apps", "ReplicaSet", "gone"))))
    assert index.unresolved == {MISSING: 2}


def test_broken_chain_above_a_configured_kind_keeps_the_workload() -> None:
    """Notebook -> StatefulSet -> Pod, the Notebook unknown (its kind forbidden by RBAC, or not
    created yet): the StatefulSet still holds its pods, the break is counted; when the Notebook
    appears, the pods move up to it."""
    index = ClusterIndex()
    notebook = Owner("nb1", "kubeflow.org", "Notebook", "ns", "lab", None)
    sts = Owner("sts1", "apps", "StatefulSet", "ns", "lab", "nb1")
    index.set_workload_summarizer("w", configured(("apps", "StatefulSet"), ("kubeflow.org", "Notebook")))
    add_owner(index, sts)
    index.upsert_pod(make_pod("lab-0", "p0", node="n1", owner=ref(("apps", "StatefulSet", "sts1"))))
    (wl,) = index.workloads.values()
    assert (wl.uid, wl.kind, wl.pods) == ("sts1", "StatefulSet", {"Running": 1})
    assert index.unresolved == {} and index.chain_broken == {MISSING: 1}
    # A pod whose chain has no configured kind below the break stays missing_owner.
    rs = Owner("rs1", "apps", "ReplicaSet", "ns", "web-1", "gone")
    add_owner(index, rs)
    index.upsert_pod(make_pod("web-1-a", "p1", owner=ref(("apps", "ReplicaSet", "rs1"))))
    assert index.unresolved == {MISSING: 1} and index.chain_broken == {MISSING: 1}
    # The Notebook appears: the StatefulSet is no root any more, its pod moves up.
    add_owner(index, notebook)
    assert index.workloads.keys() == {"nb1"} and index.workloads["nb1"].pods == {"Running": 1}
    assert index.chain_broken == {}
    # It goes again: back to the StatefulSet.
    index.delete_owner(("kubeflow.org", "Notebook"), "ns/lab")
    assert index.workloads.keys() == {"sts1"} and index.workloads["sts1"].pods == {"Running": 1}
    assert index.chain_broken == {MISSING: 1}
    # The StatefulSet's kind stops being configured: nothing configured below the break.
    index.set_workload_summarizer("w", configured(("kubeflow.org", "Notebook")))
    assert index.workloads == {} and index.unresolved == {MISSING: 2} and index.chain_broken == {}


def test_depth_limit() -> None:
    index = ClusterIndex(max_depth=10)
    index.set_workload_summarizer("w", configured(("apps", "ReplicaSet")))
    for i in range(12):
        add_owner(index, Owner(f"o{i}", "apps", "ReplicaSet", "ns", f"o{i}", f"o{i + 1}" if i < 11 else None))
    index.upsert_pod(make_pod("deep", "p-deep", owner=ref(("apps", "ReplicaSet", "o0"))))
    index.upsert_pod(make_pod("shallow", "p-ok", owner=ref(("apps", "ReplicaSet", "o3"))))
    assert index.unresolved == {TOO_DEEP: 1}
    assert index.workloads["o11"].pods == {"Running": 1}
