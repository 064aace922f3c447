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
import random
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from kubeindex.client import protobuf
from kubeindex.client.api import ApiClient, ApiError, Gone, error_from_body, load_connection, transport_error
from kubeindex.client.watchstream import Framing
from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import PartialObject, Pod, object_key
from kubeindex.model.resources import PODS
from kubeindex.watch.reflector import INITIAL_EVENTS_END, Handler, InitialList, Reflector, WatchSettings
from kubeindex.watch.sources import Sources
from localkube.cluster import LocalCluster, Options
from tests.clock import FakeClock, settle
from tests.kube import RecordingApi, create_pod, delete, serves_watch_list, set_pod_phase, truth, until
from tests.paths import CRDS

pytestmark = pytest.mark.compat  # one of the core scenarios make compat runs on every Kubernetes minor

GATE_OFF = "--feature-gates=WatchList=false"


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


@pytest.fixture(scope="module")
def gate_off(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    """A control plane of this module's own: its WatchList feature gate is off."""
    with LocalCluster(Options(extra_apiserver_args=[GATE_OFF]), binaries) as c:
        c.install_crds(CRDS)
        yield c


def settings(mode: InitialList, timeout: int = 3) -> WatchSettings:
    return WatchSettings(page_size=2, timeout_min=timeout, timeout_max=timeout, read_timeout=5, initial_list=mode)


def pods(kube: LocalCluster, namespace: str, count: int) -> None:
    kube.kubectl("create", "namespace", namespace)
    for i in range(count):
        create_pod(kube, namespace, f"p-{i}", "n-1")


class Recorder:
    """A handler keeping what it was given, noting whether the reflector was synced at each upsert;
    ``flaky``: names whose next upsert raises."""

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}
        self.deleted: list[str] = []
        self.synced_at_upsert: list[bool] = []
        self.flaky: set[str] = set()
        self.reflector: Reflector | None = None

    def upsert(self, obj: Any) -> None:
        assert self.reflector is not None
        self.synced_at_upsert.append(self.reflector.synced.is_set())
        if obj.metadata.name in self.flaky:
            self.flaky.discard(obj.metadata.name)
            raise RuntimeError(f"injected failure for {obj.metadata.name}")
        self.objects[object_key(obj.metadata)] = obj

    def delete(self, key: str) -> None:
        self.deleted.append(key)
        self.objects.pop(key, None)


def reflector(api: ApiClient, namespace: str, mode: InitialList, recorder: Recorder, metadata_only: bool = False,
              timeout: int = 3) -> Reflector:
    item = PartialObject if metadata_only else Pod
    r = Reflector(api, "pods", PODS.path(namespace), item,
                  Handler(recorder.upsert, recorder.delete), metadata_only=metadata_only,
                  settings=settings(mode, timeout))
    recorder.reflector = r
    return r


async def stopped(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# -- WatchList on --------------------------------------------------------------------------------

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


# -- the other ways --------------------------------------------------------------------------------

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


# -- a handler that raises ----------------------------------------------------------------------

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


# -- paged LISTs ---------------------------------------------------------------------------------------

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


# -- WatchList off -----------------------------------------------------------------------------------

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


# -- the same rules, scripted: no control plane, a fake clock ---------------------------------------

PATH = "/apis/apps/v1/replicasets"
ListAnswer = bytes | ApiError  # a page, or an error to raise


def obj(name: str, rv: str) -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": rv}}


def page(rv: str, *items: dict, cont: str = "") -> bytes:
    return json.dumps({"metadata": {"resourceVersion": rv, "continue": cont}, "items": list(items)}).encode()


def event(kind: str, body: dict) -> bytes:
    return json.dumps({"type": kind, "object": body}).encode()


def bookmark(rv: str, initial_end: bool = False) -> bytes:
    annotations = {INITIAL_EVENTS_END: "true"} if initial_end else {}
    return event("BOOKMARK", {"metadata": {"resourceVersion": rv, "annotations": annotations}})


class Silent:
    """A watch that sends nothing: the read timeout ends it."""


SILENT = Silent()
WatchLine = bytes | ApiError | Silent


class ScriptedApi:
    """Answers LIST pages and watch streams in the order scripted, and records every request.
    A watch script is a list of lines, ending with an ApiError to raise, SILENT, or nothing (the
    server closes the stream); an exhausted script blocks (a quiet, healthy watch)."""

    def __init__(self, clock: FakeClock, lists: list[ListAnswer], watches: list[list[WatchLine]],
                 stream: bool = False, content_type: str = "application/json") -> None:
        self.clock = clock
        self.content_type = content_type  # of every watch answer
        self.lists = lists
        self.watches = watches
        self.streams_lists = stream
        self.watch_list_refused = ""
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.gathers: list[float | None] = []  # what the watch's gather said before each line

    async def auto_initial_list(self) -> Literal["watchlist", "list"]:
        return "watchlist" if self.streams_lists and not self.watch_list_refused else "list"

    async def page_size(self) -> int:
        return 500

    async def get_frames(self, path: str, params: dict[str, str] | None, accept: str,
                         framing: Callable[[str], Framing], on_frame: Callable[[bytes], None],
                         timeout: float = 60) -> None:
        self.requests.append(("LIST", dict(params or {})))
        answer = self.lists.pop(0)
        if isinstance(answer, ApiError):
            raise answer
        cut = framing(protobuf.MEDIA_TYPE if answer.startswith(protobuf.MAGIC) else "application/json")
        for at in range(0, len(answer), 7):  # in pieces that cut fields, as a network does
            for frame in cut.feed(answer[at:at + 7]):
                on_frame(frame)
        for frame in cut.end():
            on_frame(frame)

    async def watch(self, path: str, params: dict[str, str], accept: str, read_timeout: float,
                    on_frame: Callable[[bytes], None], connect_timeout: float = 15,
                    on_open: Callable[[str], None] | None = None,
                    gather: Callable[[], float] | None = None) -> None:
        self.requests.append(("WATCH", dict(params)))
        script = self.watches.pop(0) if self.watches else []
        if script and isinstance(script[0], ApiError):
            raise script[0]  # refused before any answer
        if on_open is not None:
            on_open(self.content_type)
        for line in script:
            if isinstance(line, ApiError):
                raise line
            if isinstance(line, Silent):
                await self.clock.sleep(read_timeout)
                raise transport_error(TimeoutError())
            self.gathers.append(gather() if gather is not None else None)  # as the stream asks, after a read
            on_frame(line)
        if not script:
            await asyncio.Event().wait()  # a quiet watch: until cancelled


class Calls:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def handler(self) -> Handler[PartialObject]:
        return Handler(lambda o: self.calls.append(("upsert", f"{o.metadata.name}@{o.metadata.resourceVersion}")),
                       lambda key: self.calls.append(("delete", key)))


def start(api: ScriptedApi, clock: FakeClock, initial_list: InitialList = "list",
          page_size: int = 500, gather: float = 0.02) -> tuple[Reflector, Calls, asyncio.Task]:
    recorder = Calls()
    settings = WatchSettings(page_size=page_size, initial_list=initial_list, read_timeout=180, gather=gather)
    reflector = Reflector(api, "replicasets.apps", PATH, PartialObject, recorder.handler(), metadata_only=True,
                          settings=settings, clock=clock)
    return reflector, recorder, asyncio.ensure_future(reflector.run())


async def stop(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def watch_versions(api: ScriptedApi) -> list[str]:
    return [p.get("resourceVersion", "") for verb, p in api.requests if verb == "WATCH"]


GONE = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}


def test_410_relists_and_the_diff_deletes_what_vanished() -> None:
    async def main() -> tuple[Reflector, Calls, ScriptedApi]:
        clock = FakeClock()
        api = ScriptedApi(clock, lists=[page("10", obj("a", "1"), obj("b", "2")),
                                        page("20", obj("a", "12"), obj("c", "13"))],
                          watches=[[json.dumps(GONE).encode()], []])
        reflector, recorder, task = start(api, clock)
        await settle()
        await stop(task)
        return reflector, recorder, api

    reflector, recorder, api = asyncio.run(main())
    assert recorder.calls == [("upsert", "a@1"), ("upsert", "b@2"),  # the first LIST
                              ("upsert", "a@12"), ("upsert", "c@13"), ("delete", "ns/b")]  # the relist and its diff
    assert [verb for verb, _ in api.requests] == ["LIST", "WATCH", "LIST", "WATCH"]
    assert watch_versions(api) == ["10", "20"]  # never "watch from now"
    assert reflector.store.versions == {"ns/a": "12", "ns/c": "13"}
    assert reflector.stats.restarts == {"gone": 1} and reflector.lists == 2


def test_a_refused_watchlist_falls_back_to_a_list_at_once_and_is_remembered() -> None:
    async def main() -> tuple[Reflector, Calls, ScriptedApi]:
        clock = FakeClock()
        refusal = error_from_body(422, json.dumps({"kind": "Status", "code": 422, "reason": "Invalid", "message":
                                                   "sendInitialEvents is forbidden for watch unless the WatchList "
                                                   "feature gate is enabled"}).encode())
        api = ScriptedApi(clock, lists=[page("7", obj("a", "3"))], watches=[[refusal], []], stream=True)
        reflector, recorder, task = start(api, clock, initial_list="auto")
        await settle()  # no clock advance: the LIST must come without a backoff
        await stop(task)
        return reflector, recorder, api

    reflector, recorder, api = asyncio.run(main())
    assert [verb for verb, _ in api.requests] == ["WATCH", "LIST", "WATCH"]
    assert api.requests[0][1]["sendInitialEvents"] == "true"
    assert "sendInitialEvents" not in api.requests[2][1] and watch_versions(api)[1] == "7"
    assert "WatchList feature gate" in api.watch_list_refused
    assert recorder.calls == [("upsert", "a@3")] and reflector.synced.is_set()


def test_a_watchlist_is_the_state_then_the_watch() -> None:
    async def main() -> tuple[Reflector, Calls, ScriptedApi]:
        clock = FakeClock()
        api = ScriptedApi(clock, lists=[], stream=True, watches=[[
            event("ADDED", obj("a", "1")), event("ADDED", obj("b", "2")), bookmark("9", initial_end=True),
            event("MODIFIED", obj("a", "10")),
        ]])
        reflector, recorder, task = start(api, clock, initial_list="auto")
        await settle()
        await stop(task)
        return reflector, recorder, api

    reflector, recorder, api = asyncio.run(main())
    assert [verb for verb, _ in api.requests] == ["WATCH"]  # one request: no LIST at all
    assert recorder.calls == [("upsert", "a@1"), ("upsert", "b@2"), ("upsert", "a@10")]
    assert reflector.synced.is_set() and reflector.resource_version == "10"


def test_a_watchlists_state_is_read_as_it_comes_and_the_events_after_it_gathered() -> None:
    """The stream asks the reflector how long to gather events between reads: not at all while a
    WatchList's state comes (a start as fast as the server sends it, and again after a 410), the
    setting after it, and on a watch from a resourceVersion."""
    async def main() -> ScriptedApi:
        clock = FakeClock()
        api = ScriptedApi(clock, lists=[], stream=True, watches=[
            [event("ADDED", obj("a", "1")), event("ADDED", obj("b", "2")), bookmark("9", initial_end=True),
             event("MODIFIED", obj("a", "10")), Gone(410, "Expired", "too old")],
            [event("ADDED", obj("c", "11")), bookmark("12", initial_end=True), event("DELETED", obj("c", "13"))],
            [event("ADDED", obj("d", "14"))],  # the server ended the last one: a watch from version 13
        ])
        _, _, task = start(api, clock, initial_list="watchlist", gather=0.05)
        await settle()
        await clock.advance(60)  # any backoff is over
        await stop(task)
        return api

    api = asyncio.run(main())
    assert watch_versions(api)[-1] == "13"
    assert api.gathers == [0.0, 0.0, 0.0, 0.05, 0.0, 0.0, 0.05, 0.05]


def test_an_expired_continue_token_lists_again_from_the_first_page() -> None:
    async def main() -> tuple[Reflector, Calls, ScriptedApi]:
        clock = FakeClock()
        expired = Gone(410, "Expired", "The provided continue parameter is too old")
        api = ScriptedApi(clock, lists=[
            page("5", obj("a", "1"), obj("b", "2"), cont="t1"), expired,  # compacted between two pages
            page("8", obj("a", "1"), obj("c", "7"), cont="t2"), page("8", obj("d", "8")),
        ], watches=[[]])
        reflector, recorder, task = start(api, clock, page_size=2)
        await settle()
        await stop(task)
        return reflector, recorder, api

    reflector, recorder, api = asyncio.run(main())
    lists = [p for verb, p in api.requests if verb == "LIST"]
    assert [p.get("continue") for p in lists] == [None, "t1", None, "t2"]
    assert all(p["limit"] == "2" for p in lists)
    # a unchanged is not handed over twice; b, gone at the newer snapshot, is deleted only after
    # the complete pass; the watch starts at that pass's resourceVersion.
    assert recorder.calls == [("upsert", "a@1"), ("upsert", "b@2"), ("upsert", "c@7"), ("upsert", "d@8"),
                              ("delete", "ns/b")]
    assert watch_versions(api) == ["8"]
    assert reflector.lists == 1


def test_a_silent_connection_is_dropped_after_the_read_timeout_and_watched_again_from_its_version() -> None:
    async def main() -> tuple[Reflector, ScriptedApi, list[tuple[bool, str]]]:
        clock = FakeClock()
        api = ScriptedApi(clock, lists=[page("10", obj("a", "1"))],
                          watches=[[event("MODIFIED", obj("a", "11")), SILENT], []])
        reflector, _, task = start(api, clock)
        await settle()
        seen = [(reflector.contact.connected, reflector.contact.last_error)]
        await clock.advance(179)
        seen.append((reflector.contact.connected, reflector.contact.last_error))
        await clock.advance(1)  # 180 s of silence: presumed dead
        seen.append((reflector.contact.connected, reflector.contact.last_error))
        await clock.advance(60)  # any backoff is over
        seen.append((reflector.contact.connected, reflector.contact.last_error))
        await stop(task)
        return reflector, api, seen

    reflector, api, seen = asyncio.run(main())
    assert seen[:2] == [(True, ""), (True, "")]
    assert seen[2] == (False, "no data within the read timeout (connection presumed dead)")
    assert seen[3] == (True, "")
    assert reflector.stats.restarts == {"timeout": 1}
    assert watch_versions(api) == ["10", "11"]  # the same place again: no relist
    assert reflector.lists == 1


def test_reconnect_ends_a_silent_watch_at_once_and_watches_again_from_its_version() -> None:
    """Another request's connection went silent (Sources.reconnect): the watch, as silent, is not
    waited on for its read timeout; it watches again from where it was, without a LIST, and a
    sync under way is not cut."""
    async def main() -> tuple[Reflector, ScriptedApi, list[bool]]:
        clock = FakeClock()
        api = ScriptedApi(clock, lists=[page("10", obj("a", "1"))],
                          watches=[[event("MODIFIED", obj("a", "11")), SILENT], [event("MODIFIED", obj("a", "12"))]])
        reflector, calls, task = start(api, clock)
        ended = [reflector.reconnect()]  # before the first sync completes: nothing to end
        await settle()
        ended += [reflector.reconnect(), reflector.reconnect()]  # the second: already reconnecting
        await settle()
        await clock.advance(1)
        await settle()
        assert calls.calls[-1] == ("upsert", "a@12")  # the new watch's event, long before a read timeout
        await stop(task)
        return reflector, api, ended

    reflector, api, ended = asyncio.run(main())
    assert ended == [False, True, False]
    assert watch_versions(api)[:2] == ["10", "11"]  # from where it was (then 12, after the script's end)
    assert reflector.lists == 1
    assert reflector.stats.restarts == {"reconnect": 1, "closed": 1}  # closed: the second script's end


def test_forbidden_backs_off_up_to_the_slow_cap_and_a_timeout_up_to_the_short_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the jitter at its maximum, 10 failures in a row cost exactly the capped doubling sum:
    0.25 + 0.5 + ... doubling up to 60 s for Forbidden (RBAC: until someone acts), 10 s otherwise."""
    monkeypatch.setattr(random, "uniform", lambda low, high: high)

    async def until_synced(failure: ApiError) -> tuple[float, Reflector]:
        clock = FakeClock()
        api = ScriptedApi(clock, lists=[failure] * 10 + [page("3")], watches=[[]])
        reflector, _, task = start(api, clock)
        await settle()
        started = clock.now
        while not reflector.synced.is_set():
            await clock.advance(0.25)
        await stop(task)
        return clock.now - started, reflector

    denied = error_from_body(403, json.dumps({"reason": "Forbidden", "message": "cannot list"}).encode())
    waited, reflector = asyncio.run(until_synced(denied))
    assert waited == sum(min(60, 0.25 * 2**n) for n in range(10)) == 183.75
    assert reflector.stats.restarts == {"http_403": 10}
    waited, reflector = asyncio.run(until_synced(transport_error(ConnectionResetError("reset by peer"))))
    assert waited == sum(min(10, 0.25 * 2**n) for n in range(10)) == 55.75
    assert reflector.stats.restarts == {"ConnectionResetError": 10}


def test_forbidden_is_the_problem_readiness_reports() -> None:
    async def main() -> str | None:
        clock = FakeClock()
        denied = error_from_body(403, json.dumps({"reason": "Forbidden", "message": "cannot list"}).encode())
        api = ScriptedApi(clock, lists=[denied], watches=[])
        reflector, _, task = start(api, clock)
        await settle()
        problem = reflector.problem(60)
        await stop(task)
        return problem

    assert asyncio.run(main()) == "forbidden (cannot list)"


# -- pods in protobuf, scripted: frames built with the schema's own classes ------------------------

def enveloped(message: Any) -> bytes:
    return protobuf.MAGIC + protobuf.CLASSES["Unknown"](raw=message.SerializeToString()).SerializeToString()


def pb_pod(name: str, rv: str) -> Any:
    meta = protobuf.CLASSES["PodMeta"](name=name, namespace="ns", uid=f"u-{name}", resourceVersion=rv)
    return protobuf.CLASSES["Pod"](metadata=meta)


def pb_page(rv: str, *pods: Any) -> bytes:
    return enveloped(protobuf.CLASSES["PodList"](metadata=protobuf.CLASSES["ListMeta"](resourceVersion=rv),
                                                 items=list(pods)))


def pb_frame(kind: str, message: Any) -> bytes:
    raw = protobuf.CLASSES["RawExtension"](raw=enveloped(message))
    return protobuf.CLASSES["WatchEvent"](type=kind, object=raw).SerializeToString()


def pod_reflector(api: ScriptedApi, clock: FakeClock) -> tuple[Reflector, list[str], asyncio.Task]:
    """A pod reflector listing in pages, started: it records "name@version" per upsert, "-key" per delete."""
    calls: list[str] = []
    handler: Handler[Pod] = Handler(lambda p: calls.append(f"{p.metadata.name}@{p.metadata.resourceVersion}"),
                                    lambda key: calls.append(f"-{key}"))
    reflector = Reflector(api, "pods", PODS.path(), Pod, handler, clock=clock,
                          settings=WatchSettings(initial_list="list", read_timeout=180))
    return reflector, calls, asyncio.ensure_future(reflector.run())


def test_protobuf_bookmarks_and_410_are_read_like_json() -> None:
    """A pod watch answered in protobuf: a bookmark moves the resourceVersion, an ERROR event's
    410 relists and diffs, as in JSON."""
    gone = protobuf.CLASSES["Status"](code=410, reason="Expired", message="too old resource version")
    marker = protobuf.CLASSES["BookmarkObject"](metadata=protobuf.CLASSES["BookmarkMeta"](resourceVersion="15"))

    async def main() -> tuple[Reflector, list[str], ScriptedApi]:
        clock = FakeClock()
        api = ScriptedApi(clock, lists=[pb_page("10", pb_pod("a", "1"), pb_pod("b", "2")),
                                        pb_page("20", pb_pod("a", "12"), pb_pod("c", "13"))],
                          watches=[[pb_frame("MODIFIED", pb_pod("a", "11")), pb_frame("BOOKMARK", marker),
                                    pb_frame("ERROR", gone)], []],
                          content_type=f"{protobuf.MEDIA_TYPE};stream=watch")
        reflector, calls, task = pod_reflector(api, clock)
        await settle()
        await stop(task)
        return reflector, calls, api

    reflector, calls, api = asyncio.run(main())
    assert calls == ["a@1", "b@2", "a@11", "a@12", "c@13", "-ns/b"]
    assert watch_versions(api) == ["10", "20"] and reflector.stats.events["BOOKMARK"] == 1
    assert reflector.stats.restarts == {"gone": 1} and reflector.watch_encoding == "protobuf"


def test_a_page_cut_off_midway_is_listed_again_and_the_diff_is_exact() -> None:
    """A page is applied object by object as it comes: a connection lost in the middle leaves the
    first objects applied, and the next pass (after a backoff) lists from the first page again.
    Nothing is deleted on the broken pass; the complete one deletes what vanished."""
    whole = pb_page("20", pb_pod("a", "2"), pb_pod("c", "3"), pb_pod("d", "4"))
    cut_off = whole[:whole.index(b"u-c") + 3]  # inside c: a, then nothing whole

    async def main() -> tuple[Reflector, list[str]]:
        clock = FakeClock()
        api = ScriptedApi(clock, lists=[pb_page("10", pb_pod("a", "1"), pb_pod("b", "1")), cut_off, whole],
                          watches=[[json.dumps(GONE).encode()], []])
        reflector, calls, task = pod_reflector(api, clock)
        await settle()
        assert calls == ["a@1", "b@1", "a@2"]  # the 410's relist broke inside c
        assert "ended inside a field" in reflector.contact.last_error
        await clock.advance(60)  # the backoff is over
        await settle()
        await stop(task)
        return reflector, calls

    reflector, calls = asyncio.run(main())
    assert calls == ["a@1", "b@1", "a@2", "c@3", "d@4", "-ns/b"]  # a@2 not again: its version was recorded
    assert reflector.store.versions == {"ns/a": "2", "ns/c": "3", "ns/d": "4"} and reflector.resource_version == "20"


def test_a_cancellation_is_not_lost_to_a_watch_failing_at_the_same_moment() -> None:
    """Sources.stop cancels every reflector and waits for them. A watch that failed in the same
    turn of the loop used to raise its error in place of the cancellation: the reflector went on
    retrying and stop() waited for ever."""
    async def main() -> None:
        clock = FakeClock()
        reflector = Reflector(ScriptedApi(clock, lists=[], watches=[]), "replicasets.apps", PATH, PartialObject,
                              Calls().handler(), metadata_only=True, clock=clock)

        async def failing(stream: bool) -> None:
            raise transport_error(ConnectionResetError("reset by peer"))

        reflector._watch = failing  # type: ignore[method-assign, assignment]
        outer = asyncio.ensure_future(reflector._watch_unless_relist(False))
        await asyncio.sleep(0)  # the outer task waits for the watch and the relist request
        await asyncio.sleep(0)  # the watch fails: the outer task is woken ...
        outer.cancel()  # ... and cancelled in the same turn
        with pytest.raises(asyncio.CancelledError):
            await outer

    asyncio.run(main())
