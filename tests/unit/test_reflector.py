"""The reflector (kubeindex/watch/reflector.py) on a scripted transport and a fake clock: 410s, WatchLists
refused and streamed, expired continue tokens, silent connections, backoff caps, protobuf. Here,
what needs no cluster; the scenarios against one: tests/cluster/test_reflector.py."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from typing import Any, Literal

import pytest

from kubeindex.client import protobuf
from kubeindex.client.api import ApiError, Gone, error_from_body, transport_error
from kubeindex.client.watchstream import Framing
from kubeindex.model.objects import PartialObject, Pod
from kubeindex.model.resources import PODS
from kubeindex.watch.reflector import INITIAL_EVENTS_END, Handler, InitialList, Reflector, WatchSettings
from tests.clock import FakeClock, settle
from tests.support.reflector import obj

PATH = "/apis/apps/v1/replicasets"


ListAnswer = bytes | ApiError  # a page, or an error to raise


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
