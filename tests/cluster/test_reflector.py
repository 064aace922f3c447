"""The reflector (kubeindex/watch/reflector.py) against a real kube-apiserver. The initial list and every
relist, each way (--initial-list), with the WatchList feature gate on (1.36's default) and off: the
state is complete, deletes made while nothing watched are emitted, 410 and restarts are survived, a
handler failure is retried, readiness waits for the initial-events-end bookmark, and auto falls back
to LISTs once per server. A handler failure in a LIST or a watch is repaired by the next relist; a
continue token that expires between pages starts the LIST again, still paged.

The same rules without a control plane, at the end of this module: a scripted transport answers the
reflector's requests and a fake clock steps its backoffs and read timeouts, so each rule (410
relist-and-diff, a refused WatchList, an expired continue token, a silent connection, the backoff
caps) is checked exactly."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kubeindex.client.api import ApiClient, load_connection
from kubeindex.client.watchstream import Framing
from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import PartialObject, Pod
from kubeindex.model.resources import PODS
from kubeindex.watch.reflector import Handler, Reflector, WatchSettings
from kubeindex.watch.sources import Sources
from localkube.cluster import LocalCluster, Options
from tests.kube import RecordingApi, create_pod, delete, serves_watch_list, set_pod_phase, truth, until
from tests.paths import CRDS
from tests.support.reflector import Recorder, reflector, settings


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster, binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    """The session's control plane: each test makes its pods in a namespace of its own (one lists
    every namespace: nothing else changes pods meanwhile). Where WatchList is off by default
    (1.33, make compat), a control plane of this module's own with its feature gate on: the
    WatchList tests run wherever a user can turn it on."""
    if serves_watch_list(cluster):
        yield cluster
        return
    with LocalCluster(Options(extra_apiserver_args=["--feature-gates=WatchList=true"]), binaries) as c:
        c.install_crds(CRDS)
        yield c


def pods(kube: LocalCluster, namespace: str, count: int) -> None:
    kube.kubectl("create", "namespace", namespace)
    for i in range(count):
        create_pod(kube, namespace, f"p-{i}", "n-1")


pytestmark = pytest.mark.compat  # one of the core scenarios make compat runs on every Kubernetes minor


GATE_OFF = "--feature-gates=WatchList=false"


@pytest.fixture(scope="module")
def gate_off(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    """A control plane of this module's own: its WatchList feature gate is off."""
    with LocalCluster(Options(extra_apiserver_args=[GATE_OFF]), binaries) as c:
        c.install_crds(CRDS)
        yield c


async def stopped(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("metadata_only", [False, True], ids=["pods", "metadata-only"])
def test_watchlist_streams_the_state_then_watches(kube: LocalCluster, metadata_only: bool) -> None:
    """One request: the state as ADDED events, synced only at the initial-events-end bookmark, then
    the same stream carries the changes. Metadata-only (PartialObjectMetadata) the same way."""
    ns = f"wl-stream-{int(metadata_only)}"
    pods(kube, ns, 5)
    recorder = Recorder()

    async def run() -> None:
        async with RecordingApi(load_connection(str(kube.kubeconfig))) as api:
            r = reflector(api, ns, "watchlist", recorder, metadata_only, timeout=60)
            task = asyncio.create_task(r.run())
            try:
                await until(r.synced.is_set)
                assert set(recorder.objects) == set(r.store.versions) == truth(kube, ns)
                assert recorder.synced_at_upsert == [False] * 5  # readiness waited for the bookmark
                assert type(next(iter(recorder.objects.values()))) is (PartialObject if metadata_only else Pod)
                assert api.lists == [] and len(api.watches) == 1
                assert "resourceVersion" not in api.watches[0]  # a consistent read
                assert api.watches[0]["resourceVersionMatch"] == "NotOlderThan"
                assert r.resource_version and r.lists == 1 and r.stats.events.get("ADDED") is None
                await asyncio.to_thread(create_pod, kube, ns, "later", "n-1")
                await asyncio.to_thread(delete, kube, PODS.path(ns, "p-0"))
                await until(lambda: set(recorder.objects) == truth(kube, ns), timeout=5)
                assert len(api.watches) == 1 and r.stats.events["ADDED"] == 1  # the same stream
            finally:
                await stopped(task)

    asyncio.run(run())


def test_watchlist_broken_before_its_bookmark_starts_again(kube: LocalCluster) -> None:
    """A connection lost in the middle of the initial state: not synced, and the next WatchList
    starts from scratch (not a watch from some object's resourceVersion)."""
    ns = "wl-broken"
    pods(kube, ns, 6)
    recorder = Recorder()

    async def run() -> None:
        async with RecordingApi(load_connection(str(kube.kubeconfig)), break_after=3) as api:
            r = reflector(api, ns, "watchlist", recorder)
            task = asyncio.create_task(r.run())
            try:
                await until(r.synced.is_set)
                assert recorder.synced_at_upsert.count(True) == 0
                assert api.streamed == 2 and all("resourceVersion" not in w for w in api.watches[:2])
                assert set(recorder.objects) == set(r.store.versions) == truth(kube, ns) and not recorder.deleted
                assert r.stats.restarts.get("truncated") == 1
            finally:
                await stopped(task)

    asyncio.run(run())


def test_watchlist_after_410_emits_the_deletes_made_meanwhile(kube: LocalCluster) -> None:
    """The watch stops; meanwhile a pod is deleted, another created, and every resourceVersion
    expires (compaction, API server restart). The watch gets 410, the WatchList that follows is
    diffed against the store: the delete is emitted."""
    ns = "wl-gone"
    pods(kube, ns, 4)
    recorder = Recorder()

    async def run() -> None:
        async with RecordingApi(load_connection(str(kube.kubeconfig))) as api:
            r = reflector(api, ns, "watchlist", recorder)
            task = asyncio.create_task(r.run())
            await until(r.synced.is_set)
            await stopped(task)
            delete(kube, PODS.path(ns, "p-0"))
            create_pod(kube, ns, "meanwhile", "n-1")
            kube.expire_resource_versions()  # on this thread: its children die with the thread that started them
            task = asyncio.create_task(r.run())
            try:
                await until(lambda: r.lists == 2, timeout=30)
                assert r.stats.restarts.get("gone") == 1 and api.streamed == 2
                assert recorder.deleted == [f"{ns}/p-0"]
                assert set(recorder.objects) == set(r.store.versions) == truth(kube, ns)
            finally:
                await stopped(task)

    asyncio.run(run())


def test_watchlist_through_an_api_server_restart(kube: LocalCluster) -> None:
    ns = "wl-restart"
    pods(kube, ns, 3)
    recorder = Recorder()

    async def run() -> None:
        async with RecordingApi(load_connection(str(kube.kubeconfig))) as api:
            r = reflector(api, ns, "watchlist", recorder, timeout=60)
            task = asyncio.create_task(r.run())
            try:
                await until(r.synced.is_set)
                apiserver = kube.processes["kube-apiserver"]
                apiserver.stop(sig=signal.SIGKILL)  # a crash
                await until(lambda: not r.contact.connected, timeout=10)
                apiserver.start()  # on this thread: its children die with the thread that started them
                await asyncio.to_thread(kube.wait_apiserver_ready)
                await asyncio.to_thread(delete, kube, PODS.path(ns, "p-1"))
                await asyncio.to_thread(create_pod, kube, ns, "after", "n-1")
                await until(lambda: set(recorder.objects) == truth(kube, ns), timeout=30)
                assert set(r.store.versions) == truth(kube, ns) and r.contact.connected and r.synced.is_set()
            finally:
                await stopped(task)

    asyncio.run(run())


def test_a_handler_failure_in_the_initial_state_is_retried(kube: LocalCluster) -> None:
    """The failed object's resourceVersion is not recorded; the next WatchList hands it over again."""
    ns = "wl-flaky"
    pods(kube, ns, 4)
    recorder = Recorder()
    recorder.flaky = {"p-2"}

    async def run() -> None:
        async with RecordingApi(load_connection(str(kube.kubeconfig))) as api:
            r = reflector(api, ns, "watchlist", recorder)
            task = asyncio.create_task(r.run())
            try:
                await until(r.synced.is_set)
                assert f"{ns}/p-2" not in r.store.versions and r.store.failed == {f"{ns}/p-2"}
                assert r.stats.handler_errors == 1
                # The watch ends (timeoutSeconds=3): a WatchList again, because of the failure.
                await until(lambda: f"{ns}/p-2" in r.store.versions, timeout=15)
                assert set(recorder.objects) == set(r.store.versions) == truth(kube, ns) and not r.store.failed
                assert api.streamed == 2
            finally:
                await stopped(task)

    asyncio.run(run())


def test_relist_on_request_is_a_fresh_watchlist(kube: LocalCluster) -> None:
    """Reflector.relist() (a new leader's fresh view) returns after a WatchList made after the call."""
    ns = "wl-relist"
    pods(kube, ns, 2)
    recorder = Recorder()

    async def run() -> None:
        async with RecordingApi(load_connection(str(kube.kubeconfig))) as api:
            r = reflector(api, ns, "watchlist", recorder, timeout=60)
            task = asyncio.create_task(r.run())
            try:
                await until(r.synced.is_set)
                await asyncio.wait_for(r.relist(), 10)
                assert r.lists == 2 and api.streamed == 2 and api.lists == []
            finally:
                await stopped(task)

    asyncio.run(run())


def test_cache_mode_never_goes_back_in_time(kube: LocalCluster) -> None:
    """cache: the first LIST at resourceVersion=0, relists NotOlderThan the last resourceVersion."""
    ns = "wl-cache"
    pods(kube, ns, 3)
    recorder = Recorder()

    async def run() -> None:
        async with RecordingApi(load_connection(str(kube.kubeconfig))) as api:
            r = reflector(api, ns, "cache", recorder, timeout=60)
            task = asyncio.create_task(r.run())
            try:
                await until(r.synced.is_set)
                assert api.lists == [{"limit": "2", "resourceVersion": "0"}] and api.streamed == 0
                seen = r.resource_version
                await asyncio.wait_for(r.relist(), 10)
                assert api.lists[1] == {"limit": "2", "resourceVersion": seen, "resourceVersionMatch": "NotOlderThan"}
                assert all("resourceVersion" not in p for p in api.lists[2:])  # pages: the token holds it
                assert set(recorder.objects) == set(r.store.versions) == truth(kube, ns)
            finally:
                await stopped(task)

    asyncio.run(run())


def test_list_mode_lists(kube: LocalCluster) -> None:
    ns = "wl-list"
    pods(kube, ns, 3)
    recorder = Recorder()

    async def run() -> None:
        async with RecordingApi(load_connection(str(kube.kubeconfig))) as api:
            r = reflector(api, ns, "list", recorder, timeout=60)
            task = asyncio.create_task(r.run())
            try:
                await until(r.synced.is_set)
                assert api.streamed == 0 and api.lists[0] == {"limit": "2"}
                assert set(recorder.objects) == truth(kube, ns)
            finally:
                await stopped(task)

    asyncio.run(run())


class FlakyIndex(ClusterIndex):
    """upsert_pod raises once for each name in ``flaky``."""

    def __init__(self, flaky: set[str]) -> None:
        super().__init__()
        self.flaky = set(flaky)

    def upsert_pod(self, pod: Pod) -> str:
        if pod.metadata.name in self.flaky:
            self.flaky.discard(pod.metadata.name)
            raise RuntimeError(f"injected failure for {pod.metadata.name}")
        return super().upsert_pod(pod)


def test_handler_failure_in_a_list_is_retried_by_the_next_relist(kube: LocalCluster,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Before: the exception escaped _list_and_sync, so one bad object aborted the whole LIST
    (and the store had recorded the pages before it)."""
    ns = "flaky-list"
    kube.kubectl("create", "namespace", ns)
    for i in range(5):
        create_pod(kube, ns, f"p-{i}", "n-1")
    index = FlakyIndex({"p-2"})

    async def run() -> tuple[set[str], set[str], set[str], set[str], int]:
        async with ApiClient(load_connection(str(kube.kubeconfig))) as api:
            reflector = Reflector(api, "pods", PODS.path(ns), Pod,
                                  Handler(index.upsert_pod, index.delete_pod), settings=settings("auto"))
            await reflector._sync_by_list()  # the failure is logged and counted, the LIST completes
            first = (set(reflector.store.versions), set(index.pods), set(reflector.store.failed))
            await reflector._sync_by_list()  # the relist retries p-2
            return *first, set(reflector.store.versions), reflector.stats.handler_errors

    caplog.set_level(logging.ERROR, logger="kubeindex.watch.reflector")
    store, pods, failed, store_after, errors = asyncio.run(run())
    everything = truth(kube, ns)
    assert store == pods == everything - {f"{ns}/p-2"} and failed == {f"{ns}/p-2"}
    assert f"handler failed for {ns}/p-2" in caplog.text and errors == 1
    assert store_after == set(index.pods) == everything


def test_handler_failure_in_a_watch_is_repaired_by_a_relist(kube: LocalCluster) -> None:
    """Before: _handle recorded the new resourceVersion before the handler raised, so the relist
    that followed skipped the object and the index kept the old phase for good."""
    ns = "flaky-watch"
    kube.kubectl("create", "namespace", ns)
    create_pod(kube, ns, "a", "n-1", phase="Pending")
    create_pod(kube, ns, "b", "n-1", phase="Pending")
    index = FlakyIndex(set())

    def phase(name: str) -> str | None:
        entry = index.pods.get(f"{ns}/{name}")
        return entry.phase if entry else None

    async def run() -> None:
        async with ApiClient(load_connection(str(kube.kubeconfig))) as api:
            reflector = Reflector(api, "pods", PODS.path(ns), Pod,
                                  Handler(index.upsert_pod, index.delete_pod), settings=settings("auto"))
            task = asyncio.create_task(reflector.run())
            try:
                await until(reflector.synced.is_set)
                index.flaky = {"a"}
                await asyncio.to_thread(set_pod_phase, kube, ns, "a", "Running")  # its handler raises
                await until(lambda: reflector.stats.handler_errors == 1)
                await asyncio.to_thread(set_pod_phase, kube, ns, "b", "Running")  # the loop goes on
                await until(lambda: phase("b") == "Running", timeout=2)
                assert phase("a") == "Pending" and not task.done()
                # The watch ends (timeoutSeconds=3): the relist it is due hands "a" over again.
                await until(lambda: phase("a") == "Running", timeout=15)
                assert set(reflector.store.versions) == truth(kube, ns) and not reflector.store.failed
            finally:
                task.cancel()

    asyncio.run(run())


def test_continue_token_expiring_during_a_paged_list(kube: LocalCluster, caplog: pytest.LogCaptureFixture) -> None:
    """Between two pages of a LIST the resourceVersion expires (compaction + restart) and a pod
    from the first page is deleted: the reflector lists again from the first page, still paged
    (an unpaginated LIST of 150k pods times out or runs out of memory), and the index is exact.
    Before: the fallback was one LIST without `limit`."""
    ns = "paged"
    pods(kube, ns, 6)
    index = ClusterIndex()

    class ExpiringBetweenPages(ApiClient):
        expired = False
        unpaginated = 0  # requests without `limit`

        async def get_frames(self, path: str, params: dict[str, str] | None, accept: str,
                             framing: Callable[[str], Framing], on_frame: Callable[[bytes], None],
                             timeout: float = 60) -> None:
            self.unpaginated += "limit" not in (params or {})
            if params and "continue" in params and not self.expired:
                self.expired = True
                delete(kube, PODS.path(ns, "p-0"))  # listed on page 1, now gone
                kube.expire_resource_versions()  # on this thread: its children die with the thread that started them
            await super().get_frames(path, params, accept, framing, on_frame, timeout)

    async def run() -> tuple[bool, int, set[str]]:
        async with ExpiringBetweenPages(load_connection(str(kube.kubeconfig))) as api:
            reflector = Reflector(api, "pods", PODS.path(), Pod, Handler(index.upsert_pod, index.delete_pod),
                                  settings=WatchSettings(page_size=2))
            await reflector._sync_by_list()
            return api.expired, api.unpaginated, set(reflector.store.versions)

    caplog.set_level(logging.INFO, logger="kubeindex.watch.reflector")
    expired, unpaginated, store = asyncio.run(run())
    assert expired and "continue token expired after" in caplog.text
    assert "listing again from the first page" in caplog.text and unpaginated == 0
    truth = set(kube.kubectl("get", "pods", "-A", "-o", "jsonpath={range .items[*]}{.metadata.namespace}/"
                             "{.metadata.name} {end}").stdout.split())
    assert store == truth and set(index.pods) == truth
    assert f"{ns}/p-0" not in index.pods


class Before134(RecordingApi):
    """A client that takes the server for 1.33, whose auto tries a WatchList (from 1.34 it lists
    without asking: test_compat checks which way each version's server is read)."""

    async def get(self, path: str, params: dict[str, str] | None = None, accept: str = "application/json",
                  timeout: float = 60) -> bytes:
        body = await super().get(path, params, accept, timeout)
        if path == "/version":
            body = json.dumps({**json.loads(body), "minor": "33"}).encode()
        return body


def test_auto_falls_back_to_lists_once_per_server(gate_off: LocalCluster, caplog: pytest.LogCaptureFixture) -> None:
    """The server answers 422 ("sendInitialEvents is forbidden for watch unless the WatchList
    feature gate is enabled"): every reflector of the client lists, the refusal logged once and
    never asked again, relists included."""
    caplog.set_level(logging.INFO)
    pods(gate_off, "wl-off", 3)

    async def run() -> None:
        async with Before134(load_connection(str(gate_off.kubeconfig))) as api:
            sources = Sources(api, ClusterIndex(), settings("auto"))
            await sources.start()
            try:
                await until(sources.ready.is_set)
                assert "WatchList feature gate" in api.watch_list_refused
                tried = api.streamed
                assert 1 <= tried <= len(sources.reflectors)  # at most the ones that started together
                assert {f"wl-off/p-{i}" for i in range(3)} <= set(sources.index.pods)
                await asyncio.wait_for(sources.relist(), 20)
                await asyncio.sleep(4)  # every watch ended (timeoutSeconds=3) and started again
                assert api.streamed == tried and sources.sync_problems() == []
            finally:
                await sources.stop()

    asyncio.run(run())
    assert caplog.text.count("refused a WatchList") == 1, caplog.text
    assert caplog.text.count("LIST pages after the first come from etcd (auto: a WatchList, where it serves one)") == 1


def test_forced_watchlist_against_a_server_without_it(gate_off: LocalCluster) -> None:
    """--initial-list=watchlist does not fall back: the 422 is the reflector's error, not synced."""
    recorder = Recorder()

    async def run() -> None:
        async with RecordingApi(load_connection(str(gate_off.kubeconfig))) as api:
            r = reflector(api, "default", "watchlist", recorder)
            task = asyncio.create_task(r.run())
            try:
                await until(lambda: r.contact.last_error_status == 422)
                assert "WatchList feature gate" in r.contact.last_error and not r.synced.is_set() and api.lists == []
                problem = r.problem(60)
                assert problem is not None and problem.startswith("initial sync in progress (last error: ")
                assert api.watch_list_refused == ""
            finally:
                await stopped(task)

    asyncio.run(run())
