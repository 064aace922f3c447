"""The reconciler's manager (leadership, its watches) and the summary controller (pacing, made at
take time, compared with the last sync), without a cluster: nothing here reaches an API server."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import pytest
from kubernetes import client

from kubeindex.client.api import ApiClient, Connection
from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import NodeSummarizer, NodeSummarizerSpec, ObjectMeta, WorkloadType
from kubeindex.model.resources import WORKLOAD_SUMMARIES, Resource
from kubeindex.watch.sources import Sources
from reconciler import desired
from reconciler.desired import TypeInfo, desired_state
from reconciler.leader import LeaderElector, LeaseSettings
from reconciler.manager import DONE, RETRY, Controller, Key, Manager, ReconcilerSettings, Result
from reconciler.summaries import Summary, SummaryController, SummaryMeta
from reconciler.writer import Writer
from tests.builders import make_node, make_pod, ref
from tests.reference import Owner


def _manager(relist_timeout: float) -> tuple[Manager, SummaryController, LeaderElector]:
    api = ApiClient(Connection("https://127.0.0.1:1", False, client.Configuration()))
    elector = LeaderElector(api, LeaseSettings("default", identity="me"))
    sources = Sources(api, ClusterIndex())
    settings = ReconcilerSettings(relist_timeout=relist_timeout)
    manager = Manager(api, sources, elector, settings)
    return manager, manager.add(SummaryController(api, sources.index, sources, manager.writer, settings)), elector


def _lead(elector: LeaderElector) -> None:
    elector._last_renew = time.monotonic()
    elector._set(True)


def test_a_stalled_relist_holds_a_new_leaders_writes_only_until_the_bound(caplog: pytest.LogCaptureFixture) -> None:
    """A relist that never completes (a WatchList whose initial-events-end bookmark does not come)
    delays the first write of a new leader by relist_timeout, not for ever; the log names it."""

    async def main() -> tuple[bool, float, bool]:
        manager, _, elector = _manager(relist_timeout=0.3)
        stalled = manager.watches[0]
        stalled.contact.connected = True  # in contact, but its LIST never completes
        _lead(elector)
        started = time.monotonic()
        assert not manager.leading  # not before the relists (or the bound)
        while not manager.leading and time.monotonic() - started < 5:
            await asyncio.sleep(0.02)
        waited = time.monotonic() - started
        relist_still_pending = stalled._relist_requested.is_set()  # the relist itself goes on
        await manager.api.close()
        return manager.leading, waited, relist_still_pending

    leading, waited, pending = asyncio.run(main())
    assert leading
    assert 0.3 <= waited < 2
    assert pending
    assert "still relisting: own-nodesummaries" in caplog.text


def test_a_new_leader_writes_at_once_when_every_relist_is_done() -> None:
    """Watches out of contact have nothing fresher to give: their relists return at once."""

    async def main() -> float:
        manager, _, elector = _manager(relist_timeout=30)
        _lead(elector)
        started = time.monotonic()
        while not manager.leading and time.monotonic() - started < 5:
            await asyncio.sleep(0.01)
        await manager.api.close()
        return time.monotonic() - started

    assert asyncio.run(main()) < 1


def test_losing_the_lease_stops_the_writes_at_once() -> None:
    async def main() -> tuple[bool, bool]:
        manager, _, elector = _manager(relist_timeout=30)
        _lead(elector)
        while not manager.leading:
            await asyncio.sleep(0.01)
        before = manager.leading
        elector._set(False)
        await manager.api.close()
        return before, manager.leading

    assert asyncio.run(main()) == (True, False)


def test_the_reconcilers_watches_are_the_sources() -> None:
    """Run, stopped and relisted by the sources, and in their stats (the nws_watch_* metrics);
    not part of the index's readiness, but of the reconciler's."""

    async def main() -> None:
        manager, _, _ = _manager(relist_timeout=30)
        sources = manager.sources
        names = ["own-nodesummaries", "own-workloadsummaries"]
        assert [r.name for r in sources.watches()] == names and list(sources.stats) == names
        assert not [p for p in sources.sync_problems() if p.startswith("own-")]
        assert [p.split(":")[0] for p in manager.not_ready() if p.startswith("own-")] == names
        with pytest.raises(ValueError):
            sources.add_watch(manager.watches[0])
        await manager.api.close()

    asyncio.run(main())


class Things(Controller):
    """The smallest controller: one key, queued by its first pass, and what each reconcile of it
    answers, in turn."""

    name = "things"
    resources = (Resource("example.com", "v1", "Thing", "things", False),)

    def __init__(self, answers: list[Result | Exception]) -> None:
        super().__init__()
        self.answers = answers
        self.taken: list[float] = []

    def queue_changes(self) -> None:
        if self._resync:
            self._resync = False
            self.queue.add(("things", "a"))

    async def reconcile(self, key: Key) -> Result:
        self.taken.append(time.monotonic())
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_a_controller_is_one_class_and_one_add_and_its_worker_does_what_reconcile_asks(
        caplog: pytest.LogCaptureFixture) -> None:
    """A retry is backed off (0.2 s, then 0.4 s); an exception is logged with the key and retried
    the same way; ``requeue_after`` takes the key again after that long; done is done (the key is
    not taken a fifth time). The queue carries the controller's name (its metrics' label)."""

    async def main() -> Things:
        api = ApiClient(Connection("https://127.0.0.1:1", False, client.Configuration()))
        sources = Sources(api, ClusterIndex())
        sources.ready.set()
        manager = Manager(api, sources, None, ReconcilerSettings(interval=0.01))
        things = manager.add(Things([RETRY, RuntimeError("a bug"), Result(requeue_after=0.1), DONE]))
        running = asyncio.create_task(manager.run())
        started = time.monotonic()
        while len(things.taken) < 4 and time.monotonic() - started < 5:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # nothing more
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await api.close()
        return things

    things = asyncio.run(main())
    gaps = [b - a for a, b in zip(things.taken, things.taken[1:], strict=False)]
    assert len(things.taken) == 4 and things.answers == []
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4 and gaps[2] >= 0.1, gaps  # never sooner; later on a loaded machine
    assert (things.queue.name, things.queue.retries) == ("things", 2)
    assert "sync of Thing a failed" in caplog.text and "a bug" in caplog.text


DEPLOYMENTS = {("apps", "Deployment"): TypeInfo("apps/v1", "deploy", "deployment.apps/v1")}
RS = Owner("r1", "apps", "ReplicaSet", "ns", "web-1", "d1")


class Writes:
    """The API server as the writer meets it: each request recorded, answered with the object at a
    new resourceVersion."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.version = 6

    async def request(self, method: str, path: str, body: object = None, *, params: dict[str, str] | None = None,
                      content_type: str = "", timeout: float = 30) -> bytes:
        self.calls.append((method, path, body))
        self.version += 1
        return json.dumps({"metadata": {"resourceVersion": str(self.version)}}).encode()

    def take(self) -> list[tuple[str, str, Any]]:
        calls, self.calls = self.calls, []
        return calls


def _one_deployment(monkeypatch: pytest.MonkeyPatch) -> tuple[SummaryController, Writes]:
    """A summary controller whose index holds node group pool=a (node n-1) and Deployment ns/web,
    whose ReplicaSet's pod p runs on n-1; its writes recorded."""
    api = ApiClient(Connection("https://127.0.0.1:1", False, client.Configuration()))
    sources, writes = Sources(api, ClusterIndex()), Writes()
    controller = SummaryController(api, sources.index, sources, Writer(writes))
    index = controller.index
    index.set_node_summarizer("pool", "pool")
    index.set_workload_summarizer("w", [WorkloadType(kind="Deployment", group="apps")])
    index.upsert_node(make_node("n-1", {"pool": "a"}))
    index.upsert_owner(("apps", "Deployment"), "ns", "web", "d1", None)
    index.upsert_owner(("apps", "ReplicaSet"), "ns", "web-1", "r1", ("apps/v1", "Deployment", "d1"))
    index.upsert_pod(make_pod("p", "p", node="n-1", owner=ref(RS)))
    sources.summarizers.node["pool"] = NodeSummarizer(ObjectMeta(name="pool", uid="uid-pool"),
                                                      NodeSummarizerSpec("pool"))
    monkeypatch.setattr(controller, "type_infos", lambda: DEPLOYMENTS)
    return controller, writes


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
        controller, writes = _one_deployment(monkeypatch)
        index = controller.index
        key = ("workloadsummaries", "ns/web")
        controller.queue_changes()  # the first: a full pass
        assert len(made) == 1
        controller.queue.clear()  # taken,
        controller.queue.wrote(key)  # and just written: the next changes wait for the debounce
        for phase in ("Pending", "Running", "Succeeded", "Failed", "Pending"):
            index.upsert_pod(make_pod("p", "p", node="n-1", owner=ref(RS), phase=phase))
            controller.queue_changes()
        assert len(made) == 1  # no pass made it again
        assert key in controller.queue._waiting_at  # queued, due after the debounce
        assert await controller.reconcile(key) == DONE
        (_, path, body), (_, status_path, status) = writes.take()  # none of it exists: applied, then its status
        assert len(made) == 2 and status["status"]["pods"] == {"Pending": 1}
        assert (path, status_path) == (WORKLOAD_SUMMARIES.path("ns", "web"),
                                       WORKLOAD_SUMMARIES.path("ns", "web", "status"))
        await controller.reconcile(key)
        assert len(made) == 2  # taken again: nothing new to make
        scratch = {d.key: d for d in desired_state(index, {"pool": "uid-pool"}, DEPLOYMENTS)}
        assert (body, status["status"]) == (scratch["ns/web"].body, scratch["ns/web"].status)
        await controller.sources.api.close()

    asyncio.run(main())


def test_pod_changes_batch_the_workload_summary_and_wait_longer_for_the_node_summary_than_node_news(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After pod changes the WorkloadSummary waits one debounce from the first (a rollout is one
    write of it, and later changes do not push it off); the NodeSummary, its pods alone changed,
    waits ``pod_debounce`` after its last write; a node's news (a cordon) brings it to one
    debounce after that write."""
    async def main() -> None:
        controller, _ = _one_deployment(monkeypatch)
        index, queue, settings = controller.index, controller.queue, controller.settings
        node, work = ("nodesummaries", "pool-a"), ("workloadsummaries", "ns/web")
        controller.queue_changes()  # the first pass: every object, at once
        assert {node, work} <= set(queue._queue)
        queue.clear()
        queue.wrote(node)
        written = queue._done_at[node]
        for phase in ("Pending", "Running", "Failed"):
            index.upsert_pod(make_pod("p", "p", node="n-1", owner=ref(RS), phase=phase))
            controller.queue_changes()
            await asyncio.sleep(0.05)
        assert not queue._queue
        # On the debounce's beat (whole seconds of the queue's clock): a second later at most.
        assert written + settings.debounce <= queue._waiting_at[work] <= written + 2 * settings.debounce + 0.05
        assert queue._waiting_at[work] % settings.debounce == 0
        assert queue._waiting_at[node] == math.ceil(written + settings.pod_debounce)
        index.upsert_node(make_node("n-1", {"pool": "a"}, unschedulable=True))
        controller.queue_changes()
        assert queue._waiting_at[node] == written + settings.debounce
        await controller.sources.api.close()

    asyncio.run(main())


def test_a_written_workload_summary_whose_pods_alone_changed_waits_the_pod_debounce(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Once written, a WorkloadSummary whose pods alone changed (phases, pods come and gone) waits
    ``pod_debounce`` after that write, as a NodeSummary does; one of its nodes going NotReady (its
    podsOnUnhealthyNodes) brings it to one debounce after the write."""
    async def main() -> None:
        controller, _ = _one_deployment(monkeypatch)
        index, queue, settings = controller.index, controller.queue, controller.settings
        work = ("workloadsummaries", "ns/web")
        controller.queue_changes()
        queue.clear()
        queue.wrote(work)
        written = queue._done_at[work]
        index.upsert_pod(make_pod("p", "p", node="n-1", owner=ref(RS), phase="Running"))
        index.upsert_pod(make_pod("q", "q", node="n-1", owner=ref(RS)))
        controller.queue_changes()
        assert queue._waiting_at[work] == math.ceil(written + settings.pod_debounce)  # on the 1 s beat
        more = {"cpu": "8", "memory": "16Gi", "pods": "110"}  # news for its NodeSummary, not for it
        index.upsert_node(make_node("n-1", {"pool": "a"}, allocatable=more))
        controller.queue_changes()
        assert queue._waiting_at[work] == math.ceil(written + settings.pod_debounce)
        index.upsert_node(make_node("n-1", {"pool": "a"}, ready="False", allocatable=more))
        controller.queue_changes()
        assert written + settings.debounce <= queue._waiting_at[work] < written + settings.pod_debounce
        await controller.sources.api.close()

    asyncio.run(main())


def test_an_object_at_the_version_our_last_sync_left_is_compared_with_what_that_sync_applied(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Most syncs find the object as the last one left it (its echo, at the version the write's
    answer gave): it is compared with what that sync applied, without projecting its
    managedFields, and its echo queues nothing. At any other version (another manager's write) the
    object itself decides."""

    async def main() -> None:
        controller, writes = _one_deployment(monkeypatch)
        own = controller.watches[0].store.handler  # the watch of our NodeSummaries
        key = ("nodesummaries", "pool-a")
        controller.queue_changes()
        controller.queue.clear()
        await controller.reconcile(key)
        assert [path.rsplit("/", 1)[1] for _, path, _ in writes.take()] == ["pool-a", "status"]
        echo = Summary(SummaryMeta(name="pool-a", resourceVersion=str(writes.version)))  # nothing of ours on it
        own.upsert(echo)
        assert len(controller.queue) == 0  # our own write coming back
        await controller.reconcile(key)
        assert writes.take() == []  # as the last sync left it
        controller.index.upsert_node(make_node("n-2", {"pool": "a"}))
        controller.queue_changes()
        await controller.reconcile(key)
        [(_, path, body)] = writes.take()  # the status alone differs from what the last sync applied
        assert path.endswith("/pool-a/status") and body["status"]["nodeCount"] == 2
        own.upsert(Summary(SummaryMeta(name="pool-a", resourceVersion="99")))  # another manager's write
        assert len(controller.queue) == 1
        await controller.reconcile(key)
        assert [path.rsplit("/", 1)[1] for _, path, _ in writes.take()] == ["pool-a", "status"]  # taken back
        await controller.sources.api.close()

    asyncio.run(main())
