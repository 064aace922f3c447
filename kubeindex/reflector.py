"""One list+watch loop per resource, with client-go reflector semantics.

    paged LIST -> diff against the store (deletes for what vanished) -> WATCH from the list's
    resourceVersion with bookmarks and a randomized timeout -> on 410 Gone: relist and diff (never
    "watch from now") -> on a network error or a silent connection: jittered backoff, then watch
    again from the last resourceVersion.

The store keeps only key -> resourceVersion (resourceVersions are opaque strings, only compared
for equality); the objects themselves live in the index.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import aiohttp
import msgspec

from .api import JSON, PARTIAL, PARTIAL_LIST, ApiClient, ApiError, sleep_jittered
from .objects import Bookmark, ListMeta, ObjectMeta, RawEvent, Status, object_key

log = logging.getLogger(__name__)
T = TypeVar("T")


def _explain(err: Exception) -> str:
    if isinstance(err, ApiError) and err.status == 404:
        return "404 not found: the resource is not served (are this project's CRDs installed? kubectl apply -f crds/)"
    if isinstance(err, ApiError) and err.status in (401, 403):
        return f"{err.status} {err.reason}: check the credentials and RBAC ({err.message.strip()})"
    if isinstance(err, TimeoutError):
        return "no data within the read timeout (connection presumed dead)"
    return f"{type(err).__name__}: {str(err).strip()}"


class Gone(Exception):
    """410: the resourceVersion is too old (compacted); only a relist recovers."""


@dataclass
class SourceStats:
    """Self-metrics of one reflector, read by the exporter."""

    events: dict[str, int] = field(default_factory=dict)  # ADDED / MODIFIED / DELETED / BOOKMARK
    relists: int = 0
    restarts: dict[str, int] = field(default_factory=dict)  # reason -> watch restarts
    last_event: float = 0.0  # time.time() of the last event or list page
    objects: int = 0
    synced: bool = False

    def count(self, kind: str) -> None:
        self.events[kind] = self.events.get(kind, 0) + 1
        self.last_event = time.time()

    def restart(self, reason: str) -> None:
        self.restarts[reason] = self.restarts.get(reason, 0) + 1


class _Page(msgspec.Struct, Generic[T]):
    """A LIST page decoded in one pass into the item type."""

    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[T] | None = None  # an empty metadata-only list comes as "items": null


@dataclass
class Handler(Generic[T]):
    upsert: Callable[[T], None]
    delete: Callable[[str], None]


@dataclass
class WatchSettings:
    page_size: int = 500
    timeout_min: int = 300  # watch timeoutSeconds is drawn from [min, max] (spreads reconnects)
    timeout_max: int = 600
    read_timeout: float = 180.0  # silence longer than this means a dead connection (idle watches
    # get a bookmark from the API server about every minute, the first after about two)
    yield_every: int = 200  # objects decoded between event-loop yields during a LIST


class Reflector(Generic[T]):
    def __init__(self, api: ApiClient, name: str, path: str, item_type: type[T], handler: Handler[T],
                 *, metadata_only: bool = False, settings: WatchSettings | None = None,
                 stats: SourceStats | None = None, label_selector: str = "") -> None:
        self.api = api
        self.name = name
        self.path = path
        self.handler = handler
        self.metadata_only = metadata_only
        self.selector = {"labelSelector": label_selector} if label_selector else {}
        self.settings = settings or WatchSettings()
        self.stats = stats or SourceStats()
        self.store: dict[str, str] = {}  # key -> resourceVersion
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.last_error_status = 0  # HTTP status of the last failed request (0: none)
        self._item = msgspec.json.Decoder(item_type)
        self._list = msgspec.json.Decoder(_Page[item_type])  # type: ignore[valid-type]
        self._event = msgspec.json.Decoder(RawEvent)
        self._status = msgspec.json.Decoder(Status)
        self._bookmark = msgspec.json.Decoder(Bookmark)

    # -- the loop -------------------------------------------------------------------------------

    async def run(self) -> None:
        attempt = 0
        need_list = True
        while True:
            try:
                if need_list:
                    await self._list_and_sync()
                    need_list = False
                    self.last_error_status = 0
                    self.synced.set()
                    self.stats.synced = True
                started = time.monotonic()
                await self._watch()
                if time.monotonic() - started > 1:
                    attempt = 0  # a watch that ran its course: start the next one at once
                else:  # closed at once: do not spin
                    self.stats.restart("closed")
                    await sleep_jittered(attempt)
                    attempt += 1
            except Gone:
                self.stats.restart("gone")
                log.info("%s: resourceVersion %s expired (410), relisting", self.name, self.resource_version)
                need_list = True
            except asyncio.CancelledError:
                raise
            except Exception as err:
                reason = "timeout" if isinstance(err, TimeoutError) else type(err).__name__
                expected = (TimeoutError, aiohttp.ClientError, ApiError, OSError, msgspec.DecodeError)
                if isinstance(err, ApiError):
                    reason = f"http_{err.status}"
                    self.last_error_status = err.status
                self.stats.restart(reason)
                if not isinstance(err, expected):
                    log.exception("%s: unexpected error; relisting after backoff", self.name)
                    need_list = True
                elif self.stats.restarts[reason] == 1 or attempt < 3:  # say it clearly, then quietly retry
                    log.warning("%s: %s %s: %s; retrying with backoff", self.name,
                                "LIST" if need_list else "WATCH", self.path, _explain(err))
                await sleep_jittered(attempt)
                attempt += 1

    # -- LIST ---------------------------------------------------------------------------------

    async def _list_and_sync(self) -> None:
        self.stats.relists += 1
        seen: dict[str, str] = {}
        accept = PARTIAL_LIST if self.metadata_only else JSON
        params = {"limit": str(self.settings.page_size), **self.selector}
        while True:
            try:
                body = await self.api.get(self.path, params, accept=accept, timeout=120)
            except ApiError as err:
                if err.status == 410 and "continue" in params:
                    # The continue token expired during a slow paged LIST: start over unpaginated
                    # (one consistent snapshot), as client-go's pager does.
                    log.info("%s: continue token expired, listing without pages", self.name)
                    seen.clear()
                    params = dict(self.selector)
                    continue
                raise
            page = self._list.decode(body)
            await self._apply_page(page.items or [], seen)
            if not page.metadata.continue_:
                self.resource_version = page.metadata.resourceVersion
                break
            params = {"limit": str(self.settings.page_size), "continue": page.metadata.continue_, **self.selector}
        for key in self.store.keys() - seen.keys():  # vanished while we were not watching
            self.handler.delete(key)
            self.stats.count("DELETED")
        self.store = seen
        self.stats.objects = len(seen)

    async def _apply_page(self, items: list[Any], seen: dict[str, str]) -> None:
        for i, obj in enumerate(items):
            meta: ObjectMeta = obj.metadata
            key = object_key(meta)
            seen[key] = meta.resourceVersion
            if self.store.get(key) != meta.resourceVersion:
                self.handler.upsert(obj)
                # Recorded at once: if this LIST fails later, the retry's diff still deletes it.
                self.store[key] = meta.resourceVersion
            if i % self.settings.yield_every == self.settings.yield_every - 1:
                await asyncio.sleep(0)  # decoding is CPU-bound: let /metrics and other loops run
        self.stats.last_event = time.time()

    # -- WATCH --------------------------------------------------------------------------------

    async def _watch(self) -> None:
        params = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": self.resource_version,
            "timeoutSeconds": str(random.randint(self.settings.timeout_min, self.settings.timeout_max)),
            **self.selector,
        }
        accept = PARTIAL if self.metadata_only else JSON
        try:
            async for line in self.api.stream_lines(self.path, params, accept, self.settings.read_timeout):
                self._handle(line)
        except ApiError as err:
            if err.status == 410:
                raise Gone from err
            raise

    def _handle(self, line: bytes) -> None:
        event = self._event.decode(line)
        kind = event.type
        if kind == "ERROR":
            status = self._status.decode(event.object)
            if status.code == 410:
                raise Gone(status.message)
            raise ApiError(status.code, status.reason, status.message)
        self.stats.count(kind)
        if kind == "BOOKMARK":
            self.resource_version = self._bookmark.decode(event.object).metadata.resourceVersion
            return
        obj: Any = self._item.decode(event.object)
        meta: ObjectMeta = obj.metadata
        key = object_key(meta)
        self.resource_version = meta.resourceVersion
        if kind == "DELETED":
            self.store.pop(key, None)
            self.handler.delete(key)  # idempotent downstream
        else:
            self.store[key] = meta.resourceVersion
            self.handler.upsert(obj)
        self.stats.objects = len(self.store)
