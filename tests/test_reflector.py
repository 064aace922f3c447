"""The reflector's list/watch rules without a control plane: a scripted transport answers its
requests (the same rules are tested against a real API server in test_initial_list.py and
test_exporter.py), and a fake clock steps its backoffs and read timeouts."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from kubeindex.api import ApiError, Gone, error_from_body, transport_error
from kubeindex.objects import PartialObject
from kubeindex.reflector import INITIAL_EVENTS_END, Handler, InitialList, Reflector, WatchSettings
from tests.clock import FakeClock, settle

PATH = "/apis/apps/v1/replicasets"
Answer = bytes | ApiError | Callable[[], Any]  # a body, an error to raise, or "stay silent"


def obj(name: str, rv: str) -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": rv}}


def page(rv: str, *items: dict, cont: str = "") -> bytes:
    return json.dumps({"metadata": {"resourceVersion": rv, "continue": cont}, "items": list(items)}).encode()


def event(kind: str, body: dict) -> bytes:
    return json.dumps({"type": kind, "object": body}).encode()


def bookmark(rv: str, initial_end: bool = False) -> bytes:
    annotations = {INITIAL_EVENTS_END: "true"} if initial_end else {}
    return event("BOOKMARK", {"metadata": {"resourceVersion": rv, "annotations": annotations}})


SILENT = object()  # a watch that sends nothing: the read timeout ends it


class ScriptedApi:
    """Answers LIST pages and watch streams in the order scripted, and records every request.
    A watch script is a list of lines, ending with an ApiError to raise, SILENT, or nothing (the
    server closes the stream); an exhausted script blocks (a quiet, healthy watch)."""

    def __init__(self, clock: FakeClock, lists: list[Answer], watches: list[list[Any]], stream: bool = False) -> None:
        self.clock = clock
        self.lists = lists
        self.watches = watches
        self.stream = stream
        self.watch_list_refused = ""
        self.requests: list[tuple[str, dict[str, str]]] = []

    async def may_stream_lists(self) -> bool:
        return self.stream and not self.watch_list_refused

    async def get(self, path: str, params: dict[str, str] | None = None, accept: str = "",
                  timeout: float = 60) -> bytes:
        self.requests.append(("LIST", dict(params or {})))
        answer = self.lists.pop(0)
        if isinstance(answer, ApiError):
            raise answer
        return answer  # type: ignore[return-value]

    async def stream_lines(self, path: str, params: dict[str, str], accept: str, read_timeout: float,
                           connect_timeout: float = 15,
                           on_open: Callable[[], None] | None = None) -> AsyncIterator[bytes]:
        self.requests.append(("WATCH", dict(params)))
        script = self.watches.pop(0) if self.watches else []
        if script and isinstance(script[0], ApiError):
            raise script[0]  # refused before any answer
        if on_open is not None:
            on_open()
        for line in script:
            if isinstance(line, ApiError):
                raise line
            if line is SILENT:
                await self.clock.sleep(read_timeout)
                raise transport_error(TimeoutError())
            yield line
        if not script:
            await asyncio.Event().wait()  # a quiet watch: until cancelled


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def handler(self) -> Handler[PartialObject]:
        return Handler(lambda o: self.calls.append(("upsert", f"{o.metadata.name}@{o.metadata.resourceVersion}")),
                       lambda key: self.calls.append(("delete", key)))


def start(api: ScriptedApi, clock: FakeClock, initial_list: InitialList = "list",
          page_size: int = 500) -> tuple[Reflector, Recorder, asyncio.Task]:
    recorder = Recorder()
    settings = WatchSettings(page_size=page_size, initial_list=initial_list, read_timeout=180)
    reflector = Reflector(api, "replicasets.apps", PATH, PartialObject, recorder.handler(), metadata_only=True,
                          settings=settings, clock=clock)
    return reflector, recorder, asyncio.ensure_future(reflector.run())


async def stop(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def watch_versions(api: ScriptedApi) -> list[str]:
    return [p.get("resourceVersion", "") for verb, p in api.requests if verb == "WATCH"]


def test_410_relists_and_the_diff_deletes_what_vanished() -> None:
    async def main() -> tuple[Reflector, Recorder, ScriptedApi]:
        clock = FakeClock()
        gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}
        api = ScriptedApi(clock, lists=[page("10", obj("a", "1"), obj("b", "2")),
                                        page("20", obj("a", "12"), obj("c", "13"))],
                          watches=[[json.dumps(gone).encode()], []])
        reflector, recorder, task = start(api, clock)
        await settle()
        await stop(task)
        return reflector, recorder, api

    reflector, recorder, api = asyncio.run(main())
    assert recorder.calls == [("upsert", "a@1"), ("upsert", "b@2"),  # the first LIST
                              ("upsert", "a@12"), ("upsert", "c@13"), ("delete", "ns/b")]  # the relist and its diff
    assert [verb for verb, _ in api.requests] == ["LIST", "WATCH", "LIST", "WATCH"]
    assert watch_versions(api) == ["10", "20"]  # never "watch from now"
    assert reflector.store == {"ns/a": "12", "ns/c": "13"}
    assert reflector.stats.restarts == {"gone": 1} and reflector.lists == 2


def test_a_refused_watchlist_falls_back_to_a_list_at_once_and_is_remembered() -> None:
    async def main() -> tuple[Reflector, Recorder, ScriptedApi]:
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
    async def main() -> tuple[Reflector, Recorder, ScriptedApi]:
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


def test_an_expired_continue_token_lists_again_from_the_first_page() -> None:
    async def main() -> tuple[Reflector, Recorder, ScriptedApi]:
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
        seen = [(reflector.connected, reflector.last_error)]
        await clock.advance(179)
        seen.append((reflector.connected, reflector.last_error))
        await clock.advance(1)  # 180 s of silence: presumed dead
        seen.append((reflector.connected, reflector.last_error))
        await clock.advance(60)  # any backoff is over
        seen.append((reflector.connected, reflector.last_error))
        await stop(task)
        return reflector, api, seen

    reflector, api, seen = asyncio.run(main())
    assert seen[:2] == [(True, ""), (True, "")]
    assert seen[2] == (False, "no data within the read timeout (connection presumed dead)")
    assert seen[3] == (True, "")
    assert reflector.stats.restarts == {"timeout": 1}
    assert watch_versions(api) == ["10", "11"]  # the same place again: no relist
    assert reflector.lists == 1


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
        problem = reflector.problem(60, clock.now)
        await stop(task)
        return problem

    assert asyncio.run(main()) == "forbidden (cannot list)"
