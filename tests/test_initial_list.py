"""The initial list and every relist, each way (--initial-list), against a real kube-apiserver with
its WatchList feature gate on (1.36's default) and off: the state is complete, deletes made while
nothing watched are emitted, 410 and restarts are survived, a handler failure is retried, readiness
waits for the initial-events-end bookmark, and auto falls back to LISTs once per server."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubeindex.api import ApiClient, load_connection, predates_watch_list
from kubeindex.index import ClusterIndex
from kubeindex.objects import PartialObject, Pod, object_key
from kubeindex.reflector import Handler, InitialList, Reflector, WatchSettings
from kubeindex.sources import Sources
from localkube.cluster import LocalCluster, Options
from tests.kube import RecordingApi, create_pod, delete, truth, until
from tests.paths import CRDS

GATE_OFF = "--feature-gates=WatchList=false"


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> LocalCluster:
    """The session's control plane: every test here reads pods in a namespace of its own (wl-*)."""
    return cluster


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
    r = Reflector(api, "pods", f"/api/v1/namespaces/{namespace}/pods", item,
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
                assert set(recorder.objects) == set(r.store) == truth(kube, ns)
                assert recorder.synced_at_upsert == [False] * 5  # readiness waited for the bookmark
                assert type(next(iter(recorder.objects.values()))) is (PartialObject if metadata_only else Pod)
                assert api.lists == [] and len(api.watches) == 1
                assert "resourceVersion" not in api.watches[0]  # a consistent read
                assert api.watches[0]["resourceVersionMatch"] == "NotOlderThan"
                assert r.resource_version and r.lists == 1 and r.stats.events.get("ADDED") is None
                await asyncio.to_thread(create_pod, kube, ns, "later", "n-1")
                await asyncio.to_thread(delete, kube, f"/api/v1/namespaces/{ns}/pods/p-0")
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
                assert set(recorder.objects) == set(r.store) == truth(kube, ns) and not recorder.deleted
                assert r.stats.restarts.get("ClientPayloadError") == 1
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
            delete(kube, f"/api/v1/namespaces/{ns}/pods/p-0")
            create_pod(kube, ns, "meanwhile", "n-1")
            kube.expire_resource_versions()  # on this thread: its children die with the thread that started them
            task = asyncio.create_task(r.run())
            try:
                await until(lambda: r.lists == 2, timeout=30)
                assert r.stats.restarts.get("gone") == 1 and api.streamed == 2
                assert recorder.deleted == [f"{ns}/p-0"]
                assert set(recorder.objects) == set(r.store) == truth(kube, ns)
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
                await until(lambda: not r.connected, timeout=10)
                apiserver.start()  # on this thread: its children die with the thread that started them
                await asyncio.to_thread(kube.wait_apiserver_ready)
                await asyncio.to_thread(delete, kube, f"/api/v1/namespaces/{ns}/pods/p-1")
                await asyncio.to_thread(create_pod, kube, ns, "after", "n-1")
                await until(lambda: set(recorder.objects) == truth(kube, ns), timeout=30)
                assert set(r.store) == truth(kube, ns) and r.connected and r.synced.is_set()
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
                assert f"{ns}/p-2" not in r.store and r.failed == {f"{ns}/p-2"} and r.stats.handler_errors == 1
                # The watch ends (timeoutSeconds=3): a WatchList again, because of the failure.
                await until(lambda: f"{ns}/p-2" in r.store, timeout=15)
                assert set(recorder.objects) == set(r.store) == truth(kube, ns) and not r.failed
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
            r = reflector(api, ns, "auto", recorder, timeout=60)
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
                assert set(recorder.objects) == set(r.store) == truth(kube, ns)
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


# -- WatchList off -----------------------------------------------------------------------------------

def test_auto_falls_back_to_lists_once_per_server(gate_off: LocalCluster, caplog: pytest.LogCaptureFixture) -> None:
    """The server answers 422 ("sendInitialEvents is forbidden for watch unless the WatchList
    feature gate is enabled"): every reflector of the client lists, the refusal logged once and
    never asked again, relists included."""
    caplog.set_level(logging.INFO)
    pods(gate_off, "wl-off", 3)

    async def run() -> None:
        async with RecordingApi(load_connection(str(gate_off.kubeconfig))) as api:
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


def test_forced_watchlist_against_a_server_without_it(gate_off: LocalCluster) -> None:
    """--initial-list=watchlist does not fall back: the 422 is the reflector's error, not synced."""
    recorder = Recorder()

    async def run() -> None:
        async with RecordingApi(load_connection(str(gate_off.kubeconfig))) as api:
            r = reflector(api, "default", "watchlist", recorder)
            task = asyncio.create_task(r.run())
            try:
                await until(lambda: r.last_error_status == 422)
                assert "WatchList feature gate" in r.last_error and not r.synced.is_set() and api.lists == []
                assert r.problem(60, 0).startswith("initial sync in progress (last error: ")  # type: ignore[union-attr]
                assert api.watch_list_refused == ""
            finally:
                await stopped(task)

    asyncio.run(run())


def test_version_asked_once_and_never_clears_a_refusal(kube: LocalCluster) -> None:
    """The reflectors start together: one GET /version for all of them, and a 422 that another
    reflector records while it is asked stays recorded (the server's version, new enough, once
    overwrote it, and the next reflector tried a WatchList again and logged a second refusal)."""

    class SlowVersion(ApiClient):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            self.asked, self.answer = 0, asyncio.Event()

        async def get(self, path: str, params: dict[str, str] | None = None, **kw: Any) -> bytes:
            if path == "/version":
                self.asked += 1
                await self.answer.wait()
            return await super().get(path, params, **kw)

    async def run() -> None:
        async with SlowVersion(load_connection(str(kube.kubeconfig))) as api:
            askers = [asyncio.create_task(api.may_stream_lists()) for _ in range(5)]
            await asyncio.sleep(0.1)
            api.watch_list_refused = "422: the WatchList feature gate is off"  # another reflector's 422
            api.answer.set()
            assert await asyncio.gather(*askers) == [False] * 5
            assert api.asked == 1
            assert api.watch_list_refused == "422: the WatchList feature gate is off"
            assert await api.may_stream_lists() is False and api.asked == 1

    asyncio.run(run())


@pytest.mark.parametrize(("version", "why"), [
    ({"major": "1", "minor": "36", "gitVersion": "v1.36.3"}, ""),
    ({"major": "1", "minor": "27", "gitVersion": "v1.27.0"}, ""),
    ({"major": "1", "minor": "26+", "gitVersion": "v1.26.15"}, "the API server is v1.26.15, older than 1.27"),
    ({"major": "1", "minor": "25"}, "the API server is 1.25, older than 1.27"),
    ({"major": "2", "minor": "0"}, ""),
])
def test_servers_before_watch_list_are_not_asked_for_one(version: dict[str, str], why: str) -> None:
    """A server before 1.27 ignores sendInitialEvents and would never end the initial state."""
    assert predates_watch_list(version) == why
