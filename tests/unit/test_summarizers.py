"""The summarizers' status (reconciler/summarizers.py), from an index, without a cluster."""

from __future__ import annotations

from typing import Any

import pytest

from kubeindex.model.index import ClusterIndex, WorkloadAgg
from kubeindex.model.objects import (
    ObjectMeta,
    PodLabelWorkload,
    WorkloadSummarizer,
    WorkloadSummarizerSpec,
    WorkloadType,
)
from kubeindex.watch.sources import Summarizers
from reconciler.summarizers import SummarizerStatuses
from tests.builders import make_pod

GANG = "scheduling.example.com/group"


def _gangs() -> tuple[ClusterIndex, SummarizerStatuses]:
    index = ClusterIndex()
    index.set_workload_summarizer("gangs", [], [PodLabelWorkload(GANG)])
    summarizer = WorkloadSummarizer(ObjectMeta(name="gangs", uid="u1", generation=1),
                                    WorkloadSummarizerSpec(podLabelWorkloads=[PodLabelWorkload(GANG)]))
    statuses = SummarizerStatuses(index, Summarizers(workload={"gangs": summarizer}), lambda *_: None)
    return index, statuses


def _count(statuses: SummarizerStatuses) -> int:
    status = statuses.status_to_write("workloadsummarizers", "gangs", {})
    assert status is not None
    return status["workloadCount"]


def test_the_workload_count_follows_workloads_coming_and_going_and_is_counted_once_between() -> None:
    """Evaluated every second, the count walks the workloads only after their set changed: pod
    changes inside workloads leave it (and the walk) alone."""
    index, statuses = _gangs()
    for i in range(3):
        index.upsert_pod(make_pod(f"p{i}", f"p{i}", labels={GANG: f"g{i}"}))
    assert _count(statuses) == 3

    walks = 0
    workloads = index.workloads

    class Counted(dict[str, WorkloadAgg]):
        def values(self) -> Any:
            nonlocal walks
            walks += 1
            return super().values()

    index.workloads = Counted(workloads)
    index.upsert_pod(make_pod("p0", "p0", phase="Pending", labels={GANG: "g0"}))  # inside a workload
    assert _count(statuses) == 3 and _count(statuses) == 3
    assert walks == 0

    index.upsert_pod(make_pod("p3", "p3", labels={GANG: "g3"}))  # a new workload
    assert _count(statuses) == 4 and _count(statuses) == 4
    assert walks == 1

    index.delete_pod("ns/p1")  # its workload goes with its last pod
    assert _count(statuses) == 3
    assert walks == 2


DEPLOYMENT, JOBSET, LWS = (WorkloadType("Deployment", "apps"), WorkloadType("JobSet", "jobset.x-k8s.io"),
                           WorkloadType("LeaderWorkerSet", "leaderworkerset.x-k8s.io"))


def _conditions(types: list[WorkloadType], problems: dict[str, tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """The conditions of summarizer ``workloads`` listing ``types``, with ``problems`` by kind."""
    index = ClusterIndex()
    index.set_workload_summarizer("workloads", types)
    summarizer = WorkloadSummarizer(ObjectMeta(name="workloads", uid="u1", generation=2),
                                    WorkloadSummarizerSpec(workloadTypes=types))
    statuses = SummarizerStatuses(index, Summarizers(workload={"workloads": summarizer}),
                                  lambda group, kind, version: problems.get(kind))
    status = statuses.status_to_write("workloadsummarizers", "workloads", {("apps", "Deployment")})
    assert status is not None
    return {c["type"]: c for c in status["conditions"]}


def test_a_kind_not_installed_is_a_warning_of_its_own_and_ready_says_the_rest_works() -> None:
    """deploy/summarizers.yaml's sample on a cluster without JobSet or LWS: its Deployments are
    summarized, so Ready is True; KindsServed is False and names the missing kinds."""
    missing = {"JobSet": ("KindNotServed", "jobset.jobset.x-k8s.io is not served by the API server"),
               "LeaderWorkerSet": ("KindNotServed", "leaderworkerset.leaderworkerset.x-k8s.io is not served by the"
                                                     " API server")}
    conditions = _conditions([DEPLOYMENT, JOBSET, LWS], missing)
    ready, served = conditions["Ready"], conditions["KindsServed"]
    assert (ready["status"], ready["reason"]) == ("True", "Summarizing")
    assert ready["message"] == "0 root workloads of the configured types that are served"
    assert (served["status"], served["reason"]) == ("False", "KindNotServed")
    assert "jobset.jobset.x-k8s.io" in served["message"] and "leaderworkerset.leaderworkerset.x-k8s.io" in \
        served["message"]
    assert ready["observedGeneration"] == served["observedGeneration"] == 2

    every = _conditions([DEPLOYMENT], {})
    assert (every["Ready"]["status"], every["KindsServed"]["status"], every["KindsServed"]["reason"]) == (
        "True", "True", "AllKindsServed")


def test_a_kind_served_but_not_summarizable_still_fails_ready() -> None:
    """Forbidden (RBAC) or cluster-scoped: the summarizer does not work for a kind that is there."""
    problems = {"Deployment": ("KindForbidden", "list/watch of deployments.apps is denied"),
                "JobSet": ("KindNotServed", "jobset.jobset.x-k8s.io is not served by the API server")}
    conditions = _conditions([DEPLOYMENT, JOBSET], problems)
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "KindForbidden")
    assert conditions["Ready"]["message"] == "list/watch of deployments.apps is denied"
    assert (conditions["KindsServed"]["status"], conditions["KindsServed"]["reason"]) == ("False", "KindNotServed")


def test_a_problem_is_said_once_per_summarizer_and_forgotten_with_the_summarizer(
        caplog: pytest.LogCaptureFixture) -> None:
    """Evaluated every second, a kind not served is one log line, not one a second; once the
    summarizer is gone its mark goes too (the marks do not grow with summarizers come and gone)."""
    index = ClusterIndex()
    index.set_workload_summarizer("workloads", [JOBSET])
    summarizer = WorkloadSummarizer(ObjectMeta(name="workloads", uid="u1"), WorkloadSummarizerSpec([JOBSET]))
    summarizers = Summarizers(workload={"workloads": summarizer})
    statuses = SummarizerStatuses(index, summarizers, lambda *_: ("KindNotServed", "JobSet is not served"))

    def said() -> int:
        statuses.stale(set())
        return sum("JobSet is not served" in r.getMessage() for r in caplog.records)

    assert [said(), said()] == [1, 1]
    del summarizers.workload["workloads"]
    statuses.stale(set())
    summarizers.workload["workloads"] = summarizer  # as if it came back: its problem is said again
    assert said() == 2

