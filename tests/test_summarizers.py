"""The summarizers' status (reconciler/summarizers.py), from an index, without a cluster."""

from __future__ import annotations

from typing import Any

from kubeindex.index import ClusterIndex, WorkloadAgg
from kubeindex.objects import ObjectMeta, PodLabelWorkload, WorkloadSummarizer, WorkloadSummarizerSpec
from kubeindex.sources import Summarizers
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
