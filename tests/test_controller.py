"""The reconciler's leadership handling, without a cluster: nothing here reaches an API server."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from typing import Any

import pytest
from kubernetes import client

from kubeindex.api import ApiClient, Connection
from kubeindex.index import ClusterIndex
from kubeindex.objects import NodeSummarizer, NodeSummarizerSpec, ObjectMeta, WorkloadType
from kubeindex.sources import Sources
from reconciler import desired
from reconciler.controller import Reconciler, ReconcilerSettings, Summary, SummaryMeta
from reconciler.desired import Desired, TypeInfo, desired_state
from reconciler.leader import LeaderElector, LeaseSettings
from tests.builders import make_node, make_pod, ref
from tests.reference import Owner


def _reconciler(relist_timeout: float) -> tuple[Reconciler, LeaderElector]:
    api = ApiClient(Connection("https://127.0.0.1:1", False, client.Configuration()))
    elector = LeaderElector(api, LeaseSettings("default", identity="me"))
    sources = Sources(api, ClusterIndex())
    settings = ReconcilerSettings(relist_timeout=relist_timeout)
    return Reconciler(api, sources.index, sources, elector, settings), elector


def _lead(elector: LeaderElector) -> None:
    elector._last_renew = time.monotonic()
    elector._set(True)


def test_a_stalled_relist_holds_a_new_leaders_writes_only_until_the_bound(caplog: pytest.LogCaptureFixture) -> None:
    """A relist that never completes (a WatchList whose initial-events-end bookmark does not come)
    delays the first write of a new leader by relist_timeout, not for ever; the log names it."""

    async def main() -> tuple[bool, float, bool]:
        reconciler, elector = _reconciler(relist_timeout=0.3)
        stalled = reconciler.reflectors[0]
        stalled.connected = True  # in contact, but its LIST never completes
        _lead(elector)
        started = time.monotonic()
        assert not reconciler.leading  # not before the relists (or the bound)
        while not reconciler.leading and time.monotonic() - started < 5:
            await asyncio.sleep(0.02)
        waited = time.monotonic() - started
        relist_still_pending = stalled._relist_requested.is_set()  # the relist itself goes on
        await reconciler.api.close()
        return reconciler.leading, waited, relist_still_pending

    leading, waited, pending = asyncio.run(main())
    assert leading
    assert 0.3 <= waited < 2
    assert pending
    assert "still relisting: own-nodesummaries" in caplog.text


def test_a_new_leader_writes_at_once_when_every_relist_is_done() -> None:
    """Watches out of contact have nothing fresher to give: their relists return at once."""

    async def main() -> float:
        reconciler, elector = _reconciler(relist_timeout=30)
        _lead(elector)
        started = time.monotonic()
        while not reconciler.leading and time.monotonic() - started < 5:
            await asyncio.sleep(0.01)
        await reconciler.api.close()
        return time.monotonic() - started

    assert asyncio.run(main()) < 1


def test_losing_the_lease_stops_the_writes_at_once() -> None:
    async def main() -> tuple[bool, bool]:
        reconciler, elector = _reconciler(relist_timeout=30)
        _lead(elector)
        while not reconciler.leading:
            await asyncio.sleep(0.01)
        before = reconciler.leading
        elector._set(False)
        await reconciler.api.close()
        return before, reconciler.leading

    assert asyncio.run(main()) == (True, False)


def test_the_reconcilers_watches_are_the_sources() -> None:
    """Run, stopped and relisted by the sources, and in their stats (the nws_watch_* metrics);
    not part of the index's readiness, but of the reconciler's."""

    async def main() -> None:
        reconciler, _ = _reconciler(relist_timeout=30)
        sources = reconciler.sources
        names = ["own-nodesummaries", "own-workloadsummaries"]
        assert [r.name for r in sources.watches()] == names and list(sources.stats) == names
        assert not [p for p in sources.sync_problems() if p.startswith("own-")]
        assert [p.split(":")[0] for p in reconciler.not_ready() if p.startswith("own-")] == names
        with pytest.raises(ValueError):
            sources.add_watch(reconciler.reflectors[0])
        await reconciler.api.close()

    asyncio.run(main())


DEPLOYMENTS = {("apps", "Deployment"): TypeInfo("apps/v1", "deploy", "deployment.apps/v1")}
RS = Owner("r1", "apps", "ReplicaSet", "ns", "web-1", "d1")


def _one_deployment(monkeypatch: pytest.MonkeyPatch) -> Reconciler:
    """A reconciler whose index holds node group pool=a (node n-1) and Deployment ns/web, whose
    ReplicaSet's pod p runs on n-1."""
    reconciler, _ = _reconciler(relist_timeout=30)
    index = reconciler.index
    index.set_node_summarizer("pool", "pool")
    index.set_workload_summarizer("w", [WorkloadType(kind="Deployment", group="apps")])
    index.upsert_node(make_node("n-1", {"pool": "a"}))
    index.upsert_owner(("apps", "Deployment"), "ns", "web", "d1", None)
    index.upsert_owner(("apps", "ReplicaSet"), "ns", "web-1", "r1", ("apps/v1", "Deployment", "d1"))
    index.upsert_pod(make_pod("p", "p", node="n-1", owner=ref(RS)))
    reconciler.sources.summarizers.node["pool"] = NodeSummarizer(ObjectMeta(name="pool", uid="uid-pool"),
                                                                 NodeSummarizerSpec("pool"))
    monkeypatch.setattr(reconciler, "type_infos", lambda: DEPLOYMENTS)
    return reconciler


def test_a_pass_queues_what_changed_and_the_worker_makes_it_when_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between full passes a pass only queues the keys of the aggregates that changed; a key's
    desired object is made when a worker takes it. A workload whose pods change in every pass, its
    key waiting for the debounce meanwhile, is made once per write, not once per pass."""
    made: list[Any] = []
    make = desired.workload_summary

    def counted(*args: Any) -> desired.Desired:
        made.append(args)
        return make(*args)

    monkeypatch.setattr(desired, "workload_summary", counted)

    async def main() -> None:
        reconciler = _one_deployment(monkeypatch)
        index = reconciler.index
        key = ("workloadsummaries", "ns/web")
        reconciler.queue_changes()  # the first: a full pass
        first = reconciler.desired[key]
        assert len(made) == 1 and first.status["pods"] == {"Running": 1}
        reconciler.queue.clear()  # taken,
        reconciler.queue.wrote(key)  # and just written: the next changes wait for the debounce
        for phase in ("Pending", "Running", "Succeeded", "Failed", "Pending"):
            index.upsert_pod(make_pod("p", "p", node="n-1", owner=ref(RS), phase=phase))
            reconciler.queue_changes()
        assert len(made) == 1 and reconciler.desired[key] is first  # no pass made it again
        assert key in reconciler.queue._waiting_at  # queued, due after the debounce
        taken = reconciler._desired_now(key)
        assert len(made) == 2 and taken is not None and taken.status["pods"] == {"Pending": 1}
        assert reconciler._desired_now(key) is taken and len(made) == 2  # taken again: nothing new to make
        scratch = {d.key: d for d in desired_state(index, {"pool": "uid-pool"}, DEPLOYMENTS)}
        assert (taken.body, taken.status) == (scratch["ns/web"].body, scratch["ns/web"].status)
        await reconciler.api.close()

    asyncio.run(main())


def test_pod_changes_batch_the_workload_summary_and_wait_longer_for_the_node_summary_than_node_news(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After pod changes the WorkloadSummary waits one debounce from the first (a rollout is one
    write of it, and later changes do not push it off); the NodeSummary, its pods alone changed,
    waits ``pod_debounce`` after its last write; a node's news (a cordon) brings it to one
    debounce after that write."""
    async def main() -> None:
        reconciler = _one_deployment(monkeypatch)
        index, queue, settings = reconciler.index, reconciler.queue, reconciler.settings
        node, work = ("nodesummaries", "pool-a"), ("workloadsummaries", "ns/web")
        reconciler.queue_changes()  # the first pass: every object, at once
        assert {node, work} <= set(queue._queue)
        queue.clear()
        queue.wrote(node)
        written = queue._done_at[node]
        for phase in ("Pending", "Running", "Failed"):
            index.upsert_pod(make_pod("p", "p", node="n-1", owner=ref(RS), phase=phase))
            reconciler.queue_changes()
            await asyncio.sleep(0.05)
        assert not queue._queue
        # On the debounce's beat (whole seconds of the queue's clock): a second later at most.
        assert written + settings.debounce <= queue._waiting_at[work] <= written + 2 * settings.debounce + 0.05
        assert queue._waiting_at[work] % settings.debounce == 0
        assert queue._waiting_at[node] == math.ceil(written + settings.pod_debounce)
        index.upsert_node(make_node("n-1", {"pool": "a"}, unschedulable=True))
        reconciler.queue_changes()
        assert queue._waiting_at[node] == written + settings.debounce
        await reconciler.api.close()

    asyncio.run(main())


def test_a_written_workload_summary_whose_pods_alone_changed_waits_the_pod_debounce(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Once written, a WorkloadSummary whose pods alone changed (phases, pods come and gone) waits
    ``pod_debounce`` after that write, as a NodeSummary does; one of its nodes going NotReady (its
    podsOnUnhealthyNodes) brings it to one debounce after the write."""
    async def main() -> None:
        reconciler = _one_deployment(monkeypatch)
        index, queue, settings = reconciler.index, reconciler.queue, reconciler.settings
        work = ("workloadsummaries", "ns/web")
        reconciler.queue_changes()
        queue.clear()
        queue.wrote(work)
        written = queue._done_at[work]
        index.upsert_pod(make_pod("p", "p", node="n-1", owner=ref(RS), phase="Running"))
        index.upsert_pod(make_pod("q", "q", node="n-1", owner=ref(RS)))
        reconciler.queue_changes()
        assert queue._waiting_at[work] == math.ceil(written + settings.pod_debounce)  # on the 1 s beat
        more = {"cpu": "8", "memory": "16Gi", "pods": "110"}  # news for its NodeSummary, not for it
        index.upsert_node(make_node("n-1", {"pool": "a"}, allocatable=more))
        reconciler.queue_changes()
        assert queue._waiting_at[work] == math.ceil(written + settings.pod_debounce)
        index.upsert_node(make_node("n-1", {"pool": "a"}, ready="False", allocatable=more))
        reconciler.queue_changes()
        assert written + settings.debounce <= queue._waiting_at[work] < written + settings.pod_debounce
        await reconciler.api.close()

    asyncio.run(main())


def test_an_object_at_the_version_our_last_sync_left_is_compared_with_what_that_sync_applied() -> None:
    """Most syncs find the object as the last one left it (its echo, at the version the write's
    answer gave): it is compared with what that sync applied, without projecting its
    managedFields. At any other version (another manager's write) the object itself decides."""

    async def main() -> None:
        reconciler, _ = _reconciler(relist_timeout=30)
        key = ("nodesummaries", "pool-a")
        body = {"kind": "NodeSummary", "metadata": {"name": "pool-a"},
                "spec": {"selector": {"matchLabels": {"p": "a"}}}}
        applied = Desired("nodesummaries", "", "pool-a", body, {"nodeCount": 3})
        echo = Summary(SummaryMeta(name="pool-a", resourceVersion="7"))  # nothing of ours on it, read as it is
        assert reconciler._compare(key, applied, echo) == (False, False)
        reconciler._synced[key] = ("7", applied)
        assert reconciler._compare(key, applied, echo) == (True, True)
        assert reconciler._compare(key, dataclasses.replace(applied, status={"nodeCount": 4}), echo) == (True, False)
        edited = Summary(SummaryMeta(name="pool-a", resourceVersion="8"))
        assert reconciler._compare(key, applied, edited) == (False, False)
        assert reconciler._compare(key, applied, None) == (False, False)
        await reconciler.api.close()

    asyncio.run(main())
